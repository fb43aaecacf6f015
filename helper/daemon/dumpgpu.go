package daemon

// A Checkpoint: one client's GPU state into an image, in named steps
// (checkpointLocked), every step done undone if a later one fails; and
// ResumeCheckpointed, which gives a client that a checkpoint left dropped
// (--gpu-only, without --leave-running) its GPU back.

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/fault"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// defaultQuiesce bounds the quiesce of a Checkpoint whose timeout_ms is 0.
const defaultQuiesce = 10 * time.Second

// backgroundStall is how long the injected fault "stall-background" holds
// a background copy back: long enough for a test to watch the process run
// on meanwhile, or to kill the helper then.
const backgroundStall = 5 * time.Second

// backgroundLanes is how many lanes a snapshot's background copy uses per
// device: a quarter of the CPUs (at least 2). The process runs meanwhile,
// and each lane's thread spends its time writing the image: with one lane
// per CPU, a training job's steps (its Python thread, its DataLoader
// workers) took 1.25-1.48x their time on a 16-core H200 machine.
func (c *Config) backgroundLanes() int {
	if c.BackgroundLanes > 0 {
		return c.BackgroundLanes
	}
	return max(2, runtime.GOMAXPROCS(0)/4)
}

// driverLockTimeout bounds the residual context's lock: the process is
// quiesced and drained by then, so the lock has nothing to wait for.
const driverLockTimeout = 10 * time.Second

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

// doneSplit ends a step made of two: first took the first (at most the
// whole step), second the rest.
func (p *phases) doneSplit(first string, took time.Duration, second string) {
	now := time.Now()
	all := now.Sub(p.last)
	took = min(took, all)
	p.list = append(p.list, &helperpb.Phase{Name: first, Seconds: took.Seconds()},
		&helperpb.Phase{Name: second, Seconds: (all - took).Seconds()})
	p.last = now
}

// undo is one step that was done and how to take it back.
type undo struct {
	name string
	fn   func() error
}

// checkpoint runs a Checkpoint request; see helper.proto.
func (s *Server) checkpoint(c *conn, id uint64, req *helperpb.Checkpoint) *helperpb.Response {
	if a := s.groups.takeAhead(deferKey{c, req.ImageDir}, req.Pid); a != nil {
		// the first of its group's checkpoints into this image ran it ahead
		if f := c.takeFD(); f != nil {
			f.Close()
		}
		return a.response(id)
	}
	cl, refused := s.reg.controlledClient(c, id, req.Pid, "checkpoint")
	if refused != nil {
		if s.reg.dumpHolds(c, proc.Pid(req.Pid)) {
			// not "no client with pid N": a plugin takes that for a
			// process without GPU state, and dumps it as one
			return anotherCheckpoint(id, proc.Pid(req.Pid))
		}
		return refused
	}
	// One checkpoint of a client at a time. A second one waited for the
	// first's control exchange and then found the client detached for
	// the first's dump: "control connection is not connected".
	if !cl.checkpointing.CompareAndSwap(false, true) {
		return anotherCheckpoint(id, cl.pid)
	}
	defer cl.checkpointing.Store(false)
	if req.ImageDir == "" {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "no image directory")
	}
	dir, refused := checkpointDir(c, id, req)
	if refused != nil {
		return refused
	}
	defer dir.Close()
	o := checkpointOpts{req: req, id: id, requester: c, dir: dir, quiesce: defaultQuiesce}
	if req.TimeoutMs > 0 {
		o.quiesce = time.Duration(req.TimeoutMs) * time.Millisecond
	}
	o.wait = o.quiesce + opGrace
	o.log = cl.log.With(zap.String("image", req.ImageDir), zap.Bool("leave_running", req.LeaveRunning))
	var reply *helperpb.CheckpointReply
	var failed *helperpb.Response
	err := cl.withControl(o.wait, func(ctl *control) error {
		reply, failed = s.checkpointLocked(cl, ctl, o)
		return nil
	})
	switch {
	case (errors.Is(err, errNoControl) || errors.Is(err, errBusy)) && detachedForDump(cl.lifeState()):
		return anotherCheckpoint(id, cl.pid)
	case errors.Is(err, errBusy):
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "client %d: another control operation is in progress", cl.pid)
	case err != nil:
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "client %d: %v", cl.pid, err)
	case failed != nil:
		return failed
	}
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Checkpoint{Checkpoint: reply}}
}

// anotherCheckpoint refuses a checkpoint of pid while another one runs.
func anotherCheckpoint(id uint64, pid proc.Pid) *helperpb.Response {
	return errResp(id, helperpb.ErrorCode_ERROR_STATE, "another checkpoint of pid %d is running; try again once it has ended", pid)
}

