package daemon

import (
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/image"
)

// TestDeviceContract runs one suite against every implementation of Device:
// the memfd fake most daemon tests use, and the driver binding on the
// simulated driver (CUDADevices, what the helper runs in production), so
// that the fake cannot drift from what the helper meets on a GPU.
func TestDeviceContract(t *testing.T) {
	const total = 256 << 20
	t.Run("fake", func(t *testing.T) {
		deviceContract(t, fakegpu.New(0, total))
	})
	t.Run("driver", func(t *testing.T) {
		lib := simLib(t)
		t.Setenv("GPUCR_LIBCUDA", lib)
		t.Setenv("LD_LIBRARY_PATH", filepath.Dir(lib))
		t.Setenv("GPUCR_SIM_MEM_MIB", "256")
		drv, err := cuda.Load(lib)
		if err != nil {
			t.Fatal(err)
		}
		defer drv.Close()
		deviceContract(t, CUDADevices(drv)[0])
	})
}

func deviceContract(t *testing.T, d Device) {
	info := d.Info()
	g := info.Granularity
	switch {
	case info.Uuid == "":
		t.Fatal("no UUID")
	case g == 0 || g&(g-1) != 0:
		t.Fatalf("granularity %d is not a power of two", g)
	case info.TotalMemory < 4*g:
		t.Fatalf("total memory %d is less than four granules of %d", info.TotalMemory, g)
	}

	t.Run("create, export, release", func(t *testing.T) {
		h1, err := d.Create(g, 0)
		if err != nil {
			t.Fatal(err)
		}
		h2, err := d.Create(2*g, image.AllocFlagGPUDirectRDMA)
		if err != nil {
			t.Fatalf("GPUDirect RDMA capable memory: %v", err)
		}
		if h1 == h2 {
			t.Fatalf("two allocations share the handle %#x", h1)
		}
		// Every export is a new descriptor, and closing one releases nothing.
		fd1, err := d.Export(h1)
		if err != nil {
			t.Fatal(err)
		}
		fd2, err := d.Export(h1)
		if err != nil {
			t.Fatal(err)
		}
		if fd1 < 0 || fd1 == fd2 {
			t.Fatalf("exports %d and %d", fd1, fd2)
		}
		unix.Close(fd1)
		unix.Close(fd2)
		fd3, err := d.Export(h1)
		if err != nil {
			t.Fatalf("export after the earlier exports were closed: %v", err)
		}
		unix.Close(fd3)
		for _, h := range []uint64{h1, h2} {
			if err := d.Release(h); err != nil {
				t.Fatalf("release %#x: %v", h, err)
			}
		}
	})

	t.Run("size not a multiple of the granularity", func(t *testing.T) {
		h, err := d.Create(g+1, 0)
		if err == nil {
			d.Release(h)
			t.Fatal("created")
		}
		var oom OutOfMemory
		if errors.As(err, &oom) && oom.OutOfMemory() {
			t.Fatalf("reported as out of memory: %v", err)
		}
	})

	t.Run("more than the device has", func(t *testing.T) {
		size := (info.TotalMemory/g + 1) * g
		h, err := d.Create(size, 0)
		if err == nil {
			d.Release(h)
			t.Fatalf("created %d bytes on a device of %d", size, info.TotalMemory)
		}
		var oom OutOfMemory
		if !errors.As(err, &oom) || !oom.OutOfMemory() {
			t.Fatalf("not an OutOfMemory error: %v", err)
		}
		// The device is still usable.
		h, err = d.Create(g, 0)
		if err != nil {
			t.Fatalf("after the refusal: %v", err)
		}
		if err := d.Release(h); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a handle never made", func(t *testing.T) {
		if fd, err := d.Export(0); err == nil {
			unix.Close(fd)
			t.Fatal("exported handle 0")
		}
		if err := d.Release(0); err == nil {
			t.Fatal("released handle 0")
		}
	})
}
