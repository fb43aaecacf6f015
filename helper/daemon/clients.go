package daemon

// An interposer's calls connection: the client it registers (or the waiting
// one it reattaches), its allocations (Alloc, Mapped, Free), and what its
// close releases. Its control connection is in control.go, its lifecycle in
// lifecycle.go.

import (
	"errors"
	"fmt"
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
	// served: its driver is served mode's library (Hello.served, said
	// again at each reattach), and servedResidual where its residual
	// context is (residual.go: servedResidual).
	served         atomic.Bool
	servedResidual atomic.Int32
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
	// Guarded by the registry's mu.
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
		if cl = s.reg.reattach(p, h.ClientToken); cl == nil {
			p.Close()
			_ = c.send(errResp(helloID, helperpb.ErrorCode_ERROR_NOT_FOUND,
				"no detached or restored process with pid %d and this token", c.cred.Pid), nil)
			return
		}
		cl.mu.Lock()
		cl.uid, cl.gid, cl.program = c.cred.Uid, c.cred.Gid, program
		cl.mu.Unlock()
		cl.served.Store(h.Served)
		cl.log.Info("client reattached")
		if s.cfg.Fault.Is(fault.StallReattach) {
			stallReattach(c, cl)
		}
	} else {
		cl = newClient(s.log, p, c.cred.Uid, c.cred.Gid, program)
		cl.served.Store(h.Served)
		s.reg.connect(cl)
		cl.log.Info("client registered", zap.String("held_by", p.HeldBy()))
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
	defer s.mem.dropClient(cl)
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
			resp, fd = s.mem.alloc(cl, req.Id, b.Alloc)
		case *helperpb.Request_Mapped:
			resp = s.mem.mapped(cl, req.Id, b.Mapped)
		case *helperpb.Request_Free:
			resp = s.mem.free(cl, req.Id, b.Free)
		case *helperpb.Request_Export:
			resp, fd = s.mem.export(cl, req.Id, b.Export)
		case *helperpb.Request_ImportPeer:
			resp = s.mem.importPeer(c, cl, req.Id)
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