// detachedForDump says whether a client in state st is held by a CRIU
// dump: a checkpoint detached it, and the dump has not ended.
func detachedForDump(st lifeState) bool { return st == lifeDetaching || st == lifeDetached }

// dumpHolds says whether pid is a client that a CRIU dump holds detached
// (parked, so no longer found among the connected clients), and the
// caller may act on it: then a checkpoint of it is running.
func (r *registry) dumpHolds(c *conn, pid proc.Pid) bool {
	cl := r.waitingFor(pid)
	if cl == nil || !detachedForDump(cl.lifeState()) || cl.process().Check() != nil {
		return false
	}
	return mayAct(c.cred.Uid, cl) == nil
}

// checkpointOpts is what a Checkpoint request asks, resolved.
type checkpointOpts struct {
	req       *helperpb.Checkpoint
	id        uint64        // the request's, for the error response
	requester *conn         // whose image it is; its hang-up ends an injected stall
	dir       *os.File      // the image directory, open
	quiesce   time.Duration // the client's own wait for its calls in progress
	wait      time.Duration // for each control exchange
	log       *zap.Logger
}

// checkpointRun is one checkpoint of a client whose control exchange it
// holds: the steps done so far, and how to take each back.
type checkpointRun struct {
	checkpointOpts
	s     *Server
	cl    *client
	ctl   *control
	nth   uint64 // the helper's how-manyth checkpoint past the drain (for a Config.Fault limited to one)
	ph    *phases
	undos []undo
	reply *helperpb.CheckpointReply

	regions []engine.Region
	gpus    []string        // the GPUs the process sees (its buffer table), for the image
	bytes   uint64          // of regions
	tr      *transfer       // the copy, once begun: its progress, and the steps in the end
	w       *image.Writer   // the image, once open
	keep    bool            // the image is (being) committed: a failure no longer aborts it
	wake    string          // the wake file the drop and the detach name
	scratch *engine.Scratch // a concurrent checkpoint's snapshot memory, made before the stop
	guard   *engine.Guard   // a concurrent checkpoint's copy-on-write window, armed
	ahead   *groupRun       // the group whose other members it checkpoints beside itself (group.go)
}

// stepError is a failed checkpoint step: the response's error code and
// what failed.
type stepError struct {
	code helperpb.ErrorCode
	msg  string
}

// stepErr is a stepError as an error (a background copy's, kept until the
// commit that reports it).
type stepErr struct{ *stepError }

func (e stepErr) Error() string { return e.msg }

func (e *stepError) err() error { return stepErr{e} }

func stepFailed(code helperpb.ErrorCode, format string, args ...any) *stepError {
	return &stepError{code: code, msg: fmt.Sprintf(format, args...)}
}

