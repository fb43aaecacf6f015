package daemon

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/internal/testroot"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// TestMain lets the test binary act as a client process (GPUCR_TEST_CLIENT =
// socket): it registers, allocates, prints "ready" and waits to be killed.
func TestMain(m *testing.M) {
	if sock := os.Getenv("GPUCR_TEST_CLIENT"); sock != "" {
		childClient(sock, os.Getenv("GPUCR_TEST_UUID"))
		return
	}
	os.Exit(m.Run())
}

type exitTB struct{ testing.TB }

func (exitTB) Helper() {}
func (exitTB) Fatal(a ...any) {
	fmt.Fprintln(os.Stderr, a...)
	os.Exit(3)
}
func (e exitTB) Fatalf(f string, a ...any) { e.Fatal(fmt.Sprintf(f, a...)) }
func (exitTB) Cleanup(func())              {}

func childClient(sock, uuid string) {
	t := exitTB{}
	c := dial(t, sock)
	c.register()
	for i := 0; i < 4; i++ {
		id, _ := c.alloc(uuid, 8<<20)
		if e := c.simple(mappedReq(id, uint64(0x500000000000+i<<23))); e != nil {
			t.Fatal(e)
		}
	}
	fmt.Println("ready")
	select {}
}

// loadSim loads the simulated driver (1 GiB of device memory) for the
// test, as the helper would: its path in GPUCR_LIBCUDA, its directory on
// LD_LIBRARY_PATH. It is closed when the test ends.
func loadSim(t *testing.T) *cuda.Driver {
	t.Helper()
	lib := simLib(t)
	t.Setenv("GPUCR_LIBCUDA", lib)
	t.Setenv("LD_LIBRARY_PATH", filepath.Dir(lib))
	t.Setenv("GPUCR_SIM_MEM_MIB", "1024")
	drv, err := cuda.Load(lib)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.Close() })
	return drv
}

func simLib(t *testing.T) string {
	t.Helper()
	p := filepath.Join(testroot.Dir(t), "build/sim/libcuda.so.1")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("simulated driver missing (%v): make sim", err)
		}
		t.Skipf("simulated driver missing (%v): make sim", err)
	}
	return p
}

// The helper on the simulated driver: a client process killed with SIGKILL
// has its allocations released (Status, and cuMemGetInfo back up).
func TestSimKilledClientReleased(t *testing.T) {
	drv := loadSim(t)
	dev := drv.Devices[0]
	_, sock := startServer(t, CUDADevices(drv)...)
	free0, _, err := dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	// This process, through the real driver: fd of the rounded size.
	c := dial(t, sock)
	c.register()
	id, size := c.alloc(dev.UUID, 3<<20+1)
	if size != 4<<20 {
		t.Fatalf("rounded to %d", size)
	}
	if f, _, _ := dev.MemInfo(); free0-f != 4<<20 {
		t.Fatalf("free %d -> %d", free0, f)
	}
	if e := c.simple(freeReq(id)); e != nil {
		t.Fatal(e)
	}
	r, _ := c.mustCall(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{DeviceUuid: dev.UUID, Size: 2 << 30}}})
	if r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_OUT_OF_MEMORY {
		t.Fatalf("oversized: %v", r)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GPUCR_TEST_CLIENT="+sock, "GPUCR_TEST_UUID="+dev.UUID)
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("child said %q", line)
	}
	var mine *helperpb.ClientInfo
	for _, ci := range status(t, sock).Clients {
		if ci.Pid == int64(cmd.Process.Pid) {
			mine = ci
		}
	}
	if mine == nil || mine.Allocations != 4 || mine.Bytes != 32<<20 {
		t.Fatalf("child %d in status: %v", cmd.Process.Pid, mine)
	}
	if f, _, _ := dev.MemInfo(); free0-f != 32<<20 {
		t.Fatalf("free with the child: %d -> %d", free0, f)
	}
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, func() bool {
		for _, ci := range status(t, sock).Clients {
			if ci.Pid == int64(cmd.Process.Pid) {
				return false
			}
		}
		f, _, _ := dev.MemInfo()
		return f == free0
	})
	t.Logf("child %s killed; free memory back to %d", strconv.Itoa(cmd.Process.Pid), free0)
}

