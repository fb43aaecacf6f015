package daemon

// Clients that are not connected but whose memory the helper keeps: detached
// for a CRIU dump (Checkpoint with detach), or restored from an image
// (PrepareRestore) and waiting for the restored process to come back. Such a
// client waits in Server.waiting (by pid) until it reattaches: a calls Hello
// from the same pid, with its old token (detached) or any token (restored);
// then, when its control connection is up, onAttach gives it its memory back.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// reattachTimeout bounds how long DumpDone waits for a woken process.
const reattachTimeout = 60 * time.Second

// wakePath is the file whose existence tells a detached client of pid to
// reconnect: next to the socket, so a container that can reach the socket can
// reach it too.
func (s *Server) wakePath(pid int32) string {
	return filepath.Join(filepath.Dir(s.cfg.Socket), s.wakeName(pid))
}

// wakeName is wakePath relative to the socket's directory (what Detach sends).
func (s *Server) wakeName(pid int32) string {
	return filepath.Join("wake", strconv.Itoa(int(pid)))
}

func (s *Server) wake(pid int32) error { return s.wakeWith(pid, "") }

// wakeWith creates pid's wake file with content msg: empty means "come
// back", "lost: why" that its GPU state is gone (orphan.go). Written under
// another name and renamed: the client reads it as soon as it exists.
func (s *Server) wakeWith(pid int32, msg string) error {
	p := s.wakePath(pid)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".tmp")
	if err := os.WriteFile(tmp, []byte(msg), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// reattach finds the waiting client a calls Hello with a token comes from,
// and takes it out of the waiting list.
func (s *Server) reattach(pid int32, token uint64) *client {
	s.mu.Lock()
	defer s.mu.Unlock()
	cl := s.waiting[pid]
	if cl == nil || (!cl.restored && cl.token != token) {
		return nil
	}
	delete(s.waiting, pid)
	if cl.restored {
		cl.token = token
	}
	cl.detached = false
	s.byToken[cl.token] = cl
	s.byPID[cl.pid] = cl
	_ = os.Remove(s.wakePath(pid))
	if cl.wakeAs != 0 {
		_ = os.Remove(s.wakePath(cl.wakeAs))
	}
	return cl
}

// park moves a detached client whose connections closed to the waiting list
// instead of releasing its memory. It reports whether it did.
func (s *Server) park(cl *client) bool {
	cl.mu.Lock()
	detached := cl.detached
	cl.mu.Unlock()
	if !detached {
		return false
	}
	s.mu.Lock()
	delete(s.byToken, cl.token)
	if s.byPID[cl.pid] == cl {
		delete(s.byPID, cl.pid)
	}
	s.waiting[cl.pid] = cl
	s.mu.Unlock()
	cl.log.Info("client detached; its memory is kept until the dump ends")
	return true
}

// release gives back every allocation of cl (it is gone for good).
func (s *Server) release(cl *client) {
	s.dropDetachState(cl.pid)
	cl.mu.Lock()
	allocs := cl.allocs
	cl.allocs = map[uint64]*alloc{}
	cl.bytes = 0
	cl.mu.Unlock()
	for _, al := range allocs {
		s.mu.Lock()
		delete(s.owner, al.id)
		s.mu.Unlock()
		if err := al.dev.Release(al.handle); err != nil {
			cl.log.Warn("release failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		}
	}
}

// giveBack is what a reattached client gets: optionally the driver restore
// of its residual context, then its memory, then the gate opened.
func (s *Server) giveBack(cl *client, driverRestore bool, done chan<- error) {
	err := cl.withControl(s.cfg.OpTimeout, func(ctl *control) error {
		if driverRestore {
			return s.thaw(cl, ctl, s.cfg.OpTimeout, newPhases())
		}
		return s.reimportResume(cl, ctl, s.cfg.OpTimeout, nil)
	})
	if err != nil {
		cl.log.Error("giving a reattached client its GPU back failed", zap.Error(err))
	} else {
		cl.log.Info("reattached client runs again")
	}
	if done != nil {
		done <- err
	}
}

// dumpDone runs a DumpDone request.
func (s *Server) dumpDone(id uint64, req *helperpb.DumpDone) *helperpb.Response {
	s.mu.Lock()
	cl := s.waiting[int32(req.Pid)]
	if cl != nil && !req.Alive {
		delete(s.waiting, cl.pid)
	}
	s.mu.Unlock()
	if cl == nil || cl.restored {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no detached client with pid %d", req.Pid)
	}
	if !req.Alive {
		s.release(cl)
		_ = os.Remove(s.wakePath(cl.pid))
		cl.log.Info("dumped process is gone; its memory is released")
		return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
	}
	// Alive (--leave-running, or the dump failed): the driver state first,
	// while nothing in the process can touch the GPU, then wake it.
	pid := int(cl.pid)
	if err := driverResume(pid); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "pid %d: %v", pid, err)
	}
	done := make(chan error, 1)
	cl.mu.Lock()
	cl.onAttach = func() { s.giveBack(cl, false, done) }
	cl.mu.Unlock()
	if err := s.wake(cl.pid); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "pid %d: wake file: %v", pid, err)
	}
	select {
	case err := <-done:
		if err != nil {
			return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "pid %d: %v", pid, err)
		}
	case <-time.After(reattachTimeout):
		return errResp(id, helperpb.ErrorCode_ERROR_TIMEOUT, "pid %d did not reattach within %v", pid, reattachTimeout)
	}
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
}