// checkpointLocked checkpoints cl with its control exchange held: the reply,
// or the response of a failure after which every step done was undone, so
// that the process runs again with all its memory. The steps, in order:
//
//   - quiesce and drain it;
//   - read its buffer table: what to copy;
//   - open the image and record the process in it;
//   - copy its GPU memory into the image while it still holds that memory,
//     and seal its part of the image;
//   - record it for a helper that may come after this one, then have it
//     drop its memory;
//   - with Detach (a CRIU dump), have it detach;
//   - lock and checkpoint its residual context in the driver;
//   - commit the image (unless the commit is deferred);
//   - with LeaveRunning, give it its GPU back.
func (s *Server) checkpointLocked(cl *client, ctl *control, o checkpointOpts) (*helperpb.CheckpointReply, *helperpb.Response) {
	if !cl.waitGuard(guardWaitLimit) {
		return nil, errResp(o.id, helperpb.ErrorCode_ERROR_STATE, "client %d: the copy-on-write window of its previous checkpoint is still open after %v", cl.pid, guardWaitLimit)
	}
	if err := cl.waitDemand(ctl, loadTimeout, s.cfg.OpTimeout); err != nil {
		return nil, errResp(o.id, helperpb.ErrorCode_ERROR_STATE, "client %d: %v", cl.pid, err)
	}
	if o.req.Concurrent && len(s.reg.peerGroup(cl)) > 1 {
		// Its peers write into memory it shares with them once they run
		// again, which no window of its own sees: it is copied before.
		o.req = proto.Clone(o.req).(*helperpb.Checkpoint)
		o.req.Concurrent = false
		o.log.Info("a process sharing GPU memory with others is copied before it runs on, not concurrently")
	}
	var scratch *engine.Scratch
	if o.req.Concurrent && s.cfg.Concurrent != ConcurrentCopyOnWrite {
		// The snapshot's memory is made while the process still runs.
		var err error
		if scratch, err = engine.PrepareScratch(cl.allocRegions(), engine.SnapshotOptions{Reserve: s.cfg.SnapshotReserve}); err != nil {
			o.log.Warn("snapshot memory could not be made ahead of the stop; it is made during it", zap.Error(err))
		}
		defer scratch.Release() // what the snapshot did not take
	}
	r := &checkpointRun{checkpointOpts: o, s: s, cl: cl, ctl: ctl, ph: newPhases(), reply: &helperpb.CheckpointReply{}, scratch: scratch}
	steps := []func() *stepError{r.quiesceGroup, r.quiesceDrain, r.bufferTable, r.openImage, r.copyToImage}
	switch {
	case o.req.Concurrent && o.req.LeaveRunning && !o.req.DeferCommit && !o.req.Detach:
		// A GPU-only image of a process that runs on: it resumes right
		// after the snapshot. It never gives its memory up, and nothing
		// of its driver state goes into the image, so the driver's
		// checkpoint would only stop it longer.
		steps = append(steps, r.resumeEarly, r.commit)
	case o.req.Concurrent && o.req.LeaveRunning && !o.req.DeferCommit:
		// The process runs again before the image is committed: the
		// commit waits for the background copy, the process does not.
		steps = append(steps, r.drop, r.detach, r.driverCheckpoint, r.leaveRunning, r.commit)
	default:
		steps = append(steps, r.drop, r.detach, r.driverCheckpoint, r.commit, r.leaveRunning)
	}
	for _, step := range steps {
		if e := step(); e != nil {
			if r.tr != nil {
				r.tr.setPhases(r.ph.list)
			}
			return nil, r.fail(e)
		}
	}
	r.reply.Phases = r.ph.list
	if r.tr != nil {
		r.tr.setPhases(r.ph.list) // what a display of the copy (gpucr checkpoint) shows of the stall
	}
	if o.req.DeferCommit {
		s.groups.done(deferKey{o.requester, o.req.ImageDir}, cl)
	}
	r.reply.TotalSeconds = time.Since(r.ph.start).Seconds()
	r.log.Info("checkpoint done", zap.Uint64("bytes", r.reply.Bytes), zap.Uint64("stored", r.reply.StoredBytes),
		zap.Float64("seconds", r.reply.TotalSeconds))
	return r.reply, nil
}

// fail drops an image that is not committed (a deferred one is dropped by
// CommitImage{abort}, or when its connection closes) and undoes every step
// done so far, newest first; what cannot be undone is logged and told.
func (r *checkpointRun) fail(e *stepError) *helperpb.Response {
	if r.guard != nil {
		// The window must not open with the undo's resume.
		r.guard.Fail(errors.New("the checkpoint failed"))
		if r.cl.clearGuard(r.guard) {
			r.guard.Release()
		}
	}
	if r.w != nil && !r.keep && !r.req.DeferCommit {
		_ = r.s.bg.settle(r.w, true, r.s.salvage)
	}
	r.cl.takeStopReport() // a failed checkpoint reports no stop
	msg := e.msg
	for i := len(r.undos) - 1; i >= 0; i-- {
		if err := r.undos[i].fn(); err != nil {
			r.log.Error("undo after a failed checkpoint failed", zap.String("step", r.undos[i].name), zap.Error(err))
			msg += fmt.Sprintf("; undo %s failed too: %v", r.undos[i].name, err)
		}
	}
	r.log.Warn("checkpoint failed", zap.String("error", msg))
	return errResp(r.id, e.code, "checkpoint of pid %d: %s", r.cl.pid, msg)
}

// call sends one request on the client's control connection.
func (r *checkpointRun) call(req *helperpb.Request) (*helperpb.Response, error) {
	return controlCall(r.ctl, req, r.wait)
}

// quiesceDrain closes the client's gate and synchronizes its contexts.
func (r *checkpointRun) quiesceDrain() *stepError {
	if _, err := r.call(&helperpb.Request{Body: &helperpb.Request_Quiesce{Quiesce: &helperpb.Quiesce{
		TimeoutMs: uint32(r.quiesce / time.Millisecond)}}}); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_TIMEOUT, "quiesce: %v", err)
	}
	r.undos = append(r.undos, undo{"resume", r.resume})
	if err := r.cl.fire(evQuiesced); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_STATE, "quiesce: %v", err)
	}
	r.ph.done("quiesce")
	if _, err := r.call(&helperpb.Request{Body: &helperpb.Request_Drain{Drain: &helperpb.Drain{}}}); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "drain: %v", err)
	}
	r.ph.done("drain")
	r.nth = r.s.nCkpt.Add(1)
	if r.s.cfg.Fault.At(fault.StallCopy, r.nth) {
		r.stall()
	}
	return nil
}

