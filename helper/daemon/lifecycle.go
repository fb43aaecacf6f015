package daemon

// A client's lifecycle. Every change of a client's phase goes through the
// functions of this file, under s.mu and then cl.mu (in that order).
//
//	connected --Checkpoint{detach}--> detached --its connections close--> (parked in s.waiting)
//	   ^                                                |
//	   |<---------- reattach (its old token) -----------+  DumpDone{alive}, a failed dump, CRIU gone
//	   |
//	   |<-- reattach (any token; a new one is issued) -- restored (in s.waiting, by its new pid)
//	                                                         ^
//	prepared (in the PrepareRestore's plan only) --Restored--+
//
// A reattached client is connected again, a client like any other: it can be
// checkpointed, detached and restored again any number of times.
//
// Processes are named by host pid, which the kernel reuses, and a container's
// processes share their pids inside it (every container's init is pid 1), so
// the helper never takes a pid alone as a process's identity:
//   - a prepared client is claimed only by the plugin connection whose
//     PrepareRestore made it (restore.go), never by another restore;
//   - a parked client records its process's start time; the reaper releases
//     the memory of one whose process is gone (or whose pid now names
//     another process), so no stale entry outlives its process.

import (
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// phase is where a client is in its lifecycle.
type phase int

const (
	// phaseConnected: a process with its connections (or setting them up).
	phaseConnected phase = iota
	// phaseDetached: detached for a CRIU dump; it keeps its memory while
	// its connections are closed, and waits for its wake file.
	phaseDetached
	// phasePrepared: memory a PrepareRestore made and is loading; no
	// process yet. Lives only in its restore plan.
	phasePrepared
	// phaseRestored: CRIU restored its process (Restored); it waits for
	// its wake file and then reattaches with any token.
	phaseRestored
)

func (p phase) String() string {
	switch p {
	case phaseConnected:
		return "connected"
	case phaseDetached:
		return "detached"
	case phasePrepared:
		return "prepared"
	case phaseRestored:
		return "restored"
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// waitingWhy is what status says about a client the helper keeps memory for
// while it is not connected.
func (p phase) waitingWhy() string {
	switch p {
	case phaseDetached:
		return "detached for a dump; waits for the dump to end"
	case phaseRestored:
		return "restored from an image; waits for the process to come back"
	case phasePrepared:
		return "being restored from an image"
	}
	return "waiting"
}

// getPhase reads cl's phase.
func (cl *client) getPhase() phase {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.phase
}

// setDetached marks cl as detaching for a dump (on=true), or takes that back
// when the detach failed before the client closed its connections.
func (cl *client) setDetached(on bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if on {
		cl.phase = phaseDetached
	} else if cl.phase == phaseDetached {
		cl.phase = phaseConnected
	}
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

// park moves a detached client whose connections closed to the waiting list
// instead of releasing its memory. It reports whether it did.
func (s *Server) park(cl *client) bool {
	if cl.getPhase() != phaseDetached {
		return false
	}
	start := uint64(0)
	if ps, err := procStat(cl.pid); err == nil {
		start = ps.start
	}
	s.mu.Lock()
	delete(s.byToken, cl.token)
	if s.byPID[cl.pid] == cl {
		delete(s.byPID, cl.pid)
	}
	s.waiting[cl.pid] = cl
	s.mu.Unlock()
	cl.mu.Lock()
	if cl.start == 0 {
		cl.start = start
	}
	cl.mu.Unlock()
	cl.log.Info("client detached; its memory is kept until the dump ends")
	return true
}

// reattach finds the waiting client a calls Hello with a token comes from
// and makes it connected again. A detached client must present its token; a
// restored one presents the token of the process it was restored from, which
// another restore of the same image presents too, so it gets a new one.
func (s *Server) reattach(pid int32, token uint64) *client {
	s.mu.Lock()
	defer s.mu.Unlock()
	cl := s.waiting[pid]
	if cl == nil {
		return nil
	}
	cl.mu.Lock()
	switch {
	case cl.phase == phaseDetached && cl.token == token:
	case cl.phase == phaseRestored:
		cl.token = newToken()
	default:
		cl.mu.Unlock()
		return nil
	}
	wakeAs := cl.wakeAs
	cl.phase = phaseConnected
	cl.wakeAs, cl.nsPid, cl.load = 0, 0, nil
	cl.mu.Unlock()
	delete(s.waiting, pid)
	s.byToken[cl.token] = cl
	s.byPID[cl.pid] = cl
	s.removeWakeLocked(pid, pid)
	if wakeAs != 0 && wakeAs != pid {
		s.removeWakeLocked(wakeAs, pid)
	}
	return cl
}

// removeWakeLocked removes the wake file named after pid unless a client
// other than the one now waiting as self still waits for it (two restores
// of one image wait for the same file). Called with s.mu held.
func (s *Server) removeWakeLocked(pid, self int32) {
	for p, w := range s.waiting {
		if p == self {
			continue
		}
		w.mu.Lock()
		shared := w.phase == phaseRestored && (w.wakeAs == pid || (w.wakeAs == 0 && p == pid))
		w.mu.Unlock()
		if shared {
			return
		}
	}
	_ = os.Remove(s.wakePath(pid))
}

// unpark takes cl out of the waiting list if it is still there; false if
// someone else (a reattach, the reaper) took it first.
func (s *Server) unpark(cl *client) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting[cl.pid] != cl {
		return false
	}
	delete(s.waiting, cl.pid)
	return true
}

// parkRestored makes a prepared client the restored process pid (started at
// start ticks after boot): it waits in the list until it reattaches. A stale
// entry of a process that is gone under the same pid is released first.
func (s *Server) parkRestored(cl *client, pid int32, start uint64) error {
	s.mu.Lock()
	old := s.waiting[pid]
	if old != nil && old != cl {
		old.mu.Lock()
		oldStart := old.start
		old.mu.Unlock()
		if oldStart != 0 && oldStart == start {
			s.mu.Unlock()
			return fmt.Errorf("pid %d already waits for its GPU memory (%s)", pid, old.getPhase())
		}
		delete(s.waiting, pid) // its process is gone: that pid names another one now
	} else {
		old = nil
	}
	if c := s.byPID[pid]; c != nil {
		s.mu.Unlock()
		if old != nil {
			s.reap(old, "its pid names another process now")
		}
		return fmt.Errorf("pid %d is already a connected client of this helper", pid)
	}
	cl.mu.Lock()
	cl.phase = phaseRestored
	cl.pid = pid
	cl.start = start
	cl.log = cl.log.With(zap.Int32("restored_pid", pid))
	cl.mu.Unlock()
	s.waiting[pid] = cl
	s.mu.Unlock()
	if old != nil {
		s.reap(old, "its pid names another process now")
	}
	return nil
}

// reapInterval is how often the reaper looks for parked clients whose
// process is gone.
const reapInterval = time.Second

// runReaper releases, every reapInterval until stop is closed, the memory of
// parked clients whose process is gone: a restored process killed before it
// reattached (a container removed while frozen, say), a detached one killed
// while its dump ran. A process that still exists keeps its memory however
// long it waits (a frozen container may be thawed).
func (s *Server) runReaper(stop <-chan struct{}) {
	t := time.NewTicker(reapInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.reapGone()
		}
	}
}

// reapGone runs one pass of the reaper.
func (s *Server) reapGone() {
	for _, cl := range sortedClients(s, s.waiting) {
		cl.mu.Lock()
		pid, start, ph := cl.pid, cl.start, cl.phase
		cl.mu.Unlock()
		if start == 0 {
			continue // not known yet: the dump or restore that parked it decides
		}
		ps, err := procStat(pid)
		switch {
		case err != nil:
			s.reapIfParked(cl, fmt.Sprintf("its process (pid %d) is gone while %s", pid, ph))
		case ps.start != start:
			s.reapIfParked(cl, fmt.Sprintf("pid %d names another process now", pid))
		case !ps.alive():
			s.reapIfParked(cl, fmt.Sprintf("its process (pid %d) exited while %s", pid, ph))
		}
	}
}

func (s *Server) reapIfParked(cl *client, why string) {
	if s.unpark(cl) {
		s.reap(cl, why)
	}
}

// reap releases the memory of a client taken out of the waiting list.
func (s *Server) reap(cl *client, why string) {
	cl.mu.Lock()
	pid, wakeAs, bytes, out := cl.pid, cl.wakeAs, cl.bytes, cl.out
	cl.mu.Unlock()
	out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_FAILED, "the process is gone: "+why)
	s.release(cl)
	s.mu.Lock()
	s.removeWakeLocked(pid, pid)
	if wakeAs != 0 && wakeAs != pid {
		s.removeWakeLocked(wakeAs, pid)
	}
	s.mu.Unlock()
	cl.log.Info("released the GPU memory of a process that will not come back", zap.String("why", why),
		zap.Uint64("bytes", bytes))
}
