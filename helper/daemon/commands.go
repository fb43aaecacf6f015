package daemon

// The connections of the CLI (ROLE_CLI) and of CRIU's plugin (ROLE_PLUGIN):
// what they ask (Status, ClientOp, Checkpoint, PrepareRestore, Restored,
// DumpDone, ...), who may ask it, and what their connection closing undoes.

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

func (s *Server) serveCLI(c *conn, helloID uint64, h *helperpb.Hello) {
	c.log = c.log.With(zap.Stringer("role", h.Role))
	// Restores this connection prepared: only it claims their processes
	// (Restored), and if it closes before it did (CRIU's restore failed),
	// that memory is given back.
	var plans []*restorePlan
	defer func() { s.dropUnrestored(plans) }()
	// Processes this connection detached for a dump and has not reported
	// on (DumpDone): if it closes first, CRIU died mid-dump, and whatever
	// is still alive gets its GPU back.
	detached := map[int64]bool{}
	defer func() {
		for pid := range detached {
			s.recoverDetached(proc.Pid(pid))
		}
	}()
	images := map[string]bool{} // deferred-commit images this connection writes
	defer func() { s.abortImages(c, images) }()
	// Sync holds and gates this connection's ClientOps left: undone when
	// it closes (holds.go).
	holds := newConnHolds()
	defer func() { holds.undo(s.cfg.OpTimeout) }()
	if err := c.send(&helperpb.Response{Id: helloID, Body: &helperpb.Response_Hello{Hello: &helperpb.HelloReply{
		ProtocolVersion: wire.Version, HelperVersion: s.cfg.Version, Devices: devicesInfo(s.cfg.Devices)}}}, nil); err != nil {
		return
	}
	for {
		req := c.next()
		if req == nil {
			return
		}
		var resp *helperpb.Response
		switch b := req.Body.(type) {
		case *helperpb.Request_Status:
			body, err := s.statusShare.get(s.status).response(req.Id, c.cred.Uid, b.Status, s.statusBudget)
			if err == nil {
				err = c.sendEncoded(body)
			}
			if err != nil {
				c.log.Debug("status reply", zap.Error(err))
				return
			}
			continue
		case *helperpb.Request_WaitRestored:
			resp = s.recent.wait(c, req.Id, b.WaitRestored)
		case *helperpb.Request_Transfers:
			resp = &helperpb.Response{Id: req.Id, Body: &helperpb.Response_Transfers{Transfers: &helperpb.TransfersReply{
				Transfers: s.transfers.snapshot(b.Transfers.ImageDir, c.cred.Uid)}}}
		case *helperpb.Request_ClientOp:
			resp = s.clientOp(c, req.Id, b.ClientOp, holds)
		case *helperpb.Request_Checkpoint:
			resp = s.checkpoint(c, req.Id, b.Checkpoint)
			if b.Checkpoint.Detach && resp.Error == nil {
				detached[b.Checkpoint.Pid] = true
			}
			if b.Checkpoint.DeferCommit {
				images[b.Checkpoint.ImageDir] = true
			}
		case *helperpb.Request_CommitImage:
			delete(images, b.CommitImage.ImageDir)
			resp = pluginOnly(c, req.Id, func() *helperpb.Response { return s.commitImage(c, req.Id, b.CommitImage) })
		case *helperpb.Request_ResumeCheckpointed:
			resp = s.resumeCheckpointed(c, req.Id, b.ResumeCheckpointed)
		case *helperpb.Request_DumpDone:
			delete(detached, b.DumpDone.Pid)
			resp = pluginOnly(c, req.Id, func() *helperpb.Response { return s.dumpDone(req.Id, b.DumpDone) })
		case *helperpb.Request_PrepareRestore:
			resp = pluginOnly(c, req.Id, func() *helperpb.Response {
				r, plan := s.prepareRestore(req.Id, b.PrepareRestore, c.takeFD())
				if plan != nil {
					plans = append(plans, plan)
				}
				return r
			})
		case *helperpb.Request_LoadResident:
			resp = s.loadResident(c, req.Id, b.LoadResident, c.takeFD())
		case *helperpb.Request_UnloadResident:
			resp = s.residents.unload(s.log, s.served, c, req.Id, b.UnloadResident, c.takeFD())
		case *helperpb.Request_AwaitLoad:
			resp = pluginOnly(c, req.Id, func() *helperpb.Response { return awaitLoad(s.log, req.Id, plans) })
		case *helperpb.Request_Restored:
			resp = pluginOnly(c, req.Id, func() *helperpb.Response { return s.restored(req.Id, b.Restored, plans) })
		default:
			c.reject(req.Id, "%T is not allowed for %s", req.Body, h.Role)
			return
		}
		if err := c.send(resp, nil); err != nil {
			return
		}
	}
}

