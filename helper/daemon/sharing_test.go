package daemon

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

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
