package daemon

// An interposer's calls connection: the client it registers (or the waiting
// one it reattaches), its allocations (Alloc, Mapped, Free), and what its
// close releases. Its control connection is in control.go, its lifecycle in
// lifecycle.go.

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/fault"
	"github.com/gpucr/gpucr/helper/internal/printable"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// client is one application process: its calls connection, allocations and
// control connection, and where it is in its lifecycle.
type client struct {
	pid proc.Pid
	// proc is its process, held (nil for a prepared client, which has
	// none yet): every action on the process checks it first (livePid),
	// and a connected client whose process exits is dropped at once
	// (watchProcess). Set when the client is made or parked as a restored
	// process, under mu; closed when it is gone.
	proc *proc.Process
	// uid and gid: what its process connected as (a prepared client's
	// uid: its image's owner's until its process is back).
	uid, gid uint32
	program  string
	token    uint64
	log      *zap.Logger

	mu     sync.Mutex
	allocs map[uint64]*alloc
	bytes  uint64
	ctrl   *control
	calls  *conn // its calls connection, while it is served

	// opSem: one control exchange (or op sequence) at a time.
	opSem chan struct{}
	// checkpointing: a Checkpoint request of it is being served; another
	// one is refused at once, saying so (dumpgpu.go).
	checkpointing atomic.Bool
	// quietUntil: its control connection did not answer a Status; Status
	// does not ask it again before then (status.go). Guarded by mu.
	quietUntil time.Time
	// identityAt, identitySeen: when Status last looked at what its
	// process runs as, and whether it was another identity than its own
	// (identityShown). Guarded by mu.
	identityAt   time.Time
	identitySeen bool

	// life is where it is in its lifecycle, and what goes with that; only
	// lifecycle.go reads or changes it. Guarded by mu.
	life life

	// stoppedAfterDump: a dump left its process stopped (a migration's
	// source); it gets its GPU back once it is continued (stopped.go).
	// Guarded by the server's mu.
	stoppedAfterDump bool

	// stopReport is the copy record of the checkpoint that stopped it
	// last, told when it runs again (transfer.resumed). Guarded by mu.
	stopReport *transfer

	// guard is the copy-on-write window of a concurrent checkpoint (armed
	// until a Resume opens it; guard.go); guardOver closes when it ends.
	// Guarded by mu.
	guard     *engine.Guard
	guardOver chan struct{}

	// gpuPairs: a restored process whose GPUs moved (devicemap.go): its
	// driver restore puts its context onto the GPUs its memory was loaded
	// into. Set with its restore plan, before anything else sees it, and
	// taken by that restore. Guarded by mu.
	gpuPairs []GPUPair

	// demand is its restore's load while it runs on demand (ondemand.go),
	// from its claim until the load ended and its window was closed (kept
	// after a failure: its calls get the error). restoreIdx: its regions
	// of its restore plan, set with the plan. Guarded by mu.
	demand     *demandLoad
	restoreIdx []int
}

// takeGPUPairs returns and forgets the GPU pairs of cl's driver restore.
func (cl *client) takeGPUPairs() []GPUPair {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	p := cl.gpuPairs
	cl.gpuPairs = nil
	return p
}

// setStopReport records tr as the checkpoint that stops cl now.
func (cl *client) setStopReport(tr *transfer) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.stopReport = tr
}

// takeStopReport returns and forgets cl's stop report (nil: none).
func (cl *client) takeStopReport() *transfer {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	tr := cl.stopReport
	cl.stopReport = nil
	return tr
}

// maxProgram bounds the program name the helper keeps of a client (its
// argv[0], up to 128 KiB): Status lists it to every caller.
const maxProgram = 4 << 10

type alloc struct {
	id, handle, size, address uint64
	dev                       Device
	kind                      helperpb.AllocKind
	flags                     image.AllocFlags // properties the memory was created with
	// inherited: another client's allocation this one imported, handed
	// over when its owner let go of it (sharing.go); its interposer lists it
	// as a peer's, not among its own allocations.
	inherited bool
}

