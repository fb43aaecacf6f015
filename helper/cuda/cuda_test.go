package cuda

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/testroot"
)

// simDriver returns the absolute path of the simulated driver, or skips (fails under CI).
func simDriver(t *testing.T) string {
	t.Helper()
	p := filepath.Join(testroot.Dir(t), "build/sim/libcuda.so.1")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("simulated driver missing (%v): run make sim", err)
		}
		t.Skipf("simulated driver missing (%v): run make sim", err)
	}
	return p
}

// loadSim loads the simulated driver with two devices of 64 MiB (cuInit
// reads the settings once per process, so every test asks for the same)
// and closes it when the test ends.
// mappedAlloc makes size bytes of device memory on dev and the helper's
// view of them (Map); the allocation is released when the test ends.
func mappedAlloc(t *testing.T, dev *Device, size uint64) (Handle, uint64) {
	t.Helper()
	h, err := dev.Create(size, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Release(h) })
	va, err := dev.Map(h, size)
	if err != nil {
		t.Fatal(err)
	}
	return h, va
}

func loadSim(t *testing.T) *Driver {
	t.Helper()
	lib := simDriver(t)
	t.Setenv("GPUCR_SIM_DEVICES", "2")
	t.Setenv("GPUCR_SIM_MEM_MIB", "64")
	d, err := Load(lib)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func TestFormatUUID(t *testing.T) {
	b := [16]byte{0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7, 0xf8, 0x09}
	if got, want := FormatUUID(b), "GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809"; got != want {
		t.Fatalf("FormatUUID = %q, want %q", got, want)
	}
}

func TestParseUUID(t *testing.T) {
	b := [16]byte{0x1a, 0x2b, 0x3c, 0x4d, 0x5e, 0x6f, 0x70, 0x81, 0x92, 0xa3, 0xb4, 0xc5, 0xd6, 0xe7, 0xf8, 0x09}
	for _, s := range []string{FormatUUID(b), strings.TrimPrefix(FormatUUID(b), "GPU-")} {
		if got, err := ParseUUID(s); err != nil || got != b {
			t.Errorf("ParseUUID(%q) = %x, %v; want %x", s, got, err, b)
		}
	}
	for _, s := range []string{"", "GPU-", "0", "GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f8", "GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f80z"} {
		if _, err := ParseUUID(s); err == nil {
			t.Errorf("ParseUUID(%q) took it", s)
		}
	}
}

func TestSimDriver(t *testing.T) {
	d := loadSim(t)
	if len(d.Devices) != 2 || d.Version != 13000 {
		t.Fatalf("devices %d, version %d", len(d.Devices), d.Version)
	}
	dev := d.Devices[1]
	if dev.UUID == d.Devices[0].UUID || len(dev.UUID) != 40 || dev.Granularity != 2<<20 || dev.TotalMemory != 64<<20 {
		t.Fatalf("device: %+v", dev)
	}
	free0, _, err := dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	h, err := dev.Create(4<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := dev.Export(h)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != 4<<20 {
		t.Fatalf("exported fd: size %d, %v", st.Size, err)
	}
	unix.Close(fd)
	free1, _, _ := dev.MemInfo()
	if free0-free1 != 4<<20 {
		t.Fatalf("free %d -> %d", free0, free1)
	}
	if _, err := dev.Create(128<<20, false); !IsOutOfMemory(err) {
		t.Fatalf("oversized create: %v", err)
	} else if err.Error() != "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)" {
		t.Fatalf("error text %q", err)
	}
	if err := dev.Release(h); err != nil {
		t.Fatal(err)
	}
	if err := dev.Release(h); err == nil {
		t.Fatal("double release succeeded")
	}
	free2, _, _ := dev.MemInfo()
	if free2 != free0 {
		t.Fatalf("free after release %d, want %d", free2, free0)
	}
}
