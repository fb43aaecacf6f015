package daemon

// The GPU memory the helper makes for its clients and hands out as fds: a
// calls connection's Alloc, Mapped, Free, Export and ImportPeer, a restore
// plan's allocations, and the release of a client's memory when it goes.
// Who owns what is the registry's (registry.go, sharing.go); the limits on
// it are gpuReservations' and exportSet's.

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// allocator makes, hands out and releases the clients' GPU memory. It holds
// nothing of its own but the next allocation id: what it makes, the
// registry records.
type allocator struct {
	devices   []Device
	limits    *Limits
	log       *zap.Logger
	reg       *registry
	pool      *pool
	gpus      *gpuReservations
	exports   *exportSet
	states    *detachStates
	residents *residentSet
	snaps     *snapshotHolds
	stopping  <-chan struct{}
	nextID    atomic.Uint64
}

// importPeer runs an ImportPeer: the fd that came with it is the one the
// client's application imports.
func (a *allocator) importPeer(c *conn, cl *client, id uint64) *helperpb.Response {
	f := c.takeFD()
	if f == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "ImportPeer without the fd imported")
	}
	defer f.Close()
	aid, err := a.exports.find(int(f.Fd()))
	if err != nil {
		cl.log.Warn("peer import not looked up", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "not known for an export of memory the helper serves: %v", err)
	}
	al, owner, err := a.reg.addImport(cl, aid)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "%v", err)
	}
	cl.log.Debug("peer import", zap.Uint64("alloc_id", aid), pidField("owner_pid", owner.pid))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Alloc{Alloc: &helperpb.AllocReply{AllocId: aid, Size: al.size}}}
}

// handOver gives al, which from lets go of, to an importer that still maps
// it (registry.handOver), and its kept export with it; false if nobody
// imports it: the caller releases it, and its export is forgotten.
func (a *allocator) handOver(from *client, al *alloc) bool {
	heir, uid := a.reg.handOver(al)
	if heir == nil {
		a.exports.forget(al.id)
		return false
	}
	a.exports.moveTo(al.id, uid)
	from.log.Info("shared allocation handed over to a process that still maps it", zap.Uint64("alloc_id", al.id),
		pidField("to_pid", heir.pid))
	return true
}

func (a *allocator) alloc(cl *client, id uint64, req *helperpb.Alloc) (*helperpb.Response, int) {
	dev := deviceByUUID(a.devices, req.DeviceUuid)
	if dev == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no device %q", req.DeviceUuid), -1
	}
	info := dev.Info()
	g := info.Granularity
	if g == 0 {
		g = 1
	}
	if req.Size == 0 || req.Size > math.MaxUint64-g {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "bad allocation size %d", req.Size), -1
	}
	size := (req.Size + g - 1) / g * g
	if info.TotalMemory != 0 && size > info.TotalMemory {
		return errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "%d bytes requested; device %s has %d",
			size, info.Uuid, info.TotalMemory), -1
	}
	unreserve, refused := a.reserveGPU(cl, id, size)
	if refused != nil {
		return refused, -1
	}
	defer unreserve() // once cl.bytes counts it, or it failed
	var flags image.AllocFlags
	if req.GpuDirectRdma {
		flags |= image.AllocFlagGPUDirectRDMA
	}
	if req.HostNuma {
		flags = image.AllocFlagHostNUMA // pinned host memory, on the device's host node
	}
	t0 := time.Now()
	key := poolKey{dev: dev, size: size, flags: flags}
	h, fd, pooled := a.pool.take(key)
	var tCreate, tExport time.Duration
	if !pooled {
		var err error
		h, err = a.create(dev, size, flags)
		tCreate = time.Since(t0)
		if err != nil {
			if isOOM(err) {
				return errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "%v", err), -1
			}
			cl.log.Warn("allocation failed", zap.Uint64("size", size), zap.Error(err))
			return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "%v", err), -1
		}
		t1 := time.Now()
		fd, err = dev.Export(h)
		tExport = time.Since(t1)
		if err != nil {
			if rerr := dev.Release(h); rerr != nil {
				cl.log.Warn("release after failed export", zap.Error(rerr))
			}
			cl.log.Warn("export failed", zap.Error(err))
			return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "%v", err), -1
		}
	}
	al := &alloc{id: a.nextID.Add(1), handle: h, size: size, dev: dev, kind: req.Kind, flags: flags, address: req.Address}
	cl.mu.Lock()
	cl.allocs[al.id] = al
	cl.bytes += size
	cl.mu.Unlock()
	a.reg.own(al.id, cl)
	cl.log.Debug("alloc", zap.Uint64("alloc_id", al.id), zap.Uint64("size", size), zap.String("device", info.Uuid),
		zap.Stringer("kind", req.Kind), zap.Bool("pooled", pooled), zap.Duration("create", tCreate), zap.Duration("export", tExport))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Alloc{Alloc: &helperpb.AllocReply{AllocId: al.id, Size: size}}}, fd
}