func (s *Server) serveCalls(c *conn, helloID uint64, h *helperpb.Hello) {
	if s.cfg.Unavailable != "" {
		_ = c.send(errResp(helloID, helperpb.ErrorCode_ERROR_UNAVAILABLE, "helper has no GPU: %s", s.cfg.Unavailable), nil)
		return
	}
	// A client is the process that connected, not its pid: one that is
	// gone already is not registered (its pid may name another process).
	p, err := c.takePeer()
	if err != nil {
		c.log.Info("calls connection of a process that is gone", zap.Error(err))
		_ = c.send(errResp(helloID, helperpb.ErrorCode_ERROR_NOT_FOUND, "the connecting process (pid %d) cannot be held: %v",
			c.cred.Pid, err), nil)
		return
	}
	// The client's own words, shown to every user by Status: bounded, and
	// with nothing a terminal acts on.
	program := printable.Bounded(h.Program, maxProgram)
	var cl *client
	if h.ClientToken != 0 {
		// A detached or restored process coming back.
		if cl = s.reattach(p, h.ClientToken); cl == nil {
			p.Close()
			_ = c.send(errResp(helloID, helperpb.ErrorCode_ERROR_NOT_FOUND,
				"no detached or restored process with pid %d and this token", c.cred.Pid), nil)
			return
		}
		cl.mu.Lock()
		cl.uid, cl.gid, cl.program = c.cred.Uid, c.cred.Gid, program
		cl.mu.Unlock()
		cl.log.Info("client reattached")
		if s.cfg.Fault.Is(fault.StallReattach) {
			stallReattach(c, cl)
		}
	} else {
		cl = s.register(p, c.cred.Uid, c.cred.Gid, program)
	}
	c.log = cl.log
	cl.mu.Lock()
	cl.calls = c
	cl.mu.Unlock()
	served := make(chan struct{})
	defer close(served)
	defer func() {
		cl.mu.Lock()
		if cl.calls == c {
			cl.calls = nil
		}
		cl.mu.Unlock()
	}()
	defer s.dropClient(cl)
	go cl.watchProcess(served)
	if err := c.send(&helperpb.Response{Id: helloID, Body: &helperpb.Response_Hello{Hello: &helperpb.HelloReply{
		ProtocolVersion: wire.Version, ClientToken: cl.token, HelperVersion: s.cfg.Version, Devices: devicesInfo(s.cfg.Devices)}}}, nil); err != nil {
		return
	}
	for {
		req := c.next()
		if req == nil {
			return
		}
		var resp *helperpb.Response
		var fd = -1
		switch b := req.Body.(type) {
		case *helperpb.Request_Alloc:
			resp, fd = s.alloc(cl, req.Id, b.Alloc)
		case *helperpb.Request_Mapped:
			resp = s.mapped(cl, req.Id, b.Mapped)
		case *helperpb.Request_Free:
			resp = s.free(cl, req.Id, b.Free)
		case *helperpb.Request_Export:
			resp, fd = s.export(cl, req.Id, b.Export)
		case *helperpb.Request_ImportPeer:
			resp = s.importPeer(c, cl, req.Id)
		case *helperpb.Request_SaveFirst:
			resp = cl.saveFirst(req.Id, b.SaveFirst)
		case *helperpb.Request_LoadFirst:
			resp = cl.loadFirst(req.Id, b.LoadFirst)
		case *helperpb.Request_AnalyzeModule:
			resp = s.analyses.serve(c, cl, req.Id, b.AnalyzeModule)
		default:
			c.reject(req.Id, "%T is not allowed on a calls connection", req.Body)
			return
		}
		var fds []int
		if fd >= 0 {
			fds = []int{fd}
		}
		err := c.send(resp, fds)
		if fd >= 0 {
			unix.Close(fd)
		}
		if err != nil {
			cl.log.Info("calls connection write failed", zap.Error(err))
			return
		}
	}
}

func (s *Server) alloc(cl *client, id uint64, a *helperpb.Alloc) (*helperpb.Response, int) {
	dev := deviceByUUID(s.cfg.Devices, a.DeviceUuid)
	if dev == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no device %q", a.DeviceUuid), -1
	}
	info := dev.Info()
	g := info.Granularity
	if g == 0 {
		g = 1
	}
	if a.Size == 0 || a.Size > math.MaxUint64-g {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "bad allocation size %d", a.Size), -1
	}
	size := (a.Size + g - 1) / g * g
	if info.TotalMemory != 0 && size > info.TotalMemory {
		return errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "%d bytes requested; device %s has %d",
			size, info.Uuid, info.TotalMemory), -1
	}
	unreserve, refused := s.reserveGPU(cl, id, size)
	if refused != nil {
		return refused, -1
	}
	defer unreserve() // once cl.bytes counts it, or it failed
	var flags image.AllocFlags
	if a.GpuDirectRdma {
		flags |= image.AllocFlagGPUDirectRDMA
	}
	if a.HostNuma {
		flags = image.AllocFlagHostNUMA // pinned host memory, on the device's host node
	}
	t0 := time.Now()
	key := poolKey{dev: dev, size: size, flags: flags}
	h, fd, pooled := s.pool.take(key)
	var tCreate, tExport time.Duration
	if !pooled {
		var err error
		h, err = s.create(dev, size, flags)
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
	al := &alloc{id: s.nextAlloc.Add(1), handle: h, size: size, dev: dev, kind: a.Kind, flags: flags, address: a.Address}
	cl.mu.Lock()
	cl.allocs[al.id] = al
	cl.bytes += size
	cl.mu.Unlock()
	s.mu.Lock()
	s.reg.own(al.id, cl)
	s.mu.Unlock()
	cl.log.Debug("alloc", zap.Uint64("alloc_id", al.id), zap.Uint64("size", size), zap.String("device", info.Uuid),
		zap.Stringer("kind", a.Kind), zap.Bool("pooled", pooled), zap.Duration("create", tCreate), zap.Duration("export", tExport))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Alloc{Alloc: &helperpb.AllocReply{AllocId: al.id, Size: size}}}, fd
}

