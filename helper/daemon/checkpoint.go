package daemon

import (
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// cudaBacked is a Device with a real (or simulated) driver device behind it:
// only those can be copied by the engines and checkpointed.
type cudaBacked interface{ CUDA() *cuda.Device }

// defaultQuiesce bounds the quiesce of a Checkpoint whose timeout_ms is 0.
const defaultQuiesce = 10 * time.Second

// driverLockTimeoutMs bounds cuCheckpointProcessLock: the process is
// quiesced and drained by then, so the lock has nothing to wait for.
const driverLockTimeoutMs = 10000

// phases times the steps of a checkpoint or resume for the reply and log.
type phases struct {
	list  []*helperpb.Phase
	start time.Time
	last  time.Time
}

func newPhases() *phases { now := time.Now(); return &phases{start: now, last: now} }

func (p *phases) done(name string) {
	now := time.Now()
	p.list = append(p.list, &helperpb.Phase{Name: name, Seconds: now.Sub(p.last).Seconds()})
	p.last = now
}

// ran records a step that ran alongside the others (its own duration d).
func (p *phases) ran(name string, d time.Duration) {
	p.list = append(p.list, &helperpb.Phase{Name: name, Seconds: d.Seconds()})
	p.last = time.Now()
}

// undo is one step that was done and how to take it back.
type undo struct {
	name string
	fn   func() error
}

// checkpoint runs a Checkpoint request; see helper.proto.
func (s *Server) checkpoint(c *conn, id uint64, req *helperpb.Checkpoint) *helperpb.Response {
	cl, refused := s.controlledClient(c, id, req.Pid, "checkpoint")
	if refused != nil {
		return refused
	}
	if req.ImageDir == "" {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "no image directory")
	}
	dir, refused := s.checkpointDir(c, id, req)
	if refused != nil {
		return refused
	}
	defer dir.Close()
	quiesce := defaultQuiesce
	if req.TimeoutMs > 0 {
		quiesce = time.Duration(req.TimeoutMs) * time.Millisecond
	}
	wait := quiesce + opGrace
	log := cl.log.With(zap.String("image", req.ImageDir), zap.Bool("leave_running", req.LeaveRunning))
	reply := &helperpb.CheckpointReply{}
	var failed *helperpb.Response
	err := cl.withControl(wait, func(ctl *control) error {
		failed = s.checkpointLocked(c, cl, ctl, id, req, dir, quiesce, wait, reply, log)
		return nil
	})
	switch {
	case errors.Is(err, errBusy):
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "client %d: another control operation is in progress", cl.pid)
	case err != nil:
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "client %d: %v", cl.pid, err)
	case failed != nil:
		return failed
	}
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Checkpoint{Checkpoint: reply}}
}

