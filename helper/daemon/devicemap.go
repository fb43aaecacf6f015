package daemon

// Restore onto other GPUs: which GPU of this machine each GPU of an image
// goes to. The helper loads a GPU's buffers into the device chosen, and the
// driver's restore of each process's residual context is told the same
// pairs (cuCheckpointProcessRestore's gpuPairs), so that the process finds
// its memory and its context on one GPU. The ordinals the process knows its
// GPUs by stay; the GPUs behind them change.
//
// The user's map ("OLD=NEW,...", `gpucr restore --device-map`) comes first.
// A GPU it does not name goes to the same GPU where that is here, is not
// taken and has room for it; else to a GPU of the same model that is not
// taken and has room, the same ordinal first, then the one with the most
// room. The driver restores only onto a GPU of the same kind, one GPU onto
// one GPU.

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gpucr/gpucr/helper/devicemap"
	"github.com/gpucr/gpucr/image"
)

// imageGPU is a GPU that an image's buffers were on.
type imageGPU struct {
	uuid    string
	ordinal int    // the ordinal its processes knew it by (the first buffer's)
	bytes   uint64 // its buffers' memory
}

// imageGPUs lists the GPUs of im's buffers (only those of pid only, if not
// 0), in the order their first buffers come.
func imageGPUs(im *image.Image, only int) []imageGPU {
	var out []imageGPU
	at := map[string]int{}
	for _, b := range im.Buffers() {
		if only != 0 && b.Pid != only {
			continue
		}
		key := gpuKey(b)
		i, ok := at[key]
		if !ok {
			i = len(out)
			at[key] = i
			out = append(out, imageGPU{uuid: b.GPUUUID, ordinal: b.Device})
		}
		out[i].bytes += b.Size
	}
	return out
}

// gpuKey names the GPU of an image buffer: its UUID, or its ordinal in
// images without one.
func gpuKey(b image.BufferInfo) string {
	if b.GPUUUID != "" {
		return b.GPUUUID
	}
	return "#" + strconv.Itoa(b.Device)
}

func (g imageGPU) key() string {
	if g.uuid != "" {
		return g.uuid
	}
	return "#" + strconv.Itoa(g.ordinal)
}

func (g imageGPU) String() string {
	if g.uuid == "" {
		return fmt.Sprintf("GPU %d", g.ordinal)
	}
	return fmt.Sprintf("GPU %s (ordinal %d)", g.uuid, g.ordinal)
}

// matchUUID says whether token names uuid: the whole UUID, or its start
// (with or without "GPU-"), case-insensitively.
func matchUUID(token, uuid string) bool {
	if uuid == "" {
		return false
	}
	t, u := strings.ToLower(token), strings.ToLower(uuid)
	return t == u || strings.HasPrefix(u, t) || strings.HasPrefix(strings.TrimPrefix(u, "gpu-"), t)
}

// nameMatches lists the indexes of the GPUs (by ordinal and UUID) that
// token names: an ordinal names those of that ordinal; else the GPU whose
// whole UUID it is, or those whose UUID starts with it (matchUUID).
func nameMatches(token string, n int, ordinal func(int) int, uuid func(int) string) []int {
	var hits []int
	o, err := strconv.Atoi(token)
	for i := 0; i < n; i++ {
		switch {
		case err == nil:
			if ordinal(i) == o {
				hits = append(hits, i)
			}
		case strings.EqualFold(token, uuid(i)):
			return []int{i}
		case matchUUID(token, uuid(i)):
			hits = append(hits, i)
		}
	}
	return hits
}

// findImageGPU resolves the OLD of a map entry among the image's GPUs.
func findImageGPU(token string, gpus []imageGPU) (int, error) {
	hits := nameMatches(token, len(gpus), func(i int) int { return gpus[i].ordinal }, func(i int) string { return gpus[i].uuid })
	switch len(hits) {
	case 1:
		return hits[0], nil
	case 0:
		return 0, fmt.Errorf("the image has no GPU %q (it has %s)", token, listImageGPUs(gpus))
	default:
		return 0, fmt.Errorf("%q names more than one GPU of the image (%s): give more of the UUID", token, listImageGPUs(gpus))
	}
}