// restoreLoad is the load of one PrepareRestore's image into the memory it
// made, running while CRIU restores the processes.
type restoreLoad struct {
	done chan struct{} // closed when the load has ended
	err  error         // its result; read only after done
}

// wait blocks until the load has ended and returns its error.
func (l *restoreLoad) wait() error {
	if l == nil {
		return nil
	}
	<-l.done
	return l.err
}

// prepareRestore runs a PrepareRestore request. Everything that can refuse
// the restore cheaply is checked before it answers, while nothing has been
// changed: the manifest, every chunk file's presence and size, a GPU for
// every buffer, and new helper memory for each (out of memory refuses it).
// Then it answers and fills that memory from the image in the background, so
// that the GPU data moves while CRIU restores the CPU side; Restored waits for
// the load. Damage inside a chunk file is only found by that load: Restored
// then fails, and the plugin kills the restored process (see restored).
func (s *Server) prepareRestore(id uint64, req *helperpb.PrepareRestore) (*helperpb.Response, []int32) {
	im, err := image.Open(req.ImageDir)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "GPU image: %v", err), nil
	}
	if err := im.CheckFiles(); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "GPU image: %v", err), nil
	}
	plan, e := s.planRestore(im, req.ImageDir, 0)
	if e != nil {
		return &helperpb.Response{Id: id, Error: e}, nil
	}
	if e := s.register(plan); e != nil {
		return &helperpb.Response{Id: id, Error: e}, nil
	}
	go s.runLoad(plan)
	return okResp(id), plan.pids()
}

// restorePlan is the helper memory made for (part of) an image, waiting to be
// filled by its load and claimed by the restored processes.
type restorePlan struct {
	im      *image.Image
	dir     string
	byPid   map[int]*client
	regions []engine.Region
	bufs    []int // image buffer of each region
	made    []*alloc
	load    *restoreLoad
}

func (p *restorePlan) undo() {
	for _, al := range p.made {
		_ = al.dev.Release(al.handle)
	}
}

func (p *restorePlan) pids() []int32 {
	var pids []int32
	for pid := range p.byPid {
		pids = append(pids, int32(pid))
	}
	return pids
}

