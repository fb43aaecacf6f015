package daemon

// Exported allocations. An application exports memory the helper serves
// (cuMemExportToShareableHandle: NCCL passes the fd on to its peer ranks),
// and a peer's ImportPeer must learn which allocation the fd it imports is
// an export of. So:
//
//   - each allocation is exported once, and the helper keeps that fd: every
//     later Export of it hands out the same open file (a duplicate, which
//     SCM_RIGHTS passes as the file itself), so that kcmp(2) knows any copy
//     of it, however it travelled, for that allocation's. The importer
//     imports from the fd it was given, as it would from a new export (the
//     driver imports an fd as often as it is asked; the simulated driver's
//     exports are duplicates of one memfd anyway);
//   - a uid keeps at most Limits.ExportsPerUID exported allocations (root:
//     no limit), one descriptor each, and the kept fd is closed when its
//     allocation is released: no user can fill the helper's descriptor
//     table (it kept one per request, and 20,000 requests did);
//   - ImportPeer finds an fd among the kept ones by binary search: kcmp's
//     KCMP_FILE orders open files (the same, less, greater), consistently
//     within a boot, so the kept ones form a slice sorted by that order. A
//     lookup makes about log2(n) comparisons under the set's own lock (it
//     scanned them all under the server's, 81-89 ms an import with 15,000).

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// kcmpFile is KCMP_FILE of linux/kcmp.h.
const kcmpFile = 0

// selfPid is this process's pid, for kcmp (the helper never forks
// without exec).
var selfPid = uintptr(unix.Getpid())

// fileCompares counts kcmp calls (tests).
var fileCompares atomic.Int64

// fileOrder compares the open files behind fds a and b of this process:
// 0 the same file, -1 a's before b's, 1 after (kcmp(2), KCMP_FILE: an
// order of the kernel's file pointers, obfuscated but consistent within a
// boot).
func fileOrder(a, b int) (int, error) {
	fileCompares.Add(1)
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, selfPid, selfPid, kcmpFile, uintptr(a), uintptr(b), 0)
	if errno != 0 {
		return 0, fmt.Errorf("kcmp of fds %d and %d: %w", a, b, errno)
	}
	switch r {
	case 0:
		return 0, nil
	case 1:
		return -1, nil
	case 2:
		return 1, nil
	}
	return 0, fmt.Errorf("kcmp of fds %d and %d: no order (%d)", a, b, r)
}

// errExportLimit: a uid has as many exported allocations as it may keep.
var errExportLimit = errors.New("exported allocations limit")

// exportEntry is the one export of an allocation the helper keeps.
type exportEntry struct {
	id  uint64 // the allocation
	fd  int
	uid uint32 // whose it counts as: its allocation's owner's
}

// exportSet is the kept exports: by allocation, in file order, and how
// many each uid keeps. It has its own lock: nothing of the server's is
// held while it compares files.
type exportSet struct {
	mu    sync.Mutex
	byID  map[uint64]*exportEntry
	order []*exportEntry // by fileOrder of their fds
	byUID map[uint32]int
}

func newExportSet() *exportSet {
	return &exportSet{byID: map[uint64]*exportEntry{}, byUID: map[uint32]int{}}
}

// search is the first place in order whose file is not before fd's, and
// whether it is fd's. Called with mu held.
func (e *exportSet) search(fd int) (int, bool, error) {
	lo, hi := 0, len(e.order)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		c, err := fileOrder(e.order[m].fd, fd)
		switch {
		case err != nil:
			return 0, false, err
		case c == 0:
			return m, true, nil
		case c < 0:
			lo = m + 1
		default:
			hi = m
		}
	}
	return lo, false, nil
}

// fdOf returns a new descriptor of allocation id's export, for the caller
// to send and close. The first one exports the allocation (export, a
// driver call, made without the lock) and keeps that fd, counted for uid,
// which may keep at most limit (0: no limit); past it, an error wrapping
// errExportLimit.
func (e *exportSet) fdOf(id uint64, uid uint32, limit int, export func() (int, error)) (int, error) {
	e.mu.Lock()
	if k := e.byID[id]; k != nil {
		defer e.mu.Unlock()
		return dupFD(k.fd)
	}
	if limit > 0 && e.byUID[uid] >= limit {
		n := e.byUID[uid]
		e.mu.Unlock()
		return -1, fmt.Errorf("%w: uid %d keeps %d exported allocations through the helper, the most it may (--max-exports-per-uid); "+
			"an allocation's exports are one file, and it stops counting when freed", errExportLimit, uid, n)
	}
	e.byUID[uid]++ // its place, held while the driver exports
	e.mu.Unlock()
	fd, err := export()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.dropCount(uid)
		return -1, err
	}
	if k := e.byID[id]; k != nil { // exported meanwhile: that one stands
		e.dropCount(uid)
		unix.Close(fd)
		return dupFD(k.fd)
	}
	i, found, err := e.search(fd)
	if err == nil && found {
		err = fmt.Errorf("allocation %d's export is the file of allocation %d's", id, e.order[i].id)
	}
	if err != nil {
		e.dropCount(uid)
		unix.Close(fd)
		return -1, err
	}
	k := &exportEntry{id: id, fd: fd, uid: uid}
	e.byID[id] = k
	e.order = slices.Insert(e.order, i, k)
	return dupFD(fd)
}

func dupFD(fd int) (int, error) {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("duplicating the kept export: %w", err)
	}
	return d, nil
}

// dropCount gives back one of uid's places. Called with mu held.
func (e *exportSet) dropCount(uid uint32) {
	if e.byUID[uid]--; e.byUID[uid] <= 0 {
		delete(e.byUID, uid)
	}
}

// find is the allocation fd is an export of (0: none of the kept ones).
func (e *exportSet) find(fd int) (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	i, found, err := e.search(fd)
	if err != nil || !found {
		return 0, err
	}
	return e.order[i].id, nil
}

// forget closes allocation id's kept export, if it has one (its memory is
// released).
func (e *exportSet) forget(id uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := e.byID[id]
	if k == nil {
		return
	}
	delete(e.byID, id)
	e.dropCount(k.uid)
	if i, found, err := e.search(k.fd); err == nil && found && e.order[i] == k {
		e.order = slices.Delete(e.order, i, i+1)
	} else {
		// The order could not be asked (it always can for fds of ours):
		// the entry goes all the same, found by a scan.
		e.order = slices.DeleteFunc(e.order, func(o *exportEntry) bool { return o == k })
	}
	unix.Close(k.fd)
}

// moveTo counts allocation id's export for uid from now on: the allocation
// was handed over to a process of uid's. Never refused: the hand-over
// cannot be.
func (e *exportSet) moveTo(id uint64, uid uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if k := e.byID[id]; k != nil && k.uid != uid {
		e.dropCount(k.uid)
		k.uid = uid
		e.byUID[uid]++
	}
}

// kept is how many exports uid keeps (tests, Status).
func (e *exportSet) kept(uid uint32) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byUID[uid]
}
