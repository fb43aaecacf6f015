package daemon

// A client detached for a CRIU dump: the dump's end (DumpDone, or the
// plugin's connection closing first) decides what becomes of it. Gone, its
// memory is released; alive, it is woken through its wake file (wake.go) and,
// once it has reattached and its control connection is up, given its memory
// back (giveback.go). A checkpoint that fails after the detach brings it back
// the same way.

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// reattachTimeout bounds how long DumpDone waits for a woken process.
const reattachTimeout = 60 * time.Second

// dumpDone runs a DumpDone request: the dump that detached pid has ended.
// Gone (the dump succeeded and CRIU killed it): its memory is released.
// Alive (--leave-running, or the dump failed anywhere in the tree, or CRIU
// died): its driver state comes back, it is woken and gets its memory back.
// Every failure on that way is logged here, because the process waits for
// nothing else.
func (s *Server) dumpDone(id uint64, req *helperpb.DumpDone) *helperpb.Response {
	pid := proc.Pid(req.Pid)
	cl := s.reg.detachedAs(pid)
	if cl == nil {
		if !req.Alive {
			return okResp(id) // released already (the reaper saw it die first)
		}
		s.log.Warn("a dump ended for a process that is not detached", pidField("pid", pid))
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no detached client with pid %d", req.Pid)
	}
	alive := req.Alive
	if !alive && cl.process().RunsOn() {
		// Releasing its memory would leave it waiting forever.
		cl.log.Warn("the dump reported the process gone, but it runs on: giving its GPU back")
		alive = true
	}
	if !alive {
		if s.reg.unpark(cl) {
			s.mem.release(cl)
			s.reg.removeWakes(pid, 0)
			cl.log.Info("dumped process is gone; its memory is released")
		}
		return okResp(id)
	}
	if cl.process().Stopped() {
		// Left stopped (CRIU's --leave-stopped: a migration's source that
		// is killed once its copy runs elsewhere, or continued if that
		// fails). The driver cannot restore the state of a process none of
		// whose threads can run: it is done once the process is continued
		// (stopped.go), and its memory is released if it is killed.
		s.reg.leftStopped(cl)
		cl.log.Info("the dump left the process stopped: its GPU comes back once it is continued, and goes if it is killed")
		return okResp(id)
	}
	// The driver state first, while nothing in the process can touch the
	// GPU, then wake it.
	ph := newPhases() // the resume's steps, for the checkpoint's report
	if err := cl.resumeResidualRetry(cl.residuals(s.residuals)); err != nil {
		cl.log.Error("a dumped process that runs on cannot get its GPU back: the driver refuses to restore it", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "pid %d: %v", pid, err)
	}
	ph.done("driver-restore")
	done := make(chan error, 1)
	if err := cl.arm(func() { s.giveBack(cl, false, done, ph) }); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "pid %d: %v", pid, err) // its memory is gone (logged)
	}
	if err := s.wakes.create(pid, ""); err != nil {
		cl.log.Error("cannot wake a dumped process that runs on", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "pid %d: wake file: %v", pid, err)
	}
	select {
	case err := <-done:
		if err != nil {
			return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "pid %d: %v", pid, err)
		}
	case <-time.After(reattachTimeout):
		cl.log.Error("a dumped process that runs on did not come back for its GPU", zap.Duration("waited", reattachTimeout))
		return errResp(id, helperpb.ErrorCode_ERROR_TIMEOUT, "pid %d did not reattach within %v", pid, reattachTimeout)
	}
	cl.log.Info("the dump has ended; the process runs on with its GPU")
	return okResp(id)
}

// recoverDetached handles a detached client whose dump never reported its
// end (CRIU died, or the plugin could not send DumpDone): alive, it gets its
// GPU back as after --leave-running; gone, its memory is released.
func (s *Server) recoverDetached(pid proc.Pid) {
	cl := s.reg.detachedAs(pid)
	if cl == nil {
		return
	}
	alive := cl.process().RunsOn()
	cl.log.Warn("the dump ended without a report (CRIU died?)", zap.Bool("process_alive", alive))
	if r := s.dumpDone(0, &helperpb.DumpDone{Pid: int64(pid), Alive: alive}); r.Error != nil {
		cl.log.Error("recovering the process after an unfinished dump failed", zap.String("error", r.Error.Message))
	}
}

// wakeAndGiveBack brings a detached client back while its checkpoint's
// control exchange is still held (the undo of a failed detached checkpoint):
// it waits for the reattach, then reimports and resumes it.
func (s *Server) wakeAndGiveBack(cl *client) error {
	// It may still look connected (its close not seen yet): wait a little.
	s.reg.parkedWithin(cl, 2*time.Second)
	done := make(chan error, 1)
	if err := cl.arm(func() { done <- s.giveBackLocked(cl) }); err != nil {
		return err
	}
	if err := s.wakes.create(cl.pid, ""); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-time.After(reattachTimeout):
		return fmt.Errorf("pid %d did not reattach within %v", cl.pid, reattachTimeout)
	}
}
