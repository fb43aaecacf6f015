package daemon

import (
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
