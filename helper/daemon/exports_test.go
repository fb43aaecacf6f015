package daemon

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// ownFDs is how many descriptors this process has open (the test's helper
// runs in it).
func ownFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// kcmpSame reports whether fds a and b of this process are one open file.
func kcmpSame(a, b int) bool {
	pid := uintptr(unix.Getpid())
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, 0 /* KCMP_FILE */, uintptr(a), uintptr(b), 0)
	return errno == 0 && r == 0
}

// Every Export of one allocation hands out the same open file, and the
// helper keeps one descriptor for it however often it is asked (it kept a
// new one per request, and 20,000 requests filled its descriptor table);
// that one goes when the allocation does.
func TestExportKeepsOneFilePerAllocation(t *testing.T) {
	s, sock := startServer(t, newFake())
	uuid := s.cfg.Devices[0].Info().Uuid
	c := dial(t, sock)
	c.register()
	id, _ := c.alloc(uuid, 4<<20)
	fds0 := ownFDs(t)
	first := -1
	for i := 0; i < 300; i++ {
		r, fds := c.mustCall(exportReq(id))
		if r.Error != nil || len(fds) != 1 {
			t.Fatalf("Export %d: %v with %d fds", i, r, len(fds))
		}
		if first < 0 {
			first = fds[0]
			continue
		}
		if !kcmpSame(first, fds[0]) {
			t.Fatalf("Export %d handed out another file than the first", i)
		}
		unix.Close(fds[0])
	}
	if n := ownFDs(t); n > fds0+3 {
		t.Errorf("300 Exports of one allocation left %d more descriptors open (the test keeps one)", n-fds0)
	}
	unix.Close(first)
	if e := c.simple(freeReq(id)); e != nil {
		t.Fatal(e)
	}
	waitFor(t, func() bool { return ownFDs(t) <= fds0-1 })
}

// ImportPeer finds the allocation an fd is an export of by an index of the
// kept files, not by comparing it with every one of them: with 600
// allocations exported, 60 imports make a few hundred comparisons, not
// tens of thousands (a linear scan held the server's lock 81-89 ms an
// import with 15,000 kept).
func TestImportPeerIndexed(t *testing.T) {
	const n, imports = 600, 60
	s, sock := startServer(t, newFakeTotal(2*n<<20))
	uuid := s.cfg.Devices[0].Info().Uuid
	owner, peer := dial(t, sock), dial(t, sock)
	owner.register()
	peer.register()
	ids := make([]uint64, n)
	exported := make([]int, n)
	for i := range ids {
		ids[i], _ = owner.alloc(uuid, 2<<20)
		r, fds := owner.mustCall(exportReq(ids[i]))
		if r.Error != nil || len(fds) != 1 {
			t.Fatalf("Export %d: %v", i, r)
		}
		exported[i] = fds[0]
	}
	defer func() {
		for _, fd := range exported {
			unix.Close(fd)
		}
	}()
	before := fileCompares.Load()
	for i := 0; i < imports; i++ {
		k := (i * 7919) % n
		r, _, err := peer.call(importPeerReq(), exported[k])
		if err != nil || r.GetAlloc().GetAllocId() != ids[k] {
			t.Fatalf("ImportPeer of allocation %d's export: %v, %v", ids[k], r, err)
		}
	}
	if got := fileCompares.Load() - before; got > imports*16 {
		t.Errorf("%d imports among %d exports compared %d files, %.0f an import; want a search (at most 16 each)",
			imports, n, got, float64(got)/imports)
	}
}

// A uid keeps at most ExportsPerUID exported allocations (root is not
// limited); a refusal names the limit, and a freed allocation gives its
// place back.
func TestExportsPerUIDLimit(t *testing.T) {
	s, sock := startServerLimits(t, Limits{ExportsPerUID: 3, limitRoot: true}, newFake())
	uuid := s.cfg.Devices[0].Info().Uuid
	c := dial(t, sock)
	c.register()
	var ids []uint64
	for i := 0; i < 4; i++ {
		id, _ := c.alloc(uuid, 2<<20)
		ids = append(ids, id)
	}
	for i, id := range ids[:3] {
		for j := 0; j < 2; j++ { // again: the same export, no new place
			r, fds := c.mustCall(exportReq(id))
			if r.Error != nil || len(fds) != 1 {
				t.Fatalf("Export of allocation %d (%d, %d): %v", id, i, j, r)
			}
			unix.Close(fds[0])
		}
	}
	r, fds := c.mustCall(exportReq(ids[3]))
	if r.Error == nil || len(fds) != 0 || r.Error.Code != helperpb.ErrorCode_ERROR_UNAVAILABLE ||
		!strings.Contains(r.Error.Message, "--max-exports-per-uid") || !strings.Contains(r.Error.Message, fmt.Sprintf("uid %d", os.Getuid())) {
		t.Fatalf("a fourth exported allocation: %v with %d fds; want ERROR_UNAVAILABLE naming the limit", r, len(fds))
	}
	if e := c.simple(freeReq(ids[0])); e != nil {
		t.Fatal(e)
	}
	r, fds = c.mustCall(exportReq(ids[3]))
	if r.Error != nil || len(fds) != 1 {
		t.Fatalf("Export after a Free gave a place back: %v", r)
	}
	unix.Close(fds[0])

	// Root is not limited.
	_, rsock := startServerLimits(t, Limits{ExportsPerUID: 1}, newFake())
	rc := dial(t, rsock)
	rc.register()
	for i := 0; i < 3; i++ {
		id, _ := rc.alloc(uuid, 2<<20)
		r, fds := rc.mustCall(exportReq(id))
		if r.Error != nil || len(fds) != 1 {
			t.Fatalf("root's Export %d: %v", i, r)
		}
		unix.Close(fds[0])
	}
}