// stall is the injected fault "stall-copy", for the tests that kill the
// helper, or CRIU, mid-dump: the process is quiesced and drained, its memory
// still mapped. The stall ends early when the requester hangs up (CRIU
// killed), as a long copy would end, and the checkpoint goes on.
func (r *checkpointRun) stall() { r.stallAt("before the copy (GPUCR_FAULT=stall-copy)") }

// stallAt stalls as stall does, where says at which point.
func (r *checkpointRun) stallAt(where string) {
	r.log.Warn("injected fault: stalling " + where)
	if r.requester.waitPeerClosed(time.Minute) {
		r.log.Warn("injected fault: the requester closed its connection; the stall ends")
	}
}

// bufferTable asks the client for its buffer table and turns it into the
// regions to copy.
func (r *checkpointRun) bufferTable() *stepError {
	snap, err := r.call(&helperpb.Request{Body: &helperpb.Request_Snapshot{Snapshot: &helperpb.Snapshot{}}})
	if err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_UNAVAILABLE, "snapshot: %v", err)
	}
	table := snap.GetTable()
	if len(table.GetNotCheckpointable()) > 0 {
		return stepFailed(helperpb.ErrorCode_ERROR_STATE, "not checkpointable: %s", strings.Join(table.GetNotCheckpointable(), "; "))
	}
	if r.regions, err = r.cl.regions(table, r.s.reg.importsOf(r.cl)); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_STATE, "%v", err)
	}
	r.gpus = table.GetGpus()
	r.bytes = engine.TotalSize(r.regions)
	return nil
}

// openImage opens the image the GPU data goes into (the caller's, beneath
// the directory it passed: imagedir.go) and records the process in it, even
// without buffers: its restore must know it (a process may hold a driver
// context and no device memory).
func (r *checkpointRun) openImage() *stepError {
	origin := image.Origin{Pid: int(r.cl.pid), Time: time.Now()}
	origin.Host, _ = os.Hostname()
	if len(r.regions) > 0 {
		d := r.regions[0].Device
		origin.GPUModel, origin.GPUUUID = d.Name(), d.UUID()
	}
	opts := image.Options{Parent: r.req.Parent}
	if r.req.Compress {
		opts.Compression = image.CompressionZstd
	}
	w, err := r.s.imageWriter(r.requester, r.dir, r.req, origin, opts)
	if err != nil {
		return stepFailed(imageErrCode(err), "image: %v", err)
	}
	r.w = w
	// Its start time goes with it: a part of an unfinished image names the
	// process that may wait for it, not a later one with its pid (gc).
	r.cl.mu.Lock()
	start := r.cl.proc.Start()
	r.cl.mu.Unlock()
	if err := w.AddProcessInfo(image.ProcessInfo{Pid: int(r.cl.pid), NsPid: int(proc.NsPid(r.cl.pid)), GPUs: r.gpus,
		Imports: r.s.reg.importInfos(r.cl), StartTime: start, Served: r.cl.served.Load()}); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_BAD_REQUEST, "image: %v", err)
	}
	if r.ahead != nil {
		r.checkpointAhead(r.ahead) // the image they go into is open now
	}
	return nil
}

// copyToImage puts the GPU data into the image first, while the process
// still holds its memory: should this helper die during the copy, the
// process keeps running on it (its control connection closes while it is
// quiesced, and it resumes by itself). The copy reads through the helper's
// own view. Then it stores what a new helper needs to give the process its
// memory back, if this one dies after the process gave it up: the process's
// part of the image, sealed before the drop (the image itself is committed
// later: for a dump, once the whole tree is dumped).
func (r *checkpointRun) copyToImage() *stepError {
	tr := r.s.transfers.beginFor(r.requester.cred.Uid, r.w.Dir(), true, r.bytes, []int64{int64(r.cl.pid)})
	r.tr = tr
	tr.stopped = r.ph.start
	r.cl.setStopReport(tr)
	if r.req.Concurrent {
		return r.snapshotToImage()
	}
	st, err := engine.Dump(r.regions, r.w, image.DefaultChunkSize, engine.Options{Progress: tr.progress, Copied: tr.copied})
	r.reply.BytesMoved = st.BytesCopied
	tr.finish(err)
	r.s.log.Info("GPU memory into the image", zap.Int64("pid", int64(r.cl.pid)), zap.Int("chunks", st.Chunks),
		zap.Int("copied", st.Copied), zap.Uint64("bytes_copied", st.BytesCopied), zap.Duration("gpu_hash", st.Hash))
	if err != nil {
		return copyFailed(err, r.w.Dir())
	}
	r.ph.doneSplit("gpu-hash", st.Hash, "copy")
	if err := r.w.SealProcess(int(r.cl.pid)); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "image: %v", err)
	}
	return nil
}