// findDevice resolves the NEW of a map entry among this helper's devices.
func findDevice(token string, devs []Device) (Device, error) {
	hits := nameMatches(token, len(devs), func(i int) int { return int(devs[i].Info().Ordinal) },
		func(i int) string { return devs[i].Info().Uuid })
	switch len(hits) {
	case 1:
		return devs[hits[0]], nil
	case 0:
		return nil, fmt.Errorf("this machine has no GPU %q (it has %s)", token, listDevices(devs))
	default:
		return nil, fmt.Errorf("%q names more than one GPU here (%s): give more of the UUID", token, listDevices(devs))
	}
}

func listImageGPUs(gpus []imageGPU) string {
	var s []string
	for _, g := range gpus {
		s = append(s, g.String())
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func listDevices(devs []Device) string {
	var s []string
	for _, d := range devs {
		s = append(s, fmt.Sprintf("%d %s", d.Info().Ordinal, d.Info().Uuid))
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// placement is where an image's GPUs go.
type placement struct {
	dev map[string]Device // by imageGPU.key()
}

// deviceOf is the device an image buffer goes to.
func (p placement) deviceOf(b image.BufferInfo) Device { return p.dev[gpuKey(b)] }

// pairs are the driver's gpuPairs for a process whose buffers are bufs and
// that could see the GPUs visible (its ordinals' UUIDs; nil: unknown), on a
// machine with devs: none when each of its GPUs stays where it was.
//
// Measured on driver 580 (2 H200s, drvtest ckpt_restore_gpu_pairs): the
// driver wants every GPU the process sees paired, not only those it used,
// one onto one (pairs leaving one out fail with CUDA_ERROR_INVALID_VALUE).
// A visible GPU without buffers stays where it is if it can, else takes a
// GPU given up. Without the list (older images), the GPUs the buffers were
// on stand for it, and a GPU of this machine that one moves onto is paired
// back onto a GPU given up: a process that saw both GPUs of a machine and
// used one swaps them.
func (p placement) pairs(bufs []image.BufferInfo, visible []string, devs []Device) ([]GPUPair, error) {
	target := map[string]string{} // old UUID -> new
	taken := map[string]bool{}
	var order []string
	moved := false
	for _, b := range bufs {
		d := p.deviceOf(b)
		if d == nil || b.GPUUUID == "" || target[b.GPUUUID] != "" {
			continue
		}
		target[b.GPUUUID] = d.Info().Uuid
		taken[d.Info().Uuid] = true
		order = append(order, b.GPUUUID)
		moved = moved || b.GPUUUID != d.Info().Uuid
	}
	if !moved {
		return nil, nil
	}
	if visible == nil {
		// Unknown: close the moves into a permutation of this machine's GPUs.
		for _, d := range devs {
			if u := d.Info().Uuid; taken[u] && target[u] == "" {
				visible = append(visible, u)
			}
		}
		visible = append(slices.Clone(order), visible...)
	}
	var out []GPUPair
	for _, v := range visible {
		if target[v] == "" {
			if d := deviceByUUID(devs, v); d != nil && !taken[v] {
				target[v] = v
			} else {
				for _, d := range devs {
					if u := d.Info().Uuid; !taken[u] {
						target[v] = u
						break
					}
				}
			}
			if target[v] == "" {
				return nil, fmt.Errorf("the process saw %d GPUs (%s); this machine has no GPU left for %s (it has %s)",
					len(visible), strings.Join(visible, ", "), v, listDevices(devs))
			}
			taken[target[v]] = true
		}
		out = append(out, GPUPair{Old: v, New: target[v]})
	}
	for _, o := range order { // a buffer's GPU the list lacked (it cannot: the list is the process's)
		if !slices.Contains(visible, o) {
			out = append(out, GPUPair{Old: o, New: target[o]})
		}
	}
	return out, nil
}

// roomFunc says how much device memory a restore may take on d now; false:
// unknown (treated as enough).
type roomFunc func(d Device) (uint64, bool)

// placeGPUs decides, for each GPU of an image, the device it goes to: the
// map's entries first, then the defaults (see the top of this file). model
// is the image's GPU model ("" unknown); a device of another model is
// refused.
func placeGPUs(gpus []imageGPU, devs []Device, model string, spec []devicemap.Entry, room roomFunc) (placement, error) {
	p := placement{dev: map[string]Device{}}
	taken := map[Device]string{} // device -> the image GPU put there
	fits := func(d Device, g imageGPU) bool {
		r, known := room(d)
		return !known || r >= g.bytes
	}
	sameModel := func(d Device) bool { return model == "" || d.Info().Name == "" || d.Info().Name == model }
	put := func(g imageGPU, d Device) error {
		if !sameModel(d) {
			return fmt.Errorf("%s of the image cannot go onto GPU %d %s: it is a %s, the image's GPU a %s (the driver restores onto the same kind of GPU only)",
				g, d.Info().Ordinal, d.Info().Uuid, d.Info().Name, model)
		}
		if other, ok := taken[d]; ok {
			return fmt.Errorf("%s and %s of the image cannot both go onto GPU %d %s (one GPU restores onto one GPU)",
				other, g, d.Info().Ordinal, d.Info().Uuid)
		}
		taken[d] = g.String()
		p.dev[g.key()] = d
		return nil
	}
	named := map[int]bool{}
	for _, e := range spec {
		i, err := findImageGPU(e.Old, gpus)
		if err != nil {
			return p, fmt.Errorf("device map %s=%s: %w", e.Old, e.New, err)
		}
		if named[i] {
			return p, fmt.Errorf("device map: %s is named twice", gpus[i])
		}
		named[i] = true
		d, err := findDevice(e.New, devs)
		if err != nil {
			return p, fmt.Errorf("device map %s=%s: %w", e.Old, e.New, err)
		}
		if err := put(gpus[i], d); err != nil {
			return p, fmt.Errorf("device map %s=%s: %w", e.Old, e.New, err)
		}
	}
	// The GPUs the map leaves out: their own GPU where it can take them.
	var rest []imageGPU
	for i, g := range gpus {
		if named[i] {
			continue
		}
		if d := deviceByUUID(devs, g.uuid); d != nil && taken[d] == "" && fits(d, g) {
			if err := put(g, d); err != nil {
				return p, err
			}
			continue
		}
		rest = append(rest, g)
	}
	for _, g := range rest {
		var cands []Device
		for _, d := range devs {
			if _, ok := taken[d]; ok || !sameModel(d) {
				continue
			}
			cands = append(cands, d)
		}
		roomOf := func(d Device) uint64 {
			r, known := room(d)
			if !known {
				return ^uint64(0)
			}
			return r
		}
		sort.SliceStable(cands, func(a, b int) bool {
			sa, sb := int(cands[a].Info().Ordinal) == g.ordinal, int(cands[b].Info().Ordinal) == g.ordinal
			if sa != sb {
				return sa
			}
			return roomOf(cands[a]) > roomOf(cands[b])
		})
		var pick Device
		for _, d := range cands {
			if fits(d, g) {
				pick = d
				break
			}
		}
		if pick == nil {
			// Nothing has room by the driver's count: its own GPU, else
			// the same ordinal, and the allocation says whether it fits
			// (the helper's pool gives memory back when full).
			if d := deviceByUUID(devs, g.uuid); d != nil && taken[d] == "" {
				pick = d
			} else if len(cands) > 0 && int(cands[0].Info().Ordinal) == g.ordinal {
				pick = cands[0]
			} else if len(cands) > 0 {
				return p, fmt.Errorf("%s of the image needs %s: no GPU here has that much free (%s); name one with --device-map",
					g, sizeStr(g.bytes), listDevices(devs))
			} else {
				return p, fmt.Errorf("no GPU here for %s of the image (this machine has %s%s)", g, listDevices(devs),
					modelNote(model))
			}
		}
		if err := put(g, pick); err != nil {
			return p, err
		}
	}
	return p, nil
}

func modelNote(model string) string {
	if model == "" {
		return ""
	}
	return "; the image's GPUs are " + model + " and each needs a GPU of its own"
}

func deviceByUUID(devs []Device, uuid string) Device {
	if uuid == "" {
		return nil
	}
	for _, d := range devs {
		if d.Info().Uuid == uuid {
			return d
		}
	}
	return nil
}

// restoreRoom is the device memory a restore may take on d: the driver's
// free memory and what the helper's pool holds ready there (it gives that
// back when the device is full).
func (p *pool) restoreRoom(d Device) (uint64, bool) {
	fm, ok := d.(interface{ FreeMemory() (uint64, error) })
	if !ok {
		return 0, false
	}
	free, err := fm.FreeMemory()
	if err != nil {
		return 0, false
	}
	return free + p.readyBytes(d), true
}