func (s *Server) checkpointLocked(c *conn, cl *client, ctl *control, id uint64, req *helperpb.Checkpoint, dir *os.File, quiesce, wait time.Duration,
	reply *helperpb.CheckpointReply, log *zap.Logger) *helperpb.Response {
	ph := newPhases()
	var undos []undo
	// fail undoes every step done so far, newest first, so that the process
	// runs again with all its memory; what cannot be undone is logged.
	fail := func(code helperpb.ErrorCode, format string, args ...any) *helperpb.Response {
		msg := fmt.Sprintf(format, args...)
		for i := len(undos) - 1; i >= 0; i-- {
			if err := undos[i].fn(); err != nil {
				log.Error("undo after a failed checkpoint failed", zap.String("step", undos[i].name), zap.Error(err))
				msg += fmt.Sprintf("; undo %s failed too: %v", undos[i].name, err)
			}
		}
		log.Warn("checkpoint failed", zap.String("error", msg))
		return errResp(id, code, "checkpoint of pid %d: %s", cl.pid, msg)
	}
	if _, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Quiesce{Quiesce: &helperpb.Quiesce{
		TimeoutMs: uint32(quiesce / time.Millisecond)}}}, wait); err != nil {
		return fail(helperpb.ErrorCode_ERROR_TIMEOUT, "quiesce: %v", err)
	}
	resume := func() error {
		_, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Resume{Resume: &helperpb.Resume{}}}, wait)
		if err == nil {
			err = cl.fire(evResumed)
		}
		return err
	}
	undos = append(undos, undo{"resume", resume})
	if err := cl.fire(evQuiesced); err != nil {
		return fail(helperpb.ErrorCode_ERROR_STATE, "quiesce: %v", err)
	}
	ph.done("quiesce")
	if _, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Drain{Drain: &helperpb.Drain{}}}, wait); err != nil {
		return fail(helperpb.ErrorCode_ERROR_DRIVER, "drain: %v", err)
	}
	ph.done("drain")
	nth := s.nCkpt.Add(1)
	if s.faultAt("stall-copy", nth) {
		// For the tests that kill the helper, or CRIU, mid-dump: the
		// process is quiesced and drained, its memory still mapped. The
		// stall ends early when the requester hangs up (CRIU killed), as
		// a long copy would end, and the checkpoint goes on.
		log.Warn("injected fault: stalling before the copy (GPUCR_FAULT=stall-copy)")
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if c.peerClosed() {
				log.Warn("injected fault: the requester closed its connection; the stall ends")
				break
			}
		}
	}
	snap, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Snapshot{Snapshot: &helperpb.Snapshot{}}}, wait)
	if err != nil {
		return fail(helperpb.ErrorCode_ERROR_UNAVAILABLE, "snapshot: %v", err)
	}
	table := snap.GetTable()
	if len(table.GetNotCheckpointable()) > 0 {
		return fail(helperpb.ErrorCode_ERROR_STATE, "not checkpointable: %v", table.GetNotCheckpointable())
	}
	regions, rerr := s.regions(cl, table)
	if rerr != nil {
		return fail(helperpb.ErrorCode_ERROR_STATE, "%v", rerr)
	}

	// The image the GPU data goes into.
	origin := image.Origin{Pid: int(cl.pid), Time: time.Now()}
	origin.Host, _ = os.Hostname()
	if len(regions) > 0 {
		d := regions[0].Device
		origin.GPUModel, origin.GPUUUID = d.Name, d.UUID
	}
	opts := image.Options{Parent: req.Parent}
	if req.Compress {
		opts.Compression = image.CompressionZstd
	}
	w, err := s.imageWriter(c, dir, req, origin, opts) // the caller's image, beneath dir (imagedir.go)
	if err != nil {
		return fail(imageErrCode(err), "image: %v", err)
	}
	abortImage := func() {
		if !req.DeferCommit {
			_ = w.Abort()
		} // a shared writer is dropped by CommitImage{abort} or when the connection closes
	}
	// Recorded even without buffers: its restore must know it (a process
	// may hold a driver context and no device memory).
	if err := w.AddProcess(int(cl.pid), int(nsPid(cl.pid))); err != nil {
		abortImage()
		return fail(helperpb.ErrorCode_ERROR_BAD_REQUEST, "image: %v", err)
	}

	// The GPU data into the image first, while the process still holds its
	// memory: should this helper die during the copy, the process keeps
	// running on it (its control connection closes while it is quiesced, and
	// it resumes by itself). The copy reads through the helper's own view.
	bytes := engine.TotalSize(regions)
	tr := s.transfers.beginFor(c.cred.Uid, w.Dir(), true, bytes, []int64{int64(cl.pid)})
	err = engine.Dump(regions, w, image.DefaultChunkSize, engine.Options{Progress: tr.progress})
	tr.finish(err)
	if err != nil {
		abortImage()
		return fail(helperpb.ErrorCode_ERROR_DRIVER, "copy to the image: %v", err)
	}
	ph.done("copy")
	// Then what a new helper needs to give the process its memory back, if
	// this one dies after the process gave it up: the process's part of the
	// image, stored before the drop (the image itself is committed later:
	// for a dump, once the whole tree is dumped).
	if err := w.SealProcess(int(cl.pid)); err != nil {
		abortImage()
		return fail(helperpb.ErrorCode_ERROR_DRIVER, "image: %v", err)
	}

	// From the drop on, the process's memory lives only in this helper and
	// in the image. Should the helper die, the next one finds the process
	// here and gives it its memory back from the image (adopt.go); the
	// wake file (relative to the socket's directory: the client resolves it
	// against its own path to the socket, which differs inside a container)
	// is how it tells the process.
	_ = os.Remove(s.wakePath(cl.pid))
	wake := s.wakeName(cl.pid)
	if err := s.saveDetachState(cl.pid, w.Dir(), w.ID()); err != nil {
		log.Warn("cannot record the dropped process; a helper restart would lose it", zap.Error(err))
	}
	undos = append(undos, undo{"forget the recorded process", func() error { s.dropDetachState(cl.pid); return nil }})
	// The driver's checkpoint must see no imported memory (it fails to
	// restore a process that kept imported memory mapped: 801).
	if _, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Drop{Drop: &helperpb.Drop{WakePath: wake}}}, wait); err != nil {
		abortImage()
		return fail(helperpb.ErrorCode_ERROR_DRIVER, "drop: %v", err)
	}
	undos = append(undos, undo{"reimport", func() error { return s.reimportErr(cl, ctl, wait) }})
	if err := cl.fire(evDropped); err != nil {
		abortImage()
		return fail(helperpb.ErrorCode_ERROR_STATE, "drop: %v", err)
	}
	ph.done("drop")

	if req.Detach {
		// The client closes its connections and waits for its wake file:
		// CRIU must not find a socket connected to the helper.
		if err := cl.fire(evDetach); err != nil {
			abortImage()
			return fail(helperpb.ErrorCode_ERROR_UNAVAILABLE, "detach: %v", err)
		}
		if _, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Detach{Detach: &helperpb.Detach{WakePath: wake}}}, wait); err != nil {
			if s.parkedWithin(cl, time.Second) {
				// It detached all the same: the way back is the wake file.
				undos = []undo{{"wake and give back", func() error { return s.wakeAndGiveBack(cl) }}}
			} else {
				_ = cl.fire(evDetachFailed) // an illegal transition is logged
			}
			abortImage()
			return fail(helperpb.ErrorCode_ERROR_UNAVAILABLE, "detach: %v", err)
		}
		// From here on the way back goes through the wake file.
		undos = []undo{{"wake and give back", func() error { return s.wakeAndGiveBack(cl) }}}
		cl.hangUp()
		if !s.parkedWithin(cl, 2*time.Second) {
			log.Warn("a detached client did not leave its connections within 2 s")
		}
		ph.done("detach")
	}

	if err := s.driverCheckpoint(int(cl.pid), nth, ph, &undos); err != nil {
		abortImage()
		return fail(helperpb.ErrorCode_ERROR_DRIVER, "%v", err)
	}
	if !req.DeferCommit {
		if err := w.Commit(); err != nil {
			return fail(helperpb.ErrorCode_ERROR_DRIVER, "commit the image: %v", err)
		}
		ph.done("commit")
	}
	st := w.Stats()
	reply.Buffers, reply.Bytes, reply.StoredBytes = uint64(len(regions)), bytes, uint64(st.BytesStored)
	reply.State = helperpb.ClientState_CLIENT_STATE_DROPPED
	if req.LeaveRunning {
		if err := s.thaw(cl, ctl, wait, ph); err != nil {
			return fail(helperpb.ErrorCode_ERROR_DRIVER, "leave running: %v", err)
		}
		reply.State = helperpb.ClientState_CLIENT_STATE_RUNNING
	}
	reply.Phases = ph.list
	reply.TotalSeconds = time.Since(ph.start).Seconds()
	log.Info("checkpoint done", zap.Uint64("bytes", reply.Bytes), zap.Uint64("stored", reply.StoredBytes),
		zap.Float64("seconds", reply.TotalSeconds))
	return nil
}