// reserveGPU checks that cl's uid may take size more bytes of GPU memory and
// holds them until release (after they are counted in cl.bytes, or the
// allocation failed). A refusal is the response to send.
func (a *allocator) reserveGPU(cl *client, id, size uint64) (release func(), refused *helperpb.Response) {
	cl.mu.Lock()
	uid := cl.uid
	cl.mu.Unlock()
	release, err := a.gpus.reserve(uid, size, "this allocation")
	if err != nil {
		cl.log.Info("allocation refused: GPU memory limit", zap.Uint64("size", size), zap.Error(err))
		return nil, errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "%v", err)
	}
	return release, nil
}

// ownAlloc finds id among cl's allocations; the error response says whether
// it is someone else's or nobody's. Called with cl.mu held.
func (a *allocator) ownAlloc(cl *client, reqID, id uint64) (*alloc, *helperpb.Response) {
	if al := cl.allocs[id]; al != nil {
		return al, nil
	}
	other := a.reg.ownerOf(id)
	if other != nil {
		cl.log.Warn("client named another client's allocation", zap.Uint64("alloc_id", id), pidField("owner_pid", other.pid))
		return nil, errResp(reqID, helperpb.ErrorCode_ERROR_PERMISSION, "allocation %d is not yours", id)
	}
	return nil, errResp(reqID, helperpb.ErrorCode_ERROR_NOT_FOUND, "no allocation %d", id)
}