// ownAlloc finds id among cl's allocations; the error response says whether
// it is someone else's or nobody's. Called with cl.mu held.
func (s *Server) ownAlloc(cl *client, reqID, id uint64) (*alloc, *helperpb.Response) {
	if al := cl.allocs[id]; al != nil {
		return al, nil
	}
	s.mu.Lock()
	other := s.reg.ownerOf(id)
	s.mu.Unlock()
	if other != nil {
		cl.log.Warn("client named another client's allocation", zap.Uint64("alloc_id", id), pidField("owner_pid", other.pid))
		return nil, errResp(reqID, helperpb.ErrorCode_ERROR_PERMISSION, "allocation %d is not yours", id)
	}
	return nil, errResp(reqID, helperpb.ErrorCode_ERROR_NOT_FOUND, "no allocation %d", id)
}

func (s *Server) mapped(cl *client, id uint64, m *helperpb.Mapped) *helperpb.Response {
	if s.mappedImport(cl, m.AllocId, m.Address) {
		return okResp(id)
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	al, er := s.ownAlloc(cl, id, m.AllocId)
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
func (s *Server) export(cl *client, id uint64, e *helperpb.Export) (*helperpb.Response, int) {
	cl.mu.Lock()
	al, er := s.ownAlloc(cl, id, e.AllocId)
	uid := cl.uid
	cl.mu.Unlock()
	if er != nil {
		return er, -1
	}
	fd, err := s.exports.fdOf(al.id, uid, s.cfg.Limits.exportLimit(uid), func() (int, error) { return al.dev.Export(al.handle) })
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

func (s *Server) free(cl *client, id uint64, f *helperpb.Free) *helperpb.Response {
	if s.endImport(cl, f.AllocId) {
		return okResp(id)
	}
	cl.mu.Lock()
	al, er := s.ownAlloc(cl, id, f.AllocId)
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
	if s.handOver(cl, al) {
		return okResp(id)
	}
	s.mu.Lock()
	s.reg.disown(al.id)
	s.mu.Unlock()
	if err := al.dev.Release(al.handle); err != nil {
		cl.log.Warn("release failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "%v", err)
	}
	return okResp(id)
}

// stallReattach is the injected fault "stall-reattach", for the tests of a
// process that goes while it reattaches (JAX's crashed inside the driver
// there on the GPU machine): the Hello reply waits, up to a minute, until
// the process closes its calls connection.
func stallReattach(c *conn, cl *client) {
	cl.log.Warn("injected fault: stalling the reattach (GPUCR_FAULT=stall-reattach)")
	if c.waitPeerClosed(time.Minute) {
		cl.log.Warn("injected fault: the client closed its connection; the stall ends")
	}
}

// watchProcess drops a connected client whose process exits: its
// connections are hung up, which ends its calls connection (and so the
// client) even where another process still holds that socket. Until then,
// nothing done for the client can reach a process that reuses its pid. It
// returns when served is closed (the calls connection's handler has ended).
func (cl *client) watchProcess(served <-chan struct{}) {
	p := cl.process()
	select {
	case <-p.Exited():
		cl.log.Info("the client's process has exited; dropping it", zap.Stringer("process", p))
		cl.hangUp()
	case <-served:
	}
}

// livePid is the pid of cl's process to act on (the driver's checkpoint
// calls name processes by pid), while that process runs; once it is gone, a
// *proc.GoneError: its pid may name another process by now.
func (cl *client) livePid() (int, error) {
	p := cl.process()
	if err := p.Check(); err != nil {
		return 0, err
	}
	return int(p.Pid()), nil
}

// identityErr says why cl's process is no longer its registered user's
// alone (nil: it is): it exec'd a set-user-ID or set-group-ID program (its
// pidfd names the process still), or made itself undumpable. Its user may
// then neither read its memory nor act on it (ptrace's rule: every uid and
// gid its, and dumpable), and so may not through the helper either. Root's
// clients are not looked at: only root may act on them, and root on any
// process.
func (cl *client) identityErr() error {
	cl.mu.Lock()
	uid, gid := cl.uid, cl.gid
	cl.mu.Unlock()
	if uid == 0 {
		return nil
	}
	c, err := cl.process().Creds()
	if err != nil {
		return fmt.Errorf("what process %d runs as: %w", cl.pid, err)
	}
	if !c.RunsOnlyAs(uid, gid) {
		return fmt.Errorf("process %d no longer runs as uid %d (gid %d) alone, which it registered as, nor may its user read its memory (%v): "+
			"it exec'd a set-user-ID or set-group-ID program, or made itself undumpable; only root may act on it", cl.pid, uid, gid, c)
	}
	return nil
}

// identityFor is how long Status shows what it last saw of what a
// client's process runs as: its look costs some tens of microseconds a
// client, and a flood of Status builds them back to back.
const identityFor = time.Second

// identityShown says, for Status, whether cl's process runs as another
// identity than its own (identityErr), as seen within identityFor.
func (cl *client) identityShown() bool {
	cl.mu.Lock()
	if time.Since(cl.identityAt) < identityFor {
		defer cl.mu.Unlock()
		return cl.identitySeen
	}
	cl.mu.Unlock()
	err := cl.identityErr()
	other := err != nil && !errors.Is(err, proc.ErrGone)
	cl.mu.Lock()
	cl.identityAt, cl.identitySeen = time.Now(), other
	cl.mu.Unlock()
	return other
}

// onLive runs f (a driver call) on the pid of cl's process, if that process
// still runs.
func (cl *client) onLive(f func(pid int) error) error {
	pid, err := cl.livePid()
	if err != nil {
		return err
	}
	return f(pid)
}

// closeProc lets a client's process go once the client is gone.
func (cl *client) closeProc() { cl.process().Close() }

// dropClient forgets a client whose calls connection closed and releases
// every allocation it had; one detaching for a dump is parked instead.
func (s *Server) dropClient(cl *client) {
	if s.callsClosed(cl) {
		return // the client closes its control connection itself
	}
	// The client leaves the status list only after its memory is released,
	// so that whoever sees it gone also sees the memory back.
	defer s.unregister(cl)
	defer cl.closeProc()
	cl.mu.Lock()
	ctrl := cl.ctrl
	cl.mu.Unlock()
	if ctrl != nil {
		ctrl.conn.Close()
	}
	n, bytes, failed := s.freeAllocs(cl)
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
func (s *Server) release(cl *client) {
	if cl.fire(evReleased) != nil {
		return
	}
	s.states.drop(cl.pid)
	s.freeAllocs(cl)
	cl.closeProc()
}

// freeAllocs releases every allocation of cl: n of them, of bytes in all,
// failed of which the driver refused (logged).
func (s *Server) freeAllocs(cl *client) (n int, bytes uint64, failed int) {
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
	s.mu.Lock()
	s.reg.sh.dropImporter(cl)
	s.mu.Unlock()
	for _, al := range allocs {
		if s.handOver(cl, al) {
			continue
		}
		s.mu.Lock()
		s.reg.disown(al.id)
		s.mu.Unlock()
		if err := al.dev.Release(al.handle); err != nil {
			failed++
			cl.log.Warn("release failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		}
	}
	return len(allocs), bytes, failed
}

// hangUp closes the helper's side of a detached client's connections. The
// client closes its own side when it detaches, but a process it forked may
// still hold copies of those sockets (the interposer drops them in forked
// children; anything else that keeps one would keep the helper from ever
// seeing the close): closing them here parks the client now.
func (cl *client) hangUp() {
	cl.mu.Lock()
	calls, ctl := cl.calls, cl.ctrl
	cl.mu.Unlock()
	if calls != nil {
		calls.UnixConn().Close()
	}
	if ctl != nil {
		ctl.conn.UnixConn().Close()
	}
}

// reimportEntries: the client's mapped allocations in id order, with a new
// fd each (the caller closes them). Allocations never mapped are skipped.
func (s *Server) reimportEntries(cl *client) ([]*helperpb.ReimportEntry, []int, error) {
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
	for _, e := range s.importEntries(cl) {
		if err := add(e.al, e.address); err != nil {
			return nil, nil, err
		}
	}
	return ents, fds, nil
}
