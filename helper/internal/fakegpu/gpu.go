package fakegpu

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/ptx"
)

// The device as an engine.GPU. An allocation's device address, for the
// engines, is its handle shifted into a range of its own (vaShift): a copy
// finds its allocation by the address alone, as the driver does.

const vaShift = 40

// GPU is the device itself: it is an engine.GPU.
func (d *Device) GPU() engine.GPU { return d }

func (d *Device) Ordinal() int { return int(d.info.Ordinal) }
func (d *Device) UUID() string { return d.info.Uuid }
func (d *Device) Name() string { return d.info.Name }

// Map maps allocation h into this process (once) and returns its address.
func (d *Device) Map(h uint64, size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fd, ok := d.live[h]
	if !ok || size != d.sizes[h] {
		return 0, errors.New("cuMemMap: CUDA_ERROR_INVALID_VALUE (1)")
	}
	if d.views[h] == nil {
		v, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return 0, fmt.Errorf("mmap of allocation %d: %w", h, err)
		}
		d.views[h] = v
	}
	return h << vaShift, nil
}

// span is the mapped memory [va, va+n).
func (d *Device) span(va uint64, n int) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := d.views[va>>vaShift]
	off := va & (1<<vaShift - 1)
	if v == nil || off+uint64(n) > uint64(len(v)) {
		return nil, deviceError{fmt.Sprintf("address 0x%x (+%d) is not mapped: CUDA_ERROR_INVALID_VALUE (1)", va, n)}
	}
	return v[off : off+uint64(n)], nil
}

// deviceError is an error of the device (engine.DeviceError).
type deviceError struct{ msg string }

func (e deviceError) Error() string     { return e.msg }
func (e deviceError) DeviceError() bool { return true }

// HashRanges hashes in Go what the GPU's kernel hashes (ptx.ChunkHash).
func (d *Device) HashRanges(ranges []engine.Range, chunk int) ([][][16]byte, error) {
	out := make([][][16]byte, len(ranges))
	for i, r := range ranges {
		b, err := d.span(r.VA, int(r.Size))
		if err != nil {
			return nil, err
		}
		for off := 0; off < len(b); off += chunk {
			out[i] = append(out[i], ptx.ChunkHash(b[off:min(off+chunk, len(b))]))
		}
	}
	return out, nil
}

// lane copies at once, on the caller's goroutine.
type lane struct {
	d       *Device
	staging []byte
}

func (d *Device) AcquireLane(staging int) (engine.Lane, error) {
	return &lane{d: d, staging: make([]byte, staging)}, nil
}
func (d *Device) ReleaseLane(engine.Lane) {}

func (l *lane) Staging() []byte   { return l.staging }
func (l *lane) Do(f func()) error { f(); return nil }
func (l *lane) Close()            {}
func (l *lane) StartDtoH(dst []byte, src uint64) error {
	b, err := l.d.span(src, len(dst))
	if err != nil {
		return err
	}
	copy(dst, b)
	return nil
}
func (l *lane) StartHtoD(dst uint64, src []byte) error {
	b, err := l.d.span(dst, len(src))
	if err != nil {
		return err
	}
	copy(b, src)
	return nil
}
func (l *lane) Sync() error { return nil }

func (l *lane) StartDtoD(dst, src, n uint64) error {
	from, err := l.d.span(src, int(n))
	if err != nil {
		return err
	}
	to, err := l.d.span(dst, int(n))
	if err != nil {
		return err
	}
	copy(to, from)
	return nil
}

// MemInfo is the device's size less what is allocated.
func (d *Device) MemInfo() (free, total uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.info.TotalMemory - d.used, d.info.TotalMemory, nil
}

func (d *Device) CreateScratch(size uint64) (uint64, error) { return d.Create(size, 0) }
func (d *Device) ReleaseScratch(h uint64) error             { return d.Release(h) }