// snapshotToImage is copyToImage of a concurrent checkpoint: the buffers
// are copied device-to-device into a snapshot (engine.TakeSnapshot), those
// there was no room for go into the image now, the stop-the-world way, and
// the snapshot is queued to be written into the image in the background
// (background.go), after which the process's part is sealed. Until then a
// helper that dies loses the process's memory (background.go says why).
func (r *checkpointRun) snapshotToImage() *stepError {
	tr := r.tr
	snap := &engine.Snapshot{Rest: r.regions}
	unhold := func() {}
	if r.s.cfg.Concurrent != ConcurrentCopyOnWrite {
		var err error
		snap, err = engine.TakeSnapshot(r.regions, engine.SnapshotOptions{Reserve: r.s.cfg.SnapshotReserve, Scratch: r.scratch})
		r.scratch.Release() // what it did not take
		if err != nil {
			tr.finish(err)
			return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "snapshot: %v", err)
		}
		unhold = r.s.snaps.hold(snap)
		r.reply.SnapshotBytes = snap.Bytes
		r.ph.done("snapshot")
		r.log.Info("snapshot taken", zap.Uint64("bytes", snap.Bytes), zap.Int("buffers", len(snap.Copies)),
			zap.Duration("alloc", snap.Alloc), zap.Duration("copy", snap.Copy))
	}
	rest := engine.TotalSize(snap.Rest)
	// The rest stays where it is, in a copy-on-write window, when the
	// process runs on after the checkpoint (or after CRIU's dump, unless
	// CRIU kills it: then its memory is saved before it is released,
	// freeAllocs); a GPU-only checkpoint that leaves it dropped copies it
	// now.
	if len(snap.Rest) > 0 && (r.req.LeaveRunning || r.req.Detach) && r.s.cfg.Concurrent != ConcurrentSnapshot {
		g, err := engine.OpenGuard(snap.Rest, r.w, image.DefaultChunkSize, engine.Options{Progress: tr.progress, Copied: tr.copied})
		if err != nil {
			_ = snap.Release()
			unhold()
			tr.finish(err)
			return copyFailed(err, r.w.Dir())
		}
		r.guard = g
		r.cl.setGuard(g) // opens with the process's resume
		r.reply.GuardedBytes = g.Pending
		r.ph.done("gpu-hash")
		r.log.Info("copy-on-write window armed", zap.Int("buffers", len(snap.Rest)), zap.Uint64("bytes", rest),
			zap.Uint64("pending_bytes", g.Pending), zap.Duration("gpu_hash", g.Hash))
	} else if len(snap.Rest) > 0 {
		r.reply.StoppedBytes = rest
		r.log.Info("no room to snapshot every buffer: the rest is copied before the process runs on",
			zap.Uint64("snapshot_bytes", snap.Bytes), zap.Uint64("stopped_bytes", rest), zap.Uint64("reserve", r.s.cfg.SnapshotReserve))
		st, err := engine.Dump(snap.Rest, r.w, image.DefaultChunkSize, engine.Options{Progress: tr.progress, Copied: tr.copied})
		r.reply.BytesMoved = st.BytesCopied
		if err != nil {
			_ = snap.Release()
			unhold()
			tr.finish(err)
			return copyFailed(err, r.w.Dir())
		}
		r.ph.doneSplit("gpu-hash", st.Hash, "copy")
	}
	pid := r.cl.pid
	if len(snap.Copies) == 0 && r.guard == nil {
		unhold()
		tr.finish(nil)
		if r.s.bg.has(r.w) {
			// An earlier process's copy into this image still runs, and a
			// chunk recorded here may refer to one of its chunks: the part
			// is sealed after it, in the same queue.
			w := r.w
			r.s.bg.of(w).add(tr, func() error { return w.SealProcess(int(pid)) })
			return nil
		}
		if err := r.w.SealProcess(int(pid)); err != nil {
			return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "image: %v", err)
		}
		return nil
	}
	tr.background = true
	w, nth, log, cl, g := r.w, r.nth, r.log, r.cl, r.guard
	bg := r.s.bg.of(w)
	bg.add(tr, func() error {
		if r.s.cfg.Fault.At(fault.StallBackground, nth) {
			log.Warn("injected fault: stalling the background copy (GPUCR_FAULT=stall-background)")
			select {
			case <-r.s.stopping:
			case <-bg.settling: // the image is dropped: nothing to hold back
			case <-time.After(backgroundStall):
			}
		}
		waited := cl.untilRunning(bg.settling, r.s.stopping)
		tr.waited(waited)
		if g != nil {
			// The window first: the process's writes into it wait for it.
			// Its chunks are saved from the memory the process runs on,
			// each checked against the quiesce point; a write held back
			// meanwhile has its chunks saved first (SaveFirst).
			t := time.Now()
			gst, err := g.Run()
			cl.endGuard(g, r.s.cfg.OpTimeout)
			if err != nil {
				_ = snap.Release()
				unhold()
				log.Error("the copy-on-write window of a concurrent checkpoint failed", zap.Error(err))
				return guardFailed(err, w.Dir()).err()
			}
			log.Info("copy-on-write window saved", zap.Int("chunks", gst.Chunks), zap.Int("copied", gst.Copied),
				zap.Int("saved_first", gst.Asked), zap.Uint64("bytes_copied", gst.BytesCopied),
				zap.Duration("seconds", time.Since(t)), zap.Duration("waited_for_the_process", waited))
			if len(snap.Copies) == 0 {
				return w.SealProcess(int(pid))
			}
		}
		t := time.Now()
		progress := func(done int64) { tr.progress(int64(rest) + done) }
		st, err := engine.Dump(snap.Copies, w, image.DefaultChunkSize, engine.Options{Progress: progress, Copied: tr.copied,
			Lanes: r.s.cfg.backgroundLanes()})
		if rerr := snap.Release(); err == nil && rerr != nil {
			err = rerr
		}
		unhold()
		if err != nil {
			log.Error("the background copy of a concurrent checkpoint failed", zap.Error(err))
			return copyFailed(err, w.Dir()).err()
		}
		if err := w.SealProcess(int(pid)); err != nil {
			return err
		}
		log.Info("snapshot copied into the image", zap.Int("chunks", st.Chunks), zap.Int("copied", st.Copied),
			zap.Uint64("bytes_copied", st.BytesCopied), zap.Duration("seconds", time.Since(t)),
			zap.Duration("waited_for_the_process", waited))
		return nil
	})
	return nil
}