// planRestore makes new helper memory for every buffer of im (only those of
// pid only, if not 0), each on the same GPU if it is here, else the same
// ordinal; nothing is kept if any of it fails.
func (s *Server) planRestore(im *image.Image, dir string, only int) (*restorePlan, *helperpb.Error) {
	p := &restorePlan{im: im, dir: dir, byPid: map[int]*client{}, load: &restoreLoad{done: make(chan struct{})}}
	fail := func(code helperpb.ErrorCode, format string, a ...any) (*restorePlan, *helperpb.Error) {
		p.undo()
		return nil, &helperpb.Error{Code: code, Message: fmt.Sprintf(format, a...)}
	}
	newClient := func(pid, ns int) *client {
		cl := p.byPid[pid]
		if cl == nil {
			cl = &client{pid: int32(pid), allocs: map[uint64]*alloc{}, state: helperpb.ClientState_CLIENT_STATE_DROPPED,
				opSem: make(chan struct{}, 1), restored: true, nsPid: int32(ns), wakeAs: int32(pid), load: p.load}
			cl.log = s.log.With(zap.Int32("pid", cl.pid), zap.String("restored_from", dir))
			p.byPid[pid] = cl
		}
		return cl
	}
	// Every process, also those without buffers: they wait to be woken too.
	for _, pr := range im.Processes() {
		if only == 0 || pr.Pid == only {
			newClient(pr.Pid, pr.NsPid)
		}
	}
	for i, b := range im.Buffers() {
		if only != 0 && b.Pid != only {
			continue
		}
		dev := s.deviceFor(b)
		if dev == nil {
			return fail(helperpb.ErrorCode_ERROR_NOT_FOUND, "buffer %d (pid %d, 0x%x): no GPU %s (ordinal %d) here", i, b.Pid, b.Address, b.GPUUUID, b.Device)
		}
		cb, ok := dev.(cudaBacked)
		if !ok {
			return fail(helperpb.ErrorCode_ERROR_STATE, "buffer %d: device has no driver behind it", i)
		}
		h, err := dev.Create(b.Size)
		if err != nil {
			var oom OutOfMemory
			if errors.As(err, &oom) && oom.OutOfMemory() {
				return fail(helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "buffer %d (%d bytes): %v", i, b.Size, err)
			}
			return fail(helperpb.ErrorCode_ERROR_DRIVER, "buffer %d: %v", i, err)
		}
		al := &alloc{id: s.nextAlloc.Add(1), handle: h, size: b.Size, address: b.Address, dev: dev, kind: protoKind(b.Kind)}
		p.made = append(p.made, al)
		cl := newClient(b.Pid, b.NsPid)
		cl.allocs[al.id] = al
		cl.bytes += al.size
		p.regions = append(p.regions, engine.Region{Device: cb.CUDA(), Handle: cuda.Handle(h), Size: b.Size, Pid: b.Pid,
			Address: b.Address, Kind: b.Kind})
		p.bufs = append(p.bufs, i)
	}
	if only != 0 && len(p.byPid) == 0 {
		return fail(helperpb.ErrorCode_ERROR_NOT_FOUND, "the GPU image in %s has no process %d", dir, only)
	}
	return p, nil
}

// register makes the plan's processes waiting clients (the memory is theirs
// from now on); a pid the helper already serves refuses it all.
func (s *Server) register(p *restorePlan) *helperpb.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid := range p.byPid {
		if s.waiting[int32(pid)] != nil || s.byPID[int32(pid)] != nil {
			p.undo()
			return &helperpb.Error{Code: helperpb.ErrorCode_ERROR_STATE, Message: fmt.Sprintf("pid %d is already a client of this helper", pid)}
		}
	}
	for pid, cl := range p.byPid {
		s.waiting[int32(pid)] = cl
		for aid := range cl.allocs {
			s.owner[aid] = cl
		}
	}
	return nil
}