func (a *allocator) mapped(cl *client, id uint64, m *helperpb.Mapped) *helperpb.Response {
	if a.reg.mappedImport(cl, m.AllocId, m.Address) {
		return okResp(id)
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	al, er := a.ownAlloc(cl, id, m.AllocId)
	if er != nil {
		return er
	}
	al.address = m.Address
	return okResp(id)
}

// export hands the client an fd of one of its allocations: the
// application exports memory the helper serves (NCCL shares its buffers with
// its peer ranks this way), and the driver refuses to export what the
// application holds, an import. Every Export of an allocation hands out the
// same open file, which the helper keeps (exports.go).
func (a *allocator) export(cl *client, id uint64, e *helperpb.Export) (*helperpb.Response, int) {
	cl.mu.Lock()
	al, er := a.ownAlloc(cl, id, e.AllocId)
	uid := cl.uid
	cl.mu.Unlock()
	if er != nil {
		return er, -1
	}
	fd, err := a.exports.fdOf(al.id, uid, a.limits.exportLimit(uid), func() (int, error) { return al.dev.Export(al.handle) })
	switch {
	case errors.Is(err, errExportLimit):
		cl.log.Info("export refused: exported allocations limit", zap.Uint64("alloc_id", al.id), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "%v", err), -1
	case err != nil:
		cl.log.Warn("export failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "%v", err), -1
	}
	return okResp(id), fd
}

func (a *allocator) free(cl *client, id uint64, f *helperpb.Free) *helperpb.Response {
	if a.reg.endImport(cl, f.AllocId) {
		return okResp(id)
	}
	cl.mu.Lock()
	al, er := a.ownAlloc(cl, id, f.AllocId)
	if er != nil {
		cl.mu.Unlock()
		return er
	}
	delete(cl.allocs, al.id)
	cl.bytes -= al.size
	g := cl.guard
	cl.mu.Unlock()
	if g != nil && al.address != 0 {
		// A free is a write: a copy-on-write window saves the memory first.
		_ = g.Save(int(cl.pid), []engine.AddrRange{{Addr: al.address, Size: al.size}})
	}
	if a.handOver(cl, al) {
		return okResp(id)
	}
	a.reg.disown(al.id)
	if err := al.dev.Release(al.handle); err != nil {
		cl.log.Warn("release failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "%v", err)
	}
	return okResp(id)
}

// dropClient forgets a client whose calls connection closed and releases
// every allocation it had; one detaching for a dump is parked instead.
func (a *allocator) dropClient(cl *client) {
	if a.reg.callsClosed(cl) {
		return // the client closes its control connection itself
	}
	// The client leaves the status list only after its memory is released,
	// so that whoever sees it gone also sees the memory back.
	defer a.reg.disconnect(cl)
	defer cl.closeProc()
	cl.mu.Lock()
	ctrl := cl.ctrl
	cl.mu.Unlock()
	if ctrl != nil {
		ctrl.conn.Close()
	}
	n, bytes, failed := a.freeAllocs(cl)
	cl.log.Info("client gone; its allocations released", zap.Int("allocations", n),
		zap.Uint64("bytes", bytes), zap.Int("release_failures", failed))
	// A restored process that goes before it has its GPU memory back (it
	// crashed or was killed while reattaching) fails its restore now: the
	// one waiting for the restore learns it at once, not at its deadline.
	if out := cl.takeOutcomes(); out != nil {
		cl.mu.Lock()
		pid := cl.pid
		cl.mu.Unlock()
		cl.log.Error("restored process went before it got its GPU memory back")
		out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_FAILED,
			"it exited or was killed before it got its GPU memory back (its connection to the helper closed); "+
				"its own output and the kernel log (a crash) say why")
	}
}

// release gives back every allocation of a client that waited for its
// process (released): it is gone for good. A client its state does not let
// go (a connected one) keeps its memory; the refusal is logged.
func (a *allocator) release(cl *client) {
	if cl.fire(evReleased) != nil {
		return
	}
	a.states.drop(cl.pid)
	a.freeAllocs(cl)
	cl.closeProc()
}

// freeAllocs releases every allocation of cl: n of them, of bytes in all,
// failed of which the driver refused (logged).
func (a *allocator) freeAllocs(cl *client) (n int, bytes uint64, failed int) {
	cl.mu.Lock()
	allocs := cl.allocs
	cl.allocs = map[uint64]*alloc{}
	bytes = cl.bytes
	cl.bytes = 0
	g := cl.guard
	d := cl.demand
	cl.mu.Unlock()
	if d != nil {
		// Its on-demand load may still write into this memory: its part
		// is stopped and waited for (the chunks on their way).
		select {
		case <-d.l.Done():
		default:
			d.out.fail(cl, "it ended before its GPU data was all loaded")
		}
		d.l.Abandon(d.mine)
	}
	if g != nil {
		// A process that goes (killed after a dump, or exited) while a
		// copy-on-write window holds its memory: the window saves it
		// first.
		_ = g.Save(int(cl.pid), []engine.AddrRange{{Addr: 0, Size: ^uint64(0)}})
	}
	a.reg.dropImporter(cl)
	for _, al := range allocs {
		if a.handOver(cl, al) {
			continue
		}
		a.reg.disown(al.id)
		if err := al.dev.Release(al.handle); err != nil {
			failed++
			cl.log.Warn("release failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		}
	}
	return len(allocs), bytes, failed
}

// reimport sends every mapped allocation of cl, with a new fd each, in
// Reimport frames of at most wire.MaxFDs entries, waiting for each Ok.
func (a *allocator) reimport(cl *client, ctl *control, wait time.Duration) (*helperpb.Error, error) {
	ents, fds, err := a.reimportEntries(cl)
	if err != nil {
		return &helperpb.Error{Code: helperpb.ErrorCode_ERROR_DRIVER, Message: err.Error()}, nil
	}
	defer wire.CloseFDs(fds)
	for i := 0; i < len(ents); i += wire.MaxFDs {
		j := min(i+wire.MaxFDs, len(ents))
		req := &helperpb.Request{Body: &helperpb.Request_Reimport{Reimport: &helperpb.Reimport{Entries: ents[i:j]}}}
		r, err := ctl.call(req, fds[i:j], wait)
		if err != nil {
			return nil, err
		}
		if r.Error != nil {
			return r.Error, nil
		}
	}
	cl.log.Info("reimport sent", zap.Int("allocations", len(ents)))
	return nil, nil
}

// reimportAll is reimport with the client's refusal turned into an error.
func (a *allocator) reimportAll(cl *client, ctl *control, wait time.Duration) error {
	failed, err := a.reimport(cl, ctl, wait)
	if err == nil && failed != nil {
		err = fmt.Errorf("%s: %s", failed.Code, failed.Message)
	}
	return err
}

// reimportEntries: the client's mapped allocations in id order, with a new
// fd each (the caller closes them). Allocations never mapped are skipped.
func (a *allocator) reimportEntries(cl *client) ([]*helperpb.ReimportEntry, []int, error) {
	cl.mu.Lock()
	var list []*alloc
	for _, al := range cl.allocs {
		if al.address != 0 {
			list = append(list, al)
		}
	}
	cl.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].id < list[j].id })
	var ents []*helperpb.ReimportEntry
	var fds []int
	add := func(al *alloc, addr uint64) error {
		fd, err := al.dev.Export(al.handle)
		if err != nil {
			wire.CloseFDs(fds)
			return fmt.Errorf("allocation %d: %w", al.id, err)
		}
		ents = append(ents, &helperpb.ReimportEntry{AllocId: al.id, Address: addr, Size: al.size})
		fds = append(fds, fd)
		return nil
	}
	for _, al := range list {
		if err := add(al, al.address); err != nil {
			return nil, nil, err
		}
	}
	// Then its peers' memory it maps (an NCCL rank's imports).
	for _, e := range a.reg.importEntries(cl) {
		if err := add(e.al, e.address); err != nil {
			return nil, nil, err
		}
	}
	return ents, fds, nil
}

// create makes memory on dev for an allocation or a restore: the pool's
// ready allocations of dev are given back first if the device is full
// without them, and then, while concurrent checkpoints' snapshots hold
// memory there, it waits for them to be written and freed (the
// application waits in its allocation, as for a slow one, rather than
// failing for want of memory a checkpoint borrowed).
func (a *allocator) create(dev Device, size uint64, flags image.AllocFlags) (uint64, error) {
	h, err := dev.Create(size, flags)
	if err != nil && isOOM(err) && a.pool.drain(dev) > 0 {
		h, err = dev.Create(size, flags)
	}
	for err != nil && isOOM(err) && a.residents.evict(a.log, dev) { // resident copies go before a process fails
		h, err = dev.Create(size, flags)
	}
	if err != nil && isOOM(err) {
		deadline := time.Now().Add(snapshotOOMWait)
		for err != nil && isOOM(err) && time.Now().Before(deadline) {
			a.log.Info("an allocation waits for a concurrent checkpoint's snapshot to be written and freed",
				zap.Uint64("size", size), zap.Int("device", int(dev.Info().Ordinal)))
			if !a.snaps.waitRelease(dev.GPU(), time.Until(deadline), a.stopping) {
				break
			}
			h, err = dev.Create(size, flags)
		}
	}
	return h, err
}
