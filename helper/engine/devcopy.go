package engine

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gpucr/gpucr/image"
)

// CopyOnDevice copies each region of src into the region of dst at the same
// index, device to device: a restore served from an image's resident copy
// (helper/daemon/resident.go), where nothing crosses PCIe. Each pair is on
// one GPU and of one size. The GPUs copy in parallel, each on one lane (its
// copy engine needs no more); opts.Progress hears the bytes copied as each
// GPU's copies end.
func CopyOnDevice(dst, src []Region, opts Options) error {
	if len(dst) != len(src) {
		return fmt.Errorf("copy on the device: %d regions into %d", len(src), len(dst))
	}
	type pair struct{ dst, src, n uint64 }
	byDev := map[GPU][]pair{}
	var order []GPU
	for i := range dst {
		d, s := dst[i], src[i]
		if d.Device != s.Device || d.Size != s.Size {
			return fmt.Errorf("copy on the device: region %d (0x%x): %d bytes on %s from %d bytes on %s",
				i, d.Address, d.Size, d.Device.UUID(), s.Size, s.Device.UUID())
		}
		dv, err := d.Device.Map(d.Handle, d.Size)
		if err != nil {
			return fmt.Errorf("device %s: view of region %d: %w", d.Device.UUID(), i, err)
		}
		sv, err := s.Device.Map(s.Handle, s.Size)
		if err != nil {
			return fmt.Errorf("device %s: view of the resident copy of region %d: %w", s.Device.UUID(), i, err)
		}
		if _, ok := byDev[d.Device]; !ok {
			order = append(order, d.Device)
		}
		byDev[d.Device] = append(byDev[d.Device], pair{dv, sv, d.Size})
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done int64
		errs = make([]error, len(order))
	)
	for j, dev := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := dev.AcquireLane(LaneStaging(image.DefaultChunkSize))
			if err != nil {
				errs[j] = fmt.Errorf("device %s: %w", dev.UUID(), err)
				return
			}
			var n uint64
			var copyErr error
			if err := l.Do(func() {
				for _, p := range byDev[dev] {
					if copyErr = l.StartDtoD(p.dst, p.src, p.n); copyErr != nil {
						return
					}
					n += p.n
				}
				copyErr = l.Sync()
			}); err != nil {
				copyErr = err
			}
			if copyErr != nil {
				l.Close()
				errs[j] = fmt.Errorf("device %s: copy on the device: %w", dev.UUID(), copyErr)
				return
			}
			dev.ReleaseLane(l)
			if opts.Progress != nil {
				mu.Lock()
				done += int64(n)
				opts.Progress(done)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
