package daemon

import (
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// A dump that leaves its processes stopped (CRIU's --leave-stopped, which
// `gpucr migrate` uses for its source) ends with them detached and their
// memory kept here, as after any dump. They stay so while stopped: killed
// (the migration succeeded), the reaper releases their memory; continued
// (it failed), they get their GPU back as after --leave-running.

// continuedPoll is how often stopped processes are looked at: a continued
// migration source waits at most about this long for its GPU.
const continuedPoll = 50 * time.Millisecond

// resumeContinued gives every client a dump left stopped, and that has been
// continued since, its GPU back.
func (s *Server) resumeContinued() {
	for _, cl := range s.reg.takeContinued() {
		cl.log.Info("the stopped process was continued: giving its GPU back")
		go func() {
			if r := s.dumpDone(0, &helperpb.DumpDone{Pid: int64(cl.pid), Alive: true}); r.Error != nil {
				cl.log.Error("a continued process cannot get its GPU back", zap.String("error", r.Error.Message))
			}
		}()
	}
}