// controlledClient is the client pid that a CLI or plugin request (verb:
// what it would do) names, if the caller may control it: root, or the
// client's own uid. Else the answer that refuses the request (a refusal for
// permission is logged, with fields).
func (r *registry) controlledClient(c *conn, id uint64, pid int64, verb string, fields ...zap.Field) (*client, *helperpb.Response) {
	cl := r.connectedAs(proc.Pid(pid))
	if cl == nil || int64(cl.pid) != pid {
		return nil, errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no client with pid %d (not running under gpucr, or not using the GPU)", pid)
	}
	if err := cl.process().Check(); err != nil {
		// Its process exited (its drop is under way): the pid names
		// nothing of the helper's, whatever process has it now.
		cl.hangUp()
		return nil, errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no client with pid %d (the client's process has exited)", pid)
	}
	if err := mayAct(c.cred.Uid, cl); err != nil {
		c.log.Warn("client operation refused", append([]zap.Field{zap.Int64("pid", pid), zap.String("action", verb), zap.Error(err)}, fields...)...)
		return nil, errResp(id, helperpb.ErrorCode_ERROR_PERMISSION, "uid %d may not %s pid %d: %v", c.cred.Uid, verb, cl.pid, err)
	}
	return cl, nil
}

// mayAct says why caller may not act on cl (nil: it may): root may; the
// uid that owns the client may while its process runs as that uid alone
// (identityErr).
func mayAct(caller uint32, cl *client) error {
	cl.mu.Lock()
	owner := cl.uid
	cl.mu.Unlock()
	if !mayControl(caller, owner) {
		return fmt.Errorf("it is uid %d's", owner)
	}
	if caller == 0 {
		return nil
	}
	return cl.identityErr()
}

// clientOp forwards one control command to a client; only root or the
// client's own uid may.
func (s *Server) clientOp(c *conn, id uint64, op *helperpb.ClientOp, holds *connHolds) *helperpb.Response {
	cl, refused := s.reg.controlledClient(c, id, op.Pid, "control", zap.Stringer("op", op.Op))
	if refused != nil {
		return refused
	}
	wait := s.cfg.OpTimeout
	if op.TimeoutMs > 0 {
		wait = time.Duration(op.TimeoutMs)*time.Millisecond + opGrace
	}
	var req *helperpb.Request
	var ev lifeEvent // what the client's Ok to op means for its lifecycle
	changes := false
	switch op.Op {
	case helperpb.ClientOp_OP_QUIESCE:
		req = &helperpb.Request{Body: &helperpb.Request_Quiesce{Quiesce: &helperpb.Quiesce{TimeoutMs: op.TimeoutMs}}}
		ev, changes = evQuiesced, true
	case helperpb.ClientOp_OP_DRAIN:
		req = &helperpb.Request{Body: &helperpb.Request_Drain{Drain: &helperpb.Drain{}}}
	case helperpb.ClientOp_OP_DROP:
		req = &helperpb.Request{Body: &helperpb.Request_Drop{Drop: &helperpb.Drop{}}}
		ev, changes = evDropped, true
	case helperpb.ClientOp_OP_RESUME:
		req = &helperpb.Request{Body: &helperpb.Request_Resume{Resume: &helperpb.Resume{}}}
		ev, changes = evResumed, true
	case helperpb.ClientOp_OP_SNAPSHOT:
		req = &helperpb.Request{Body: &helperpb.Request_Snapshot{Snapshot: &helperpb.Snapshot{}}}
	case helperpb.ClientOp_OP_STATS:
		req = &helperpb.Request{Body: &helperpb.Request_GetStats{GetStats: &helperpb.GetStats{}}}
	case helperpb.ClientOp_OP_REIMPORT:
		ev, changes = evQuiesced, true
	case helperpb.ClientOp_OP_HOLD_SYNC:
		req = &helperpb.Request{Body: &helperpb.Request_HoldSync{HoldSync: &helperpb.HoldSync{}}}
	case helperpb.ClientOp_OP_REACH_SYNC:
		req = &helperpb.Request{Body: &helperpb.Request_ReachSync{ReachSync: &helperpb.ReachSync{
			Target: op.SyncTarget, TimeoutMs: op.TimeoutMs}}}
	case helperpb.ClientOp_OP_RELEASE_SYNC:
		req = &helperpb.Request{Body: &helperpb.Request_ReleaseSync{ReleaseSync: &helperpb.ReleaseSync{}}}
	default:
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "unknown client operation %d", op.Op)
	}
	log := cl.log.With(zap.Stringer("op", op.Op))
	start := time.Now()
	reply := &helperpb.ClientOpReply{}
	var failed *helperpb.Error
	// What the client did is recorded while the exchange is held: no other
	// operation comes between.
	err := cl.withControl(wait, func(ctl *control) error {
		if op.Op == helperpb.ClientOp_OP_REIMPORT {
			var err error
			if failed, err = s.mem.reimport(cl, ctl, wait); err == nil && failed == nil {
				_ = cl.fire(ev) // an illegal transition is logged
			}
			return err
		}
		r, err := ctl.call(req, nil, wait)
		if err != nil {
			return err
		}
		if r.Error != nil {
			failed = r.Error
			return nil
		}
		reply.Table = r.GetTable()
		reply.Stats = r.GetStats()
		reply.SyncCount = r.GetSyncCount().GetCount()
		if op.Scoped {
			holds.note(cl, op.Op)
		}
		switch {
		case reply.Table != nil:
			_ = cl.reported(reply.Table.State) // an illegal transition is logged
		case changes:
			_ = cl.fire(ev)
		}
		return nil
	})
	switch {
	case errors.Is(err, errNoControl):
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "client %d: control connection is not connected", cl.pid)
	case errors.Is(err, errBusy):
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "client %d: another control operation is in progress", cl.pid)
	case err != nil:
		log.Warn("client operation failed", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_TIMEOUT, "client %d: %v", cl.pid, err)
	case failed != nil:
		log.Info("client refused the operation", zap.Stringer("code", failed.Code), zap.String("message", failed.Message))
		return errResp(id, failed.Code, "client %d: %s", cl.pid, failed.Message)
	}
	log.Info("client operation done", zap.Duration("took", time.Since(start)))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_ClientOp{ClientOp: reply}}
}

// mayControl: root, or the uid that owns the client.
func mayControl(caller, owner uint32) bool { return caller == 0 || caller == owner }

// pluginOnly runs f for root callers only: these requests act on whatever
// process CRIU is dumping or restoring, which only root may do.
func pluginOnly(c *conn, id uint64, f func() *helperpb.Response) *helperpb.Response {
	if c.cred.Uid != 0 {
		return errResp(id, helperpb.ErrorCode_ERROR_PERMISSION, "only root (CRIU) may send this")
	}
	return f()
}