// drop has the process give its memory up. From then on its memory lives
// only in this helper and in the image. Should the helper die, the next one
// finds the process recorded here and gives it its memory back from the
// image (adopt.go); the wake file (relative to the socket's directory: the
// client resolves it against its own path to the socket, which differs
// inside a container) is how it tells the process.
func (r *checkpointRun) drop() *stepError {
	pid := r.cl.pid
	r.s.wakes.remove(pid)
	r.wake = r.s.wakes.name(pid)
	if err := r.s.states.record(r.cl, r.requester.cred.Uid, r.w.Dir(), r.w.ID()); err != nil {
		r.log.Warn("cannot record the dropped process; a helper restart would lose it", zap.Error(err))
	}
	r.undos = append(r.undos, undo{"forget the recorded process", func() error { r.s.states.drop(pid); return nil }})
	// The driver's checkpoint must see no imported memory (it fails to
	// restore a process that kept imported memory mapped: 801).
	if _, err := r.call(&helperpb.Request{Body: &helperpb.Request_Drop{Drop: &helperpb.Drop{WakePath: r.wake}}}); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "drop: %v", err)
	}
	r.undos = append(r.undos, undo{"reimport", func() error { return r.s.mem.reimportAll(r.cl, r.ctl, r.wait) }})
	if err := r.cl.fire(evDropped); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_STATE, "drop: %v", err)
	}
	r.ph.done("drop")
	return nil
}

// detach (a CRIU dump) has the client close its connections and wait for
// its wake file: CRIU must not find a socket connected to the helper. From
// then on the way back goes through the wake file.
func (r *checkpointRun) detach() *stepError {
	if !r.req.Detach {
		return nil
	}
	wakeAndGiveBack := []undo{{"wake and give back", func() error { return r.s.wakeAndGiveBack(r.cl) }}}
	if err := r.cl.fire(evDetach); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_UNAVAILABLE, "detach: %v", err)
	}
	template := r.req.Template && r.cl.served.Load()
	if r.req.Template && !template {
		r.log.Info("a template was asked for, but the process is not served: its image has none")
	}
	det := &helperpb.Request{Body: &helperpb.Request_Detach{Detach: &helperpb.Detach{WakePath: r.wake, Template: template}}}
	resp, script, err := r.ctl.callTakingFD(det, r.wait)
	if err == nil && resp.Error != nil {
		err = fmt.Errorf("%s: %s", resp.Error.Code, resp.Error.Message)
	}
	if err == nil && template {
		r.keepTemplate(script)
	} else if script != nil {
		script.Close()
	}
	if err != nil {
		if r.s.reg.parkedWithin(r.cl, time.Second) {
			r.undos = wakeAndGiveBack // it detached all the same
		} else {
			_ = r.cl.fire(evDetachFailed) // an illegal transition is logged
		}
		return stepFailed(helperpb.ErrorCode_ERROR_UNAVAILABLE, "detach: %v", err)
	}
	r.undos = wakeAndGiveBack
	r.cl.hangUp()
	if !r.s.reg.parkedWithin(r.cl, 2*time.Second) {
		r.log.Warn("a detached client did not leave its connections within 2 s")
	}
	r.ph.done("detach")
	return nil
}

