package daemon

// Clients that are not connected but whose memory the helper keeps (see
// lifecycle.go for their phases): how they are woken through their wake file,
// how a reattached one gets its GPU back, and how a dump's end (DumpDone, or
// the plugin's connection closing first) decides what becomes of a detached
// one. Once reattached, onAttach gives the client its memory back when its
// control connection is up.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

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
// back", "lost: why" that its GPU state is gone (adopt.go). Written under
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

// giveBack is what a reattached client gets: optionally (a restored one)
// the check that the image holds exactly the memory the process had and the
// driver restore of its residual context, then its memory, then the gate
// opened. A restored process whose memory cannot be given back is aborted
// with the reason: it must neither run without its memory nor sit frozen.
func (s *Server) giveBack(cl *client, driverRestore bool, done chan<- error) {
	err := cl.withControl(s.cfg.OpTimeout, func(ctl *control) error {
		if !driverRestore {
			return s.reimportResume(cl, ctl, s.cfg.OpTimeout, nil)
		}
		err := s.checkRestored(cl, ctl)
		if err == nil {
			err = s.thaw(cl, ctl, s.cfg.OpTimeout, newPhases())
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
	cl.mu.Lock()
	out, pid := cl.out, cl.pid
	cl.out = nil
	cl.mu.Unlock()
	if err != nil {
		cl.log.Error("giving a reattached client its GPU back failed", zap.Error(err))
		out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_FAILED, err.Error())
	} else {
		cl.log.Info("reattached client runs again")
		out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_RUNNING, "")
	}
	if done != nil {
		done <- err
	}
}

// checkRestored compares what a restored process records of its own GPU
// memory (its buffer table: every allocation it had, by address and size)
// with what the image gave it: the image must hold exactly those. An image
// anyone could rewrite (a re-sealed manifest with a buffer moved, shrunk,
// dropped, or given to another pid) is caught here, before the driver
// restore and before the process may run.
func (s *Server) checkRestored(cl *client, ctl *control) error {
	r, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Snapshot{Snapshot: &helperpb.Snapshot{}}}, s.cfg.OpTimeout)
	if err != nil {
		return fmt.Errorf("its record of its memory: %w", err)
	}
	var had, got []memSpan
	for _, a := range r.GetTable().GetAllocations() {
		if a.Address != 0 { // never mapped: nothing of it was dropped or saved
			had = append(had, memSpan{a.Address, a.Size})
		}
	}
	cl.mu.Lock()
	for _, al := range cl.allocs {
		got = append(got, memSpan{al.address, al.size})
	}
	cl.mu.Unlock()
	return matchRestored(had, got)
}

// memSpan is one allocation: where it is mapped and how large it is.
type memSpan struct{ addr, size uint64 }

// matchRestored is nil if got (what the image gave a restored process)
// holds exactly the allocations of had (what the process records it had),
// by address and size; else it says every difference.
func matchRestored(had, got []memSpan) error {
	have := map[uint64]uint64{} // address -> size, of what the image gave
	for _, g := range got {
		if _, dup := have[g.addr]; dup {
			return fmt.Errorf("the GPU image gives the process two buffers at 0x%x", g.addr)
		}
		have[g.addr] = g.size
	}
	var missing, wrong, extra []string
	seen := map[uint64]bool{}
	for _, h := range had {
		seen[h.addr] = true
		size, ok := have[h.addr]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("0x%x (%d bytes)", h.addr, h.size))
		case size != h.size:
			wrong = append(wrong, fmt.Sprintf("0x%x is %d bytes in the image, %d in the process", h.addr, size, h.size))
		}
	}
	for addr, size := range have {
		if !seen[addr] {
			extra = append(extra, fmt.Sprintf("0x%x (%d bytes)", addr, size))
		}
	}
	if len(missing)+len(wrong)+len(extra) == 0 {
		return nil
	}
	sort.Strings(missing)
	sort.Strings(wrong)
	sort.Strings(extra)
	msg := "the GPU image does not match the process"
	if len(missing) > 0 {
		msg += "; it lacks the process's buffer(s) at " + strings.Join(missing, ", ")
	}
	if len(wrong) > 0 {
		msg += "; buffer " + strings.Join(wrong, ", ")
	}
	if len(extra) > 0 {
		msg += "; it holds buffer(s) the process does not have at " + strings.Join(extra, ", ")
	}
	return errors.New(msg)
}

// dumpDone runs a DumpDone request: the dump that detached pid has ended.
// Gone (the dump succeeded and CRIU killed it): its memory is released.
// Alive (--leave-running, or the dump failed anywhere in the tree, or CRIU
// died): its driver state comes back, it is woken and gets its memory back.
// Every failure on that way is logged here, because the process waits for
// nothing else.
func (s *Server) dumpDone(id uint64, req *helperpb.DumpDone) *helperpb.Response {
	pid := int32(req.Pid)
	s.mu.Lock()
	cl := s.waiting[pid]
	if cl != nil && cl.getPhase() != phaseDetached {
		cl = nil
	}
	s.mu.Unlock()
	if cl == nil {
		if !req.Alive {
			return okResp(id) // released already (the reaper saw it die first)
		}
		s.log.Warn("a dump ended for a process that is not detached", zap.Int32("pid", pid))
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no detached client with pid %d", req.Pid)
	}
	cl.mu.Lock()
	start := cl.start
	cl.mu.Unlock()
	alive := req.Alive
	if !alive && processRunsOn(pid, start) {
		// Releasing its memory would leave it waiting forever.
		cl.log.Warn("the dump reported the process gone, but it runs on: giving its GPU back")
		alive = true
	}
	if !alive {
		if s.unpark(cl) {
			s.release(cl)
			s.mu.Lock()
			s.removeWakeLocked(pid, pid)
			s.mu.Unlock()
			cl.log.Info("dumped process is gone; its memory is released")
		}
		return okResp(id)
	}
	// The driver state first, while nothing in the process can touch the
	// GPU, then wake it.
	if err := driverResumeRetry(int(pid)); err != nil {
		cl.log.Error("a dumped process that runs on cannot get its GPU back: the driver refuses to restore it", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "pid %d: %v", pid, err)
	}
	done := make(chan error, 1)
	cl.mu.Lock()
	cl.onAttach = func() { s.giveBack(cl, false, done) }
	cl.mu.Unlock()
	if err := s.wake(pid); err != nil {
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

// driverResumeRetry is driverResume, tried again for up to a second: the
// driver's restore needs the process's restore thread to run, which it does
// only once CRIU has let the process go.
func driverResumeRetry(pid int) error {
	var err error
	for i := 0; i < 10; i++ {
		if err = driverResume(pid); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
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

// recoverDetached handles a detached client whose dump never reported its
// end (CRIU died, or the plugin could not send DumpDone): alive, it gets its
// GPU back as after --leave-running; gone, its memory is released.
func (s *Server) recoverDetached(pid int32) {
	s.mu.Lock()
	cl := s.waiting[pid]
	s.mu.Unlock()
	if cl == nil || cl.getPhase() != phaseDetached {
		return
	}
	cl.mu.Lock()
	start := cl.start
	cl.mu.Unlock()
	alive := processRunsOn(pid, start)
	cl.log.Warn("the dump ended without a report (CRIU died?)", zap.Bool("process_alive", alive))
	if r := s.dumpDone(0, &helperpb.DumpDone{Pid: int64(pid), Alive: alive}); r.Error != nil {
		cl.log.Error("recovering the process after an unfinished dump failed", zap.String("error", r.Error.Message))
	}
}
