package daemon

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/helper/devicemap"
	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// placeDev is a device as placeGPUs sees it: its identity and its room.
type placeDev struct {
	info *helperpb.DeviceInfo
	room uint64 // 0: unknown
}

func (d *placeDev) Info() *helperpb.DeviceInfo                      { return d.info }
func (d *placeDev) Create(uint64, image.AllocFlags) (uint64, error) { return 0, nil }
func (d *placeDev) Export(uint64) (int, error)                      { return -1, nil }
func (d *placeDev) Release(uint64) error                            { return nil }
func (d *placeDev) GPU() engine.GPU                                 { return nil }

const (
	uuidA = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
	uuidB = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
	uuidC = "GPU-cccccccc-0000-0000-0000-000000000003"
	uuidX = "GPU-eeeeeeee-0000-0000-0000-00000000000e" // on another machine
)

func devs(rooms ...uint64) []Device {
	uu := []string{uuidA, uuidB, uuidC}
	var out []Device
	for i, r := range rooms {
		out = append(out, &placeDev{info: &helperpb.DeviceInfo{Uuid: uu[i], Name: "H100", Ordinal: int32(i)}, room: r})
	}
	return out
}

func roomOf(d Device) (uint64, bool) {
	r := d.(*placeDev).room
	return r, r != 0
}

func TestPlaceGPUs(t *testing.T) {
	const gib = 1 << 30
	one := []imageGPU{{uuid: uuidA, ordinal: 0, bytes: 8 * gib}}
	two := []imageGPU{{uuid: uuidA, ordinal: 0, bytes: 8 * gib}, {uuid: uuidB, ordinal: 1, bytes: 8 * gib}}
	for _, tc := range []struct {
		name  string
		gpus  []imageGPU
		devs  []Device
		model string
		spec  string
		want  []string // the UUID each image GPU goes to
		err   string   // or the error's text
	}{
		{name: "own GPUs", gpus: two, devs: devs(0, 0), model: "H100", want: []string{uuidA, uuidB}},
		{name: "map by ordinal", gpus: one, devs: devs(0, 0), spec: "0=1", want: []string{uuidB}},
		{name: "map by UUID start", gpus: one, devs: devs(0, 0), spec: "aaaa=GPU-bbbb", want: []string{uuidB}},
		{name: "map by whole UUID", gpus: one, devs: devs(0, 0, 0), spec: uuidA + "=" + uuidC, want: []string{uuidC}},
		{name: "a mapped GPU's own GPU takes the one given up", gpus: two, devs: devs(0, 0), spec: "0=1",
			want: []string{uuidB, uuidA}},
		{name: "own GPU absent: same ordinal", gpus: []imageGPU{{uuid: uuidX, ordinal: 1, bytes: gib}}, devs: devs(0, 0),
			want: []string{uuidB}},
		{name: "own GPU full: another with room", gpus: one, devs: devs(1*gib, 2*gib, 16*gib), want: []string{uuidC}},
		{name: "own GPU full, nothing has room: own GPU", gpus: one, devs: devs(1*gib, 2*gib), want: []string{uuidA}},
		{name: "absent, nothing has room", gpus: []imageGPU{{uuid: uuidX, ordinal: 2, bytes: 8 * gib}},
			devs: devs(1*gib, 2*gib), err: "no GPU here has that much free"},
		{name: "another model", gpus: one, devs: devs(0, 0), model: "H200", spec: "0=1", err: "same kind of GPU"},
		{name: "two onto one", gpus: two, devs: devs(0, 0), spec: "0=1,1=1", err: "cannot both go onto GPU 1"},
		{name: "named twice", gpus: two, devs: devs(0, 0), spec: "0=1,aaaa=0", err: "named twice"},
		{name: "more GPUs than here", gpus: two, devs: devs(0), err: "no GPU here for GPU " + uuidB},
		{name: "unknown old", gpus: one, devs: devs(0, 0), spec: "7=1", err: `the image has no GPU "7"`},
		{name: "unknown new", gpus: one, devs: devs(0, 0), spec: "0=GPU-ffff", err: `this machine has no GPU "GPU-ffff"`},
		{name: "ambiguous new", gpus: one, devs: devs(0, 0), spec: "0=GPU-", err: "more than one GPU here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := devicemap.Parse(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			p, err := placeGPUs(tc.gpus, tc.devs, tc.model, spec, roomOf)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, g := range tc.gpus {
				d := p.dev[g.key()]
				if d == nil || d.Info().Uuid != tc.want[i] {
					t.Errorf("%s went to %v, want %s", g, d, tc.want[i])
				}
			}
		})
	}
}

// A process's driver restore is told its GPUs only when one moves, and
// then every GPU it saw, one onto one (what the driver accepts, measured).
func TestPlacementPairs(t *testing.T) {
	d := devs(0, 0)
	onA := []image.BufferInfo{{GPUUUID: uuidA}, {GPUUUID: uuidA}}
	onAB := []image.BufferInfo{{GPUUUID: uuidA}, {GPUUUID: uuidB}, {GPUUUID: uuidA}}
	stay := placement{dev: map[string]Device{uuidA: d[0], uuidB: d[1]}}
	swap := placement{dev: map[string]Device{uuidA: d[1], uuidB: d[0]}}
	toB := placement{dev: map[string]Device{uuidA: d[1]}}
	ab, ba := GPUPair{Old: uuidA, New: uuidB}, GPUPair{Old: uuidB, New: uuidA}
	for _, tc := range []struct {
		name    string
		p       placement
		bufs    []image.BufferInfo
		visible []string
		devs    []Device
		want    []GPUPair
		err     string
	}{
		{name: "nothing moved", p: stay, bufs: onAB, visible: []string{uuidA, uuidB}, devs: d},
		{name: "both used, swapped", p: swap, bufs: onAB, visible: []string{uuidA, uuidB}, devs: d, want: []GPUPair{ab, ba}},
		{name: "one used of two seen", p: toB, bufs: onA, visible: []string{uuidA, uuidB}, devs: d, want: []GPUPair{ab, ba}},
		{name: "one seen", p: toB, bufs: onA, visible: []string{uuidA}, devs: d, want: []GPUPair{ab}},
		{name: "unknown: the move closed on this machine", p: toB, bufs: onA, devs: d, want: []GPUPair{ab, ba}},
		{name: "more seen than here", p: toB, bufs: onA, visible: []string{uuidA, uuidB, uuidC}, devs: d,
			err: "no GPU left for " + uuidC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.p.pairs(tc.bufs, tc.visible, tc.devs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("pairs %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}