// runLoad fills the plan's memory from its image and ends its load.
func (s *Server) runLoad(p *restorePlan) {
	start := time.Now()
	bytes := engine.TotalSize(p.regions)
	var pids []int64
	for pid := range p.byPid {
		pids = append(pids, int64(pid))
	}
	tr := s.transfers.begin(p.dir, false, bytes, pids)
	p.load.err = engine.Load(p.regions, p.im, p.bufs, engine.Options{Progress: tr.progress})
	tr.finish(p.load.err)
	took := time.Since(start)
	if p.load.err != nil {
		s.log.Error("loading the GPU image for a restore failed", zap.String("image", p.dir), zap.Error(p.load.err))
	} else {
		s.log.Info("GPU image loaded for restore", zap.String("image", p.dir), zap.Int("buffers", len(p.regions)),
			zap.Uint64("bytes", bytes), zap.Duration("took", took),
			zap.Float64("gb_per_s", float64(bytes)/1e9/max(took.Seconds(), 1e-9)))
	}
	close(p.load.done)
}

// restored runs a Restored request: the restored process will reattach
// once CRIU lets it run; then it gets its driver state and memory back.
//
// Why the driver restore happens then, on the running process, and not in
// RESUME_DEVICES_LATE while CRIU still holds the tasks ptrace-stopped: the
// driver's restore needs the process's own restore thread to run, which in
// RESUME_DEVICES_LATE means resuming one traced thread from inside CRIU's
// tracer and interrupting it again. Once CRIU has let the process go, every
// thread of it that could touch the GPU is blocked (application threads at
// the interposer's closed gate, the control thread polling its wake file),
// while threads doing only CPU work and pinned host memory are the kernel's
// business and need nothing from us; the restore then needs no ptrace at all.
// Measured on the GPU machine (issue 5): the driver restore of the residual
// on the running, gated process works and takes 0.2-0.5 s.
func (s *Server) restored(id uint64, req *helperpb.Restored) *helperpb.Response {
	s.mu.Lock()
	cl := s.waiting[int32(req.Pid)]
	if cl == nil {
		// Restored into a new pid namespace (a container): another host
		// pid, but the same pid inside; the image recorded that one.
		if ns := nsPid(int32(req.Pid)); ns != 0 {
			for pid, w := range s.waiting {
				if w.restored && w.nsPid == ns && !processAlive(pid) {
					delete(s.waiting, pid)
					w.pid = int32(req.Pid)
					s.waiting[w.pid] = w
					cl = w
					break
				}
			}
		}
	}
	s.mu.Unlock()
	if cl == nil || !cl.restored {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no restored GPU memory for pid %d", req.Pid)
	}
	// The process may run only with all of its memory in place.
	if err := cl.load.wait(); err != nil {
		s.mu.Lock()
		if s.waiting[cl.pid] == cl {
			delete(s.waiting, cl.pid)
		}
		s.mu.Unlock()
		s.release(cl)
		code := helperpb.ErrorCode_ERROR_DRIVER
		if errors.Is(err, image.ErrCorrupt) {
			code = helperpb.ErrorCode_ERROR_BAD_REQUEST
		}
		return errResp(id, code, "pid %d: loading its GPU image: %v", req.Pid, err)
	}
	cl.mu.Lock()
	cl.onAttach = func() { s.giveBack(cl, true, nil) }
	cl.mu.Unlock()
	// Named after the pid it detached as: that is what it waits for.
	if err := s.wake(cl.wakeAs); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "pid %d: wake file: %v", req.Pid, err)
	}
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
}

// deviceFor finds the device an image buffer goes to: the same GPU (UUID)
// if it is here, else the same ordinal.
func (s *Server) deviceFor(b image.BufferInfo) Device {
	for _, d := range s.cfg.Devices {
		if d.Info().Uuid == b.GPUUUID {
			return d
		}
	}
	for _, d := range s.cfg.Devices {
		if int(d.Info().Ordinal) == b.Device {
			return d
		}
	}
	return nil
}

// reimportErr is reimport with the client's refusal turned into an error.
func (s *Server) reimportErr(cl *client, ctl *control, wait time.Duration) error {
	failed, err := s.reimport(cl, ctl, wait)
	if err == nil && failed != nil {
		err = fmt.Errorf("%s: %s", failed.Code, failed.Message)
	}
	return err
}

