package daemon

// The reaper: parked clients (detached for a dump, or restored and not back
// yet) whose process is gone have their memory released.

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

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
	cont := time.NewTicker(continuedPoll)
	defer cont.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.reapGone()
		case <-cont.C:
			s.resumeContinued()
		}
	}
}

// reapGone runs one pass of the reaper.
func (s *Server) reapGone() {
	for _, cl := range s.reg.waitingClients() {
		pid, p, st := cl.parkedAs()
		if p == nil {
			continue // not known yet: the dump or restore that parked it decides
		}
		if !p.Running() {
			if s.reg.unpark(cl) {
				s.reap(cl, fmt.Sprintf("its process (pid %d) is gone while %s", pid, st))
			}
		}
	}
}

// reap releases the memory of a client taken out of the waiting list.
func (s *Server) reap(cl *client, why string) {
	cl.mu.Lock()
	pid, bytes := cl.pid, cl.bytes
	cl.mu.Unlock()
	wakeAs := cl.wakesAs()
	cl.outcomes().set(cl, pid, helperpb.RestoreState_RESTORE_STATE_FAILED, "the process is gone: "+why)
	s.mem.release(cl)
	s.reg.removeWakes(pid, wakeAs)
	cl.log.Info("released the GPU memory of a process that will not come back", zap.String("why", why),
		zap.Uint64("bytes", bytes))
}
