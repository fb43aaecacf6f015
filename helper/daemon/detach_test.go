package daemon

import (
	"os"
	"testing"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// Allocation kinds survive the trip into an image and back; a slab is
// "other" in the image and a slab again after a restore.
func TestAllocKindsRoundTrip(t *testing.T) {
	for _, k := range []helperpb.AllocKind{helperpb.AllocKind_ALLOC_KIND_MEM_ALLOC, helperpb.AllocKind_ALLOC_KIND_PITCH,
		helperpb.AllocKind_ALLOC_KIND_ASYNC, helperpb.AllocKind_ALLOC_KIND_VMM, helperpb.AllocKind_ALLOC_KIND_SLAB} {
		if got := protoKind(imageKind(k)); got != k {
			t.Errorf("%v -> %v -> %v", k, imageKind(k), got)
		}
	}
	if imageKind(helperpb.AllocKind_ALLOC_KIND_SLAB) != image.AllocOther {
		t.Errorf("a slab is %v in the image", imageKind(helperpb.AllocKind_ALLOC_KIND_SLAB))
	}
}

// procStat reads this process's state and start time; a pid that is gone
// is an error.
func TestProcStat(t *testing.T) {
	ps, err := procStat(int32(os.Getpid()))
	if err != nil || !ps.alive() || ps.start == 0 {
		t.Fatalf("procStat(self) = %+v, %v", ps, err)
	}
	if !processAlive(int32(os.Getpid())) {
		t.Error("processAlive(self) is false")
	}
	if _, err := procStat(1 << 30); err == nil {
		t.Error("procStat of a pid that cannot exist succeeded")
	}
}