// reimportResume sends a client its memory and opens its gate; ph (if not
// nil) times the two steps.
func (s *Server) reimportResume(cl *client, ctl *control, wait time.Duration, ph *phases) error {
	if err := s.reimportErr(cl, ctl, wait); err != nil {
		return fmt.Errorf("reimport: %w", err)
	}
	if ph != nil {
		ph.done("reimport")
	}
	if _, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Resume{Resume: &helperpb.Resume{}}}, wait); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	cl.mu.Lock()
	cl.state = helperpb.ClientState_CLIENT_STATE_RUNNING
	cl.mu.Unlock()
	s.dropDetachState(cl.pid) // its memory is its own again
	if ph != nil {
		ph.done("resume")
	}
	return nil
}

// giveBackLocked is giveBack without taking the client's control exchange,
// for a caller that holds it already (a failing checkpoint's undo).
func (s *Server) giveBackLocked(cl *client) error {
	cl.mu.Lock()
	ctl := cl.ctrl
	cl.mu.Unlock()
	if ctl == nil {
		return errNoControl
	}
	return s.reimportResume(cl, ctl, s.cfg.OpTimeout, nil)
}

// dropUnrestored gives back the memory prepared for pids that never got a
// Restored (the restore failed, or CRIU died).
func (s *Server) dropUnrestored(pids []int32) {
	for _, pid := range pids {
		s.mu.Lock()
		cl := s.waiting[pid]
		s.mu.Unlock()
		if cl == nil {
			continue
		}
		_ = cl.load.wait() // the engines may still be writing into that memory
		s.mu.Lock()
		cl = s.waiting[pid]
		var drop bool
		if cl != nil && cl.restored {
			cl.mu.Lock()
			drop = cl.onAttach == nil && cl.token == 0
			cl.mu.Unlock()
		}
		if drop {
			delete(s.waiting, pid)
		}
		s.mu.Unlock()
		if drop {
			s.release(cl)
			cl.log.Info("restore did not finish; the GPU memory prepared for it is released")
		}
	}
}

// recoverDetached handles a detached client whose dump never reported its
// end (CRIU died): alive, it gets its GPU back as after --leave-running;
// gone, its memory is released.
func (s *Server) recoverDetached(pid int32) {
	s.mu.Lock()
	cl := s.waiting[pid]
	s.mu.Unlock()
	if cl == nil || cl.restored {
		return
	}
	alive := processAlive(pid)
	cl.log.Warn("the dump ended without a report (CRIU died?)", zap.Bool("process_alive", alive))
	if r := s.dumpDone(0, &helperpb.DumpDone{Pid: int64(pid), Alive: alive}); r.Error != nil {
		cl.log.Error("recovering the process after an unfinished dump failed", zap.String("error", r.Error.Message))
	}
}

// processAlive: pid exists and is not a zombie.
func processAlive(pid int32) bool {
	st, err := procStat(pid)
	return err == nil && st.alive()
}

// procStatus is what the helper reads of /proc/PID/stat.
type procStatus struct {
	state byte   // field 3: R, S, D, Z, X...
	start uint64 // field 22: start time in clock ticks after boot; tells a reused pid apart
}

func (p procStatus) alive() bool { return p.state != 'Z' && p.state != 'X' }

func procStat(pid int32) (procStatus, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStatus{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStatus{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:]) // field 3 onwards
	if len(f) < 20 || len(f[0]) != 1 {
		return procStatus{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStatus{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return procStatus{state: f[0][0], start: start}, nil
}

// nsPid is pid's pid in its own (innermost) pid namespace, from
// /proc/PID/status; 0 if unknown.
func nsPid(pid int32) int32 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "NSpid:" {
			n, _ := strconv.Atoi(f[len(f)-1])
			return int32(n)
		}
	}
	return 0
}