// writeImage commits into dir, for own (nil: this process), a GPU image of
// process pid holding one 16 MiB buffer (zeros) on the device uuid, and
// returns its id.
func writeImage(t *testing.T, dir string, pid int, uuid string, own *image.Owner) []byte {
	t.Helper()
	w, err := image.Create(dir, image.Origin{Pid: pid}, image.Options{Owner: own})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddProcess(pid, 0); err != nil {
		t.Fatal(err)
	}
	bw, err := w.AddBuffer(image.BufferInfo{Pid: pid, Address: 0x500000000000, Size: 16 << 20, GPUUUID: uuid})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bw.Write(make([]byte, 16<<20)); err != nil {
		t.Fatal(err)
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	return w.ID()
}

// A restore's memory counts for the owner of its image: a PrepareRestore
// that would take that uid past its GPU memory limit is refused, naming the
// limit, and one within it shows in Status as that uid's.
func TestSimPrepareRestoreCountsForTheImagesOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an image of another uid is written")
	}
	drv := loadSim(t)
	owner := &image.Owner{UID: 61001, GID: 61001}
	dir := filepath.Join(t.TempDir(), "img")
	writeImage(t, dir, 42, drv.Devices[0].UUID, owner)
	for _, c := range []struct {
		limit uint64
		ok    bool
	}{{8 << 20, false}, {32 << 20, true}} {
		_, sock := startServerLimits(t, Limits{GPUMemoryByUID: map[uint32]uint64{61001: c.limit}}, CUDADevices(drv)...)
		p := dial(t, sock)
		p.hello(helperpb.Role_ROLE_PLUGIN, 0)
		r, _ := p.mustCall(&helperpb.Request{Body: &helperpb.Request_PrepareRestore{PrepareRestore: &helperpb.PrepareRestore{ImageDir: dir}}})
		if !c.ok {
			if r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_OUT_OF_MEMORY || !strings.Contains(r.Error.Message, "uid 61001") {
				t.Errorf("a restore past the owner's limit of %d bytes: %v", c.limit, r)
			}
			continue
		}
		if r.Error != nil {
			t.Fatalf("a restore within the owner's limit: %v", r.Error)
		}
		var held uint64
		for _, ci := range status(t, sock).Clients {
			if int(ci.Uid) == owner.UID {
				held += ci.Bytes
			}
		}
		if held != 16<<20 {
			t.Errorf("Status shows %d bytes for uid 61001 while its image is prepared, want 16 MiB", held)
		}
		p.w.Close()
	}
}

// An adoption (a process a dead helper left detached) counts against the
// process's uid's GPU memory limit: past it the process is told its GPU
// state is lost, naming the limit, and nothing is held for it; within it,
// the memory is loaded for it.
func TestSimAdoptionCountsForTheProcess(t *testing.T) {
	drv := loadSim(t)
	dir := filepath.Join(t.TempDir(), "img")
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	pid := proc.Pid(sleeper.Process.Pid)
	st, err := proc.ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	id := writeImage(t, dir, int(pid), drv.Devices[0].UUID, nil)
	uid := uint32(os.Geteuid())
	for _, c := range []struct {
		limit uint64
		ok    bool
	}{{8 << 20, false}, {32 << 20, true}} {
		sockDir := t.TempDir()
		s := New(Config{Socket: filepath.Join(sockDir, "helper.sock"), Devices: CUDADevices(drv), Log: zap.NewNop(),
			Limits: Limits{GPUMemoryByUID: map[uint32]uint64{uid: c.limit}}})
		if err := s.states.save(detachState{Pid: pid, StartTime: st.Start, UID: uid, ImageOwner: uid, ImageDir: dir, ImageID: id}); err != nil {
			t.Fatal(err)
		}
		s.adoptOrphans()
		wake, _ := os.ReadFile(s.wakes.path(pid))
		held := s.gpus.held(uid)
		if c.ok {
			if len(wake) != 0 || held != 16<<20 {
				t.Errorf("an adoption within a %d-byte limit: wake file %q, %d bytes held", c.limit, wake, held)
			}
		} else if !strings.HasPrefix(string(wake), "lost: ") || !strings.Contains(string(wake), "GPU memory limit") || held != 0 {
			t.Errorf("an adoption past a %d-byte limit: wake file %q, %d bytes held", c.limit, wake, held)
		}
		s.Shutdown()
	}
}

// A resident copy serves only restores of an image of the owner whose image
// it was loaded from: a directory the owner can write may get another
// user's image under the same id (an id is no secret), and that restore
// must read its own data from storage, not the resident copy's.
func TestSimResidentServesOnlyItsImagesOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an image of another uid is written")
	}
	drv := loadSim(t)
	dir := filepath.Join(t.TempDir(), "img")
	id := writeImage(t, dir, 42, drv.Devices[0].UUID, &image.Owner{UID: 61001, GID: 61001})
	s, _ := startServer(t, CUDADevices(drv)...)
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	im, owner, err := openRestorable(d, "", image.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	place, err := placeGPUs(imageGPUs(im, 0), s.cfg.Devices, im.Manifest().GetOrigin().GetGpuModel(), nil, s.pool.restoreRoom)
	if err != nil {
		t.Fatal(err)
	}
	key, err := residentKeyOf(d)
	if err != nil {
		t.Fatal(err)
	}
	// A copy of that directory's image id, loaded from an image of root's.
	r := &resident{key: key, dir: dir, id: id, owner: 0, imageOwner: 0,
		made: []*alloc{{dev: place.deviceOf(im.Buffers()[0])}}}
	s.residents.put(r)
	if got := s.residents.servingFor(s.log, d, im, owner, place); got != nil {
		got.mu.RUnlock()
		t.Errorf("a restore of uid %d's image was served by the resident copy of root's image", owner)
	}
	r.imageOwner = owner
	if got := s.residents.servingFor(s.log, d, im, owner, place); got == nil {
		t.Errorf("a restore of uid %d's image was not served by the resident copy of its own image", owner)
	} else {
		got.mu.RUnlock()
	}
	s.residents.take(key, 0) // nothing of it to release
}