// keepTemplate puts the served process's template script (the Detach's
// answer carried it, or nil: the library said why in the process's log)
// into the image. Without it the checkpoint goes on: the restore replays,
// as without a template.
func (r *checkpointRun) keepTemplate(script *os.File) {
	if script == nil {
		r.log.Warn("served mode: the process gave no template's script; its image has no template")
		return
	}
	defer script.Close()
	t := time.Now()
	if err := r.w.AddTemplateScript(int(r.cl.pid), script, maxTemplateScript); err != nil {
		r.log.Warn("served mode: the template's script is not in the image", zap.Error(err))
		return
	}
	r.ph.done("template-script")
	r.log.Info("served mode: template's script kept", zap.Duration("seconds", time.Since(t)))
}

// maxTemplateScript bounds a template's script (served.h: SV_SCRIPT_MAX).
const maxTemplateScript = 8 << 30

// driverCheckpoint locks the process in the driver and checkpoints its
// residual context (it is quiesced, drained and dropped by now), adding the
// undo of each step that succeeded.
//
// The driver names processes by pid: before each call the client's process
// must still run (livePid), so that no call reaches a process that took its
// pid since.
func (r *checkpointRun) driverCheckpoint() *stepError {
	if r.s.cfg.Fault.At(fault.StallDropped, r.nth) {
		r.stallAt("after the drop (GPUCR_FAULT=stall-dropped)")
	}
	if r.s.cfg.Fault.At(fault.DriverLock, r.nth) {
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "driver lock: injected fault (GPUCR_FAULT)")
	}
	pid, err := r.cl.livePid()
	if err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_NOT_FOUND, "driver lock: %v", err)
	}
	// Its process may have exec'd a set-user-ID program since the request
	// was let in: the user's checkpoint does not reach it.
	if err := mayAct(r.requester.cred.Uid, r.cl); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_PERMISSION, "driver lock: %v", err)
	}
	rs := r.cl.residuals(r.s.residuals)
	if err := rs.Lock(pid, driverLockTimeout); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "driver lock: %v", err)
	}
	r.undos = append(r.undos, undo{"driver unlock", func() error { return r.cl.onLive(rs.Unlock) }})
	r.ph.done("driver-lock")
	if r.s.cfg.Fault.At(fault.DriverCheckpoint, r.nth) {
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "driver checkpoint: injected fault (GPUCR_FAULT)")
	}
	if err := r.cl.onLive(rs.Save); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "driver checkpoint: %v", err)
	}
	r.undos = append(r.undos, undo{"driver restore", func() error {
		return r.cl.onLive(func(pid int) error { return rs.Restore(pid, nil) })
	}})
	r.ph.done("driver-checkpoint")
	return nil
}

// commit commits the image, unless its commit is deferred (a dump of
// several processes: the plugin commits it once the whole tree is dumped),
// and fills in the reply.
func (r *checkpointRun) commit() *stepError {
	if !r.req.DeferCommit {
		r.keep = true
		if r.s.bg.has(r.w) {
			// (the process may be running again: nothing to undo then)
			if err := r.s.bg.settle(r.w, false, r.s.salvage); err != nil {
				if se := (stepErr{}); errors.As(err, &se) {
					return se.stepError
				}
				return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "the image: %v", err)
			}
			r.ph.done("background-copy")
			r.reply.BytesMoved = r.tr.moved.Load()
		} else if err := r.w.Commit(); err != nil {
			return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "commit the image: %v", err)
		} else {
			r.ph.done("commit")
		}
	}
	st := r.w.Stats()
	r.reply.Buffers, r.reply.Bytes, r.reply.StoredBytes = uint64(len(r.regions)), r.bytes, uint64(st.BytesStored)
	if r.reply.State == helperpb.ClientState_CLIENT_STATE_UNSPECIFIED {
		r.reply.State = helperpb.ClientState_CLIENT_STATE_DROPPED
	}
	return nil
}

// leaveRunning (LeaveRunning) gives the process its GPU back.
func (r *checkpointRun) leaveRunning() *stepError {
	if !r.req.LeaveRunning {
		return nil
	}
	tr := r.cl.takeStopReport() // taken first: the thaw's steps are this checkpoint's own
	if err := r.s.thaw(r.cl, r.ctl, r.wait, r.ph); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "leave running: %v", err)
	}
	tr.resumed(nil)
	r.undos = nil // it runs with all its memory: a later failure costs the image alone
	r.reply.State = helperpb.ClientState_CLIENT_STATE_RUNNING
	return nil
}

