package daemon

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// connHolds is what one CLI connection's scoped ClientOps left on clients:
// the ones it holds at a count of peer sync operations (OP_HOLD_SYNC,
// OP_REACH_SYNC) and the ones whose gate it closed (OP_QUIESCE). A job
// checkpoint's agent holds its host's ranks this way until every host's
// ranks are at one point; if the agent dies (its ssh session cut, a
// SIGKILL), no rank may stay held, waiting for a release that never comes.
// So when the connection closes, each hold is released and each gate still
// closed by it alone is opened. A checkpoint that took the client on since
// (detached it, or the client came back with a new control connection,
// which ends its holds) leaves nothing to undo.
type connHolds struct {
	mu     sync.Mutex
	synced map[*client]bool
	gated  map[*client]bool
}

func newConnHolds() *connHolds {
	return &connHolds{synced: map[*client]bool{}, gated: map[*client]bool{}}
}

// note records what op, which cl acknowledged, leaves on it.
func (h *connHolds) note(cl *client, op helperpb.ClientOp_Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch op {
	case helperpb.ClientOp_OP_HOLD_SYNC, helperpb.ClientOp_OP_REACH_SYNC:
		h.synced[cl] = true
	case helperpb.ClientOp_OP_RELEASE_SYNC:
		delete(h.synced, cl)
	case helperpb.ClientOp_OP_QUIESCE:
		h.gated[cl] = true
	case helperpb.ClientOp_OP_RESUME:
		delete(h.gated, cl)
	}
}

// undo releases what a closed connection's ClientOps left (h): every
// hold, and every gate of a client still quiesced (a checkpoint that
// dropped or detached it since owns it now).
func (h *connHolds) undo(wait time.Duration) {
	h.mu.Lock()
	synced, gated := h.synced, h.gated
	h.synced, h.gated = map[*client]bool{}, map[*client]bool{}
	h.mu.Unlock()
	for cl := range synced {
		err := cl.withControl(wait, func(ctl *control) error {
			_, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_ReleaseSync{ReleaseSync: &helperpb.ReleaseSync{}}}, wait)
			return err
		})
		// no control connection: its holds ended with it
		cl.log.Info("sync hold released: the connection that held it closed", zap.Error(err))
	}
	for cl := range gated {
		if cl.lifeState() != lifeQuiesced {
			continue
		}
		err := cl.withControl(wait, func(ctl *control) error {
			if cl.lifeState() != lifeQuiesced {
				return nil // a checkpoint took it on while this waited
			}
			if _, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Resume{Resume: &helperpb.Resume{}}}, wait); err != nil {
				return err
			}
			return cl.fire(evResumed)
		})
		cl.log.Info("gate opened: the connection that closed it closed", zap.Error(err))
	}
}
