package daemon

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

func importPeerReq() *helperpb.Request {
	return &helperpb.Request{Body: &helperpb.Request_ImportPeer{ImportPeer: &helperpb.ImportPeer{}}}
}

func exportReq(id uint64) *helperpb.Request {
	return &helperpb.Request{Body: &helperpb.Request_Export{Export: &helperpb.Export{AllocId: id}}}
}

// A client's export, imported by another (the fd passed on as NCCL's proxy
// passes it), is known for what it is; another fd is not. The importer maps
// and ends its import; an allocation its owner frees while the importer
// still maps it lives on as the importer's.
func TestImportPeerKnowsExports(t *testing.T) {
	s, sock := startServer(t, newFake())
	uuid := s.cfg.Devices[0].Info().Uuid
	owner, peer := dial(t, sock), dial(t, sock)
	owner.register()
	peer.register()
	id, size := owner.alloc(uuid, 4<<20)
	if e := owner.simple(mappedReq(id, 0x7000_0000_0000)); e != nil {
		t.Fatal(e)
	}
	r, fds := owner.mustCall(exportReq(id))
	if r.Error != nil || len(fds) != 1 {
		t.Fatalf("Export: %v with %d fds", r, len(fds))
	}
	// a duplicate, as SCM_RIGHTS gives it: another number, the same file
	dup, err := unix.FcntlInt(uintptr(fds[0]), unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[0])
	r, _, err = peer.call(importPeerReq(), dup)
	unix.Close(dup)
	if err != nil || r.GetAlloc().GetAllocId() != id || r.GetAlloc().GetSize() != size {
		t.Fatalf("ImportPeer of the export: %v, %v; want allocation %d of %d bytes", r, err, id, size)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if r, _, err := peer.call(importPeerReq(), int(null.Fd())); err != nil || r.Error.GetCode() != helperpb.ErrorCode_ERROR_NOT_FOUND {
		t.Errorf("ImportPeer of /dev/null: %v, %v; want ERROR_NOT_FOUND", r, err)
	}
	// the importer maps it and ends its import; the owner's Free then releases it
	if e := peer.simple(mappedReq(id, 0x7100_0000_0000)); e != nil {
		t.Fatalf("Mapped of the import: %v", e)
	}
	if e := peer.simple(freeReq(id)); e != nil {
		t.Fatalf("Free of the import: %v", e)
	}
	if e := peer.simple(freeReq(id)); e == nil {
		t.Error("a second Free of the ended import was accepted")
	}
	// imported and mapped again, then freed by its owner: the importer holds it
	r, fds = owner.mustCall(exportReq(id))
	if len(fds) != 1 {
		t.Fatalf("Export: %v", r)
	}
	r, _, _ = peer.call(importPeerReq(), fds[0])
	unix.Close(fds[0])
	if r.GetAlloc().GetAllocId() != id {
		t.Fatalf("ImportPeer: %v", r)
	}
	if e := peer.simple(mappedReq(id, 0x7100_0000_0000)); e != nil {
		t.Fatal(e)
	}
	if e := owner.simple(freeReq(id)); e != nil {
		t.Fatalf("the owner's Free: %v", e)
	}
	if e := owner.simple(freeReq(id)); e.GetCode() != helperpb.ErrorCode_ERROR_PERMISSION {
		t.Errorf("the owner's second Free: %v; want ERROR_PERMISSION (the importer's now)", e)
	}
	if e := peer.simple(freeReq(id)); e != nil {
		t.Errorf("the importer's Free of what it took over: %v", e)
	}
}

// An owner that lets go of memory its peers still map hands it to the
// importer of the lowest pid that maps it, with its size and the uid it
// counts against; memory nobody maps is handed to no one and forgotten.
func TestRegistryHandOver(t *testing.T) {
	r := newRegistry(nil)
	mk := func(pid proc.Pid, uid uint32) *client {
		return &client{pid: pid, uid: uid, allocs: map[uint64]*alloc{}, token: uint64(pid)}
	}
	owner, late, early, unmapped := mk(10, 1000), mk(30, 1002), mk(20, 1001), mk(15, 1003)
	shared := &alloc{id: 7, size: 2 << 20, address: 0x1000}
	alone := &alloc{id: 8, size: 4 << 20, address: 0x9000}
	owner.allocs[shared.id], owner.allocs[alone.id] = shared, alone
	r.own(shared.id, owner)
	r.own(alone.id, owner)
	for _, imp := range []*client{late, early, unmapped} {
		if _, _, err := r.addImport(imp, shared.id); err != nil {
			t.Fatal(err)
		}
	}
	r.mappedImport(late, shared.id, 0x7000)
	r.mappedImport(early, shared.id, 0x5000)

	heir, uid := r.handOver(shared)
	if heir != early || uid != early.uid {
		t.Fatalf("handed to %v (uid %d), want the lowest pid that maps it, 20 (uid 1001), not 15, which does not map it",
			pidOf(heir), uid)
	}
	if early.allocs[shared.id] != shared || early.bytes != shared.size || shared.address != 0x5000 || !shared.inherited {
		t.Errorf("the heir's record: %v, %d bytes, at 0x%x, inherited %v", early.allocs[shared.id] != nil, early.bytes,
			shared.address, shared.inherited)
	}
	if r.ownerOf(shared.id) != early {
		t.Error("the heir does not own what it was handed")
	}
	if m := r.importsOf(early); len(m) != 0 {
		t.Errorf("the heir still imports what it owns: %v", m)
	}
	if m := r.importsOf(late); m[shared.id] != 0x7000 {
		t.Errorf("the other importer's mapping is lost: %v", m)
	}
	if heir, uid := r.handOver(alone); heir != nil || uid != 0 {
		t.Errorf("memory nobody imports was handed to %v", pidOf(heir))
	}
}

func pidOf(cl *client) any {
	if cl == nil {
		return "nobody"
	}
	return cl.pid
}
