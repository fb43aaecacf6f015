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
//   - a parked client records its process's start time; the reaper
//     (reaper.go) releases the memory of one whose process is gone (or whose
//     pid now names another process), so no stale entry outlives its process.

import (
	"fmt"

	"go.uber.org/zap"
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