// driverCheckpoint locks pid in the driver and checkpoints its residual
// context (the process is quiesced, drained and dropped), adding the undo of
// each step that succeeded to undos.
func (s *Server) driverCheckpoint(pid int, nth uint64, ph *phases, undos *[]undo) error {
	if s.faultAt("driver-lock", nth) {
		return errors.New("driver lock: injected fault (GPUCR_FAULT)")
	}
	if err := cuda.CheckpointLock(pid, driverLockTimeoutMs); err != nil {
		return fmt.Errorf("driver lock: %w", err)
	}
	*undos = append(*undos, undo{"driver unlock", func() error { return cuda.CheckpointUnlock(pid) }})
	ph.done("driver-lock")
	if s.faultAt("driver-checkpoint", nth) {
		return errors.New("driver checkpoint: injected fault (GPUCR_FAULT)")
	}
	if err := cuda.CheckpointCheckpoint(pid); err != nil {
		return fmt.Errorf("driver checkpoint: %w", err)
	}
	*undos = append(*undos, undo{"driver restore", func() error { return cuda.CheckpointRestore(pid) }})
	ph.done("driver-checkpoint")
	return nil
}

// faultAt reports whether Config.Fault injects step into the nth checkpoint.
func (s *Server) faultAt(step string, nth uint64) bool {
	f := s.cfg.Fault
	return f == step || f == fmt.Sprintf("%s@%d", step, nth)
}

