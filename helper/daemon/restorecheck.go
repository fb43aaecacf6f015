package daemon

// The restore check: a restored process may run only with exactly the GPU
// memory it had. Before the driver's restore, the helper compares the
// process's own record of its memory (its buffer table) with what the image
// gave it; a mismatch aborts the process with the reason.

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// checkRestored compares what a restored process records of its own GPU
// memory (its buffer table: every allocation it had, by address and size)
// with what the image gave it: the image must hold exactly those. An image
// anyone could rewrite (a re-sealed manifest with a buffer moved, shrunk,
// dropped, or given to another pid) is caught here, before the driver
// restore and before the process may run.
func (cl *client) checkRestored(ctl *control, wait time.Duration) error {
	r, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Snapshot{Snapshot: &helperpb.Snapshot{}}}, wait)
	if err != nil {
		return fmt.Errorf("its record of its memory: %w", err)
	}
	var had, got []memSpan
	for _, a := range r.GetTable().GetAllocations() {
		if a.Address != 0 { // never mapped: nothing of it was dropped or saved
			had = append(had, memSpan{a.Address, a.Size})
		}
	}
	cl.mu.Lock()
	for _, al := range cl.allocs {
		got = append(got, memSpan{al.address, al.size})
	}
	cl.mu.Unlock()
	return matchRestored(had, got)
}

// memSpan is one allocation: where it is mapped and how large it is.
type memSpan struct{ addr, size uint64 }

// matchRestored is nil if got (what the image gave a restored process)
// holds exactly the allocations of had (what the process records it had),
// by address and size; else it says every difference.
func matchRestored(had, got []memSpan) error {
	have := map[uint64]uint64{} // address -> size, of what the image gave
	for _, g := range got {
		if _, dup := have[g.addr]; dup {
			return fmt.Errorf("the GPU image gives the process two buffers at 0x%x", g.addr)
		}
		have[g.addr] = g.size
	}
	var missing, wrong, extra []string
	seen := map[uint64]bool{}
	for _, h := range had {
		seen[h.addr] = true
		size, ok := have[h.addr]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("0x%x (%d bytes)", h.addr, h.size))
		case size != h.size:
			wrong = append(wrong, fmt.Sprintf("0x%x is %d bytes in the image, %d in the process", h.addr, size, h.size))
		}
	}
	for addr, size := range have {
		if !seen[addr] {
			extra = append(extra, fmt.Sprintf("0x%x (%d bytes)", addr, size))
		}
	}
	if len(missing)+len(wrong)+len(extra) == 0 {
		return nil
	}
	sort.Strings(missing)
	sort.Strings(wrong)
	sort.Strings(extra)
	msg := "the GPU image does not match the process"
	if len(missing) > 0 {
		msg += "; it lacks the process's buffer(s) at " + strings.Join(missing, ", ")
	}
	if len(wrong) > 0 {
		msg += "; buffer " + strings.Join(wrong, ", ")
	}
	if len(extra) > 0 {
		msg += "; it holds buffer(s) the process does not have at " + strings.Join(extra, ", ")
	}
	return errors.New(msg)
}
