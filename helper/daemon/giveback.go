package daemon

// Giving a client its GPU memory back: reimport (every mapped allocation,
// with a new fd each) and resume, after the driver's restore of its residual
// context where a checkpoint left one; for a restored process, after the
// check that the image holds exactly its memory (restorecheck.go).

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// giveBack is what a reattached client gets: optionally (a restored one)
// the check that the image holds exactly the memory the process had and the
// driver restore of its residual context, then its memory, then the gate
// opened. A restored process whose memory cannot be given back is aborted
// with the reason: it must neither run without its memory nor sit frozen.
// ph, if set, times the steps (a dumped process that runs on: its
// checkpoint's report goes on with them).
func (s *Server) giveBack(cl *client, driverRestore bool, done chan<- error, ph *phases) {
	var steps *phases // a restored process's, for its restore's report
	err := cl.withControl(s.cfg.OpTimeout, func(ctl *control) error {
		if !driverRestore {
			if ph != nil {
				ph.done("wake") // until it was back
			}
			return s.reimportResume(cl, ctl, s.cfg.OpTimeout, ph)
		}
		steps = newPhases()
		err := cl.checkRestored(ctl, s.cfg.OpTimeout)
		if err == nil {
			steps.done("restore-check")
			err = s.thaw(cl, ctl, s.cfg.OpTimeout, steps)
		}
		if err != nil {
			reason := "its GPU memory could not be restored: " + err.Error()
			if _, aerr := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Abort{Abort: &helperpb.Abort{Reason: reason}}},
				5*time.Second); aerr != nil {
				cl.log.Error("cannot tell a restored process to stop", zap.Error(aerr))
			}
		}
		return err
	})
	out := cl.takeOutcomes()
	cl.mu.Lock()
	pid := cl.pid
	cl.mu.Unlock()
	if err != nil {
		cl.log.Error("giving a reattached client its GPU back failed", zap.Error(err))
		out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_FAILED, err.Error())
	} else {
		if steps != nil {
			out.setPhases(cl, steps.list)
			cl.log.Info("reattached client runs again", zap.Any("steps", steps.list))
		} else {
			cl.log.Info("reattached client runs again")
		}
		out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_RUNNING, "")
	}
	if done != nil {
		done <- err
	}
}

// reimportResume sends a client its memory and opens its gate; ph (if not
// nil) times the two steps.
func (s *Server) reimportResume(cl *client, ctl *control, wait time.Duration, ph *phases) error {
	if err := s.mem.reimportAll(cl, ctl, wait); err != nil {
		return fmt.Errorf("reimport: %w", err)
	}
	if ph != nil {
		ph.done("reimport")
	}
	// (with a concurrent checkpoint's copy-on-write window, if one is armed)
	if _, err := controlCall(ctl, cl.resumeRequest(), wait); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if err := cl.fire(evResumed); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if d := cl.demandNow(); d != nil {
		go d.watch(cl, s.cfg.OpTimeout)
	}
	s.states.drop(cl.pid) // its memory is its own again
	var steps []*helperpb.Phase
	if ph != nil {
		ph.done("resume")
		steps = ph.list
	}
	cl.takeStopReport().resumed(steps)
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

// thaw gives a checkpointed client its GPU back: driver restore + unlock,
// reimport, resume.
func (s *Server) thaw(cl *client, ctl *control, wait time.Duration, ph *phases) error {
	pairs := cl.takeGPUPairs() // once: its later checkpoints stay on the GPUs it has then
	if err := cl.onLive(func(pid int) error { return resumeResidual(cl.residuals(s.residuals), pid, pairs) }); err != nil {
		return err
	}
	ph.done("driver-restore")
	return s.reimportResume(cl, ctl, wait, ph)
}

// resumeResidualRetry is resumeResidual on cl's process (onto its own
// GPUs), tried again for up to a second: the driver's restore needs the
// process's restore thread to run, which it does only once CRIU has let
// the process go.
func (cl *client) resumeResidualRetry(rs Residuals) error {
	var err error
	for i := 0; i < 10; i++ {
		if err = cl.onLive(func(pid int) error { return resumeResidual(rs, pid, nil) }); err == nil || errors.Is(err, proc.ErrGone) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