// resumeCheckpointed runs a ResumeCheckpointed request.
func (s *Server) resumeCheckpointed(c *conn, id uint64, req *helperpb.ResumeCheckpointed) *helperpb.Response {
	cl, refused := s.controlledClient(c, id, req.Pid, "resume")
	if refused != nil {
		return refused
	}
	state, err := cuda.CheckpointState(int(cl.pid))
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "pid %d: %v", cl.pid, err)
	}
	if state != cuda.StateCheckpointed {
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "pid %d is %s, not checkpointed", cl.pid, state)
	}
	ph := newPhases()
	err = cl.withControl(s.cfg.OpTimeout, func(ctl *control) error { return s.thaw(cl, ctl, s.cfg.OpTimeout, ph) })
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "resume pid %d: %v", cl.pid, err)
	}
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Checkpoint{Checkpoint: &helperpb.CheckpointReply{
		Phases: ph.list, TotalSeconds: time.Since(ph.start).Seconds(), State: helperpb.ClientState_CLIENT_STATE_RUNNING}}}
}

// regions turns a client's buffer table into what the engine copies: every
// allocation must be one the helper made for this client, mapped, on a
// device the engines can reach.
func (s *Server) regions(cl *client, table *helperpb.BufferTable) ([]engine.Region, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []engine.Region
	for _, a := range table.GetAllocations() {
		al := cl.allocs[a.AllocId]
		if al == nil {
			return nil, fmt.Errorf("the client lists allocation %d, which the helper does not know", a.AllocId)
		}
		cb, ok := al.dev.(cudaBacked)
		if !ok {
			return nil, fmt.Errorf("allocation %d: its device has no driver behind it", a.AllocId)
		}
		if a.Address == 0 {
			return nil, fmt.Errorf("allocation %d is not mapped", a.AllocId)
		}
		out = append(out, engine.Region{Device: cb.CUDA(), Handle: cuda.Handle(al.handle), Size: al.size,
			Pid: int(cl.pid), NsPid: int(nsPid(cl.pid)), Address: a.Address, Kind: imageKind(a.Kind), Flags: al.flags})
	}
	return out, nil
}

// allocKinds pairs the protocol's allocation kinds with the image's; every
// other protocol kind (slabs) is image.AllocOther, which comes back as a slab.
var allocKinds = []struct {
	proto helperpb.AllocKind
	image image.AllocKind
}{
	{helperpb.AllocKind_ALLOC_KIND_MEM_ALLOC, image.AllocMemAlloc},
	{helperpb.AllocKind_ALLOC_KIND_PITCH, image.AllocPitch},
	{helperpb.AllocKind_ALLOC_KIND_ASYNC, image.AllocAsync},
	{helperpb.AllocKind_ALLOC_KIND_VMM, image.AllocVMM},
}

func imageKind(k helperpb.AllocKind) image.AllocKind {
	for _, p := range allocKinds {
		if p.proto == k {
			return p.image
		}
	}
	return image.AllocOther
}

func protoKind(k image.AllocKind) helperpb.AllocKind {
	for _, p := range allocKinds {
		if p.image == k {
			return p.proto
		}
	}
	return helperpb.AllocKind_ALLOC_KIND_SLAB
}