// resume opens the quiesced client's gate again (the quiesce's undo; a
// window armed by then opens with it, unless the checkpoint failed: fail
// ends the window first).
func (r *checkpointRun) resume() error {
	if _, err := r.call(r.cl.resumeRequest()); err != nil {
		return err
	}
	return r.cl.fire(evResumed)
}

// resumeEarly (a GPU-only concurrent checkpoint that leaves the process
// running) resumes the process as soon as its snapshot is taken.
func (r *checkpointRun) resumeEarly() *stepError {
	if err := r.resume(); err != nil {
		return stepFailed(helperpb.ErrorCode_ERROR_UNAVAILABLE, "resume: %v", err)
	}
	r.undos = nil // it runs with all its memory: a later failure costs the image alone
	r.ph.done("resume")
	r.cl.takeStopReport().resumed(nil)
	r.reply.State = helperpb.ClientState_CLIENT_STATE_RUNNING
	return nil
}

// resumeCheckpointed runs a ResumeCheckpointed request.
func (s *Server) resumeCheckpointed(c *conn, id uint64, req *helperpb.ResumeCheckpointed) *helperpb.Response {
	cl, refused := s.reg.controlledClient(c, id, req.Pid, "resume")
	if refused != nil {
		return refused
	}
	pid, err := cl.livePid()
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "pid %d: %v", cl.pid, err)
	}
	state, err := cl.residuals(s.residuals).State(pid)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "pid %d: %v", cl.pid, err)
	}
	if state != ResidualSaved {
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

// allocRegions are cl's allocations as the engine's regions (device,
// handle and size only): what a snapshot's memory is made for ahead of the
// stop.
func (cl *client) allocRegions() []engine.Region {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []engine.Region
	for _, al := range cl.allocs {
		if g := al.dev.GPU(); g != nil {
			out = append(out, engine.Region{Device: g, Handle: al.handle, Size: al.size, Pid: int(cl.pid), Address: al.address})
		}
	}
	return out
}

// regions turns a client's buffer table into what the engine copies: every
// allocation must be one the helper made for this client, mapped, on a
// device the engines can reach.
func (cl *client) regions(table *helperpb.BufferTable, imports map[uint64]uint64) ([]engine.Region, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []engine.Region
	rank := map[uint64]uint32{}
	for i, a := range table.GetTouchOrder() {
		if _, seen := rank[a]; !seen && i < 1<<31 {
			rank[a] = uint32(i) + 1
		}
	}
	listed := map[uint64]bool{}
	for _, a := range table.GetAllocations() {
		al := cl.allocs[a.AllocId]
		if _, imported := imports[a.AllocId]; al == nil && imported {
			continue // a peer's memory: its owner's image holds it
		}
		if al == nil {
			return nil, fmt.Errorf("the client lists allocation %d, which the helper does not know", a.AllocId)
		}
		gpu := al.dev.GPU()
		if gpu == nil {
			return nil, fmt.Errorf("allocation %d: its device has no driver behind it", a.AllocId)
		}
		if a.Address == 0 {
			return nil, fmt.Errorf("allocation %d is not mapped", a.AllocId)
		}
		out = append(out, engine.Region{Device: gpu, Handle: al.handle, Size: al.size,
			Pid: int(cl.pid), NsPid: int(proc.NsPid(cl.pid)), Address: a.Address, Kind: imageKind(a.Kind), Flags: al.flags,
			TouchRank: rank[a.Address]})
		listed[a.AllocId] = true
	}
	// A peer's memory it inherited: its interposer lists it as an import.
	for _, al := range cl.allocs {
		if al.inherited && !listed[al.id] && al.address != 0 {
			if gpu := al.dev.GPU(); gpu != nil {
				out = append(out, engine.Region{Device: gpu, Handle: al.handle, Size: al.size, Pid: int(cl.pid),
					NsPid: int(proc.NsPid(cl.pid)), Address: al.address, Kind: image.AllocVMM, Flags: al.flags})
			}
		}
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

// copyFailed says why the copy into the image failed: a full or read-only
// file system in one plain sentence (the chunk's long path adds nothing),
// the driver's error as one, anything else as the image's.
func copyFailed(err error, dir string) *stepError {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return stepFailed(helperpb.ErrorCode_ERROR_UNAVAILABLE,
			"the image directory %s is full: no space left on device for the GPU memory", dir)
	case errors.Is(err, syscall.EROFS):
		return stepFailed(helperpb.ErrorCode_ERROR_UNAVAILABLE, "the image directory %s is on a read-only file system", dir)
	case engine.IsDeviceError(err):
		return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "copy to the image: %v", err)
	}
	return stepFailed(helperpb.ErrorCode_ERROR_UNAVAILABLE, "writing the image: %v", err)
}
