// Package uffd measures what a page fault served through userfaultfd costs
// on this host. CRIU's lazy-pages daemon serves a restored process's host
// memory that way: a page the process touches before the daemon has sent it
// costs one such round trip. NVIDIA's restore of a GPU process's driver
// state reads the state it parked in the process's memory (about 620 MiB)
// right after CRIU, so on a host whose round trip is slow a lazy restore of
// a GPU process waits far longer than a plain one (seen: 10 s against 0.3 s).
package uffd

// #include "probe.h"
import "C"

import (
	"errors"
	"time"
	"unsafe"
)

// FaultCost is the mean time one fault took over pages faults, each served
// by another thread with one UFFDIO_COPY of a page.
func FaultCost(pages int) (time.Duration, error) {
	if pages <= 0 {
		return 0, errors.New("no pages to fault")
	}
	var us C.double
	var why [256]C.char
	if C.gpucr_uffd_probe(C.long(pages), &us, &why[0], C.size_t(len(why))) != 0 {
		return 0, errors.New(C.GoString((*C.char)(unsafe.Pointer(&why[0]))))
	}
	return time.Duration(float64(us) * float64(time.Microsecond)), nil
}
