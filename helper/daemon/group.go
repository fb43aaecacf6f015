package daemon

// The checkpoint of processes that share GPU memory (the ranks of an NCCL
// job, sharing.go) as one: the dump checkpoints them one by one (CRIU's
// plugin asks for each pid in turn), but none may be copied while another
// can still write into its memory or wait for it. So the first member's
// checkpoint quiesces the whole group first:
//
//   - HoldSync to every member: each stops its peer sync operations (NCCL's
//     kernel launches, stream waits on shared memory) at the count it has
//     reached, and says it;
//   - ReachSync to every member, to the highest count: those behind run on
//     until they have queued the same operations, then hold. Every
//     operation a member's GPU waits for is queued now, on every member;
//   - Quiesce and Drain of every other member: every gate closes and every
//     GPU drains. The member asking is quiesced by its own checkpoint.
//
// Each member's own checkpoint then finds it quiesced and drained (its
// Quiesce and Drain are no-ops) and copies, drops and detaches it. The group
// ends with the image: at its commit every member must have been
// checkpointed into it (else the commit is refused: a restore would lack a
// peer); a dump that fails resumes the members it quiesced and did not
// checkpoint. The holds end with ReleaseSync, or when a member comes back
// after its dump or restore (a new control connection).

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/fault"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// groupRun is one group's checkpoint into one deferred image.
type groupRun struct {
	members  []*client
	quiesced map[*client]bool // quiesced by the group, not by their own checkpoint
	done     map[*client]bool // checkpointed into the image
	// ahead: the members the first member's checkpoint checkpoints
	// beside its own, in parallel (their copies on their GPUs, NVIDIA's
	// checkpoints of their processes); each one's own request (the
	// plugin's, for its pid) then takes the result.
	ahead map[*client]*aheadRun
}

// aheadRun is one member's checkpoint run ahead of its request.
type aheadRun struct {
	done    chan struct{} // closed when it has ended
	reply   *helperpb.CheckpointReply
	failed  *helperpb.Response // its failure (every step undone), or nil
	claimed bool               // its own request took it (under groupRuns' mu)
}

func (g *groupRun) has(cl *client) bool {
	for _, m := range g.members {
		if m == cl {
			return true
		}
	}
	return false
}

// groupRuns are the checkpoints of processes that share GPU memory, by the
// deferred-commit image they go into. Its lock guards them and, once a run
// is among them, what the run records of its members (done, quiesced, the
// checkpoints run ahead and whether their requests claimed them); nothing
// else is read or written with it.
type groupRuns struct {
	mu    sync.Mutex
	byKey map[deferKey][]*groupRun
}

// runForLocked is the run of the image of key that cl is a member of (nil:
// none).
func (gs *groupRuns) runForLocked(key deferKey, cl *client) *groupRun {
	for _, g := range gs.byKey[key] {
		if g.has(cl) {
			return g
		}
	}
	return nil
}

func (gs *groupRuns) runFor(key deferKey, cl *client) *groupRun {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	return gs.runForLocked(key, cl)
}

func (gs *groupRuns) add(key deferKey, g *groupRun) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.byKey == nil {
		gs.byKey = map[deferKey][]*groupRun{}
	}
	gs.byKey[key] = append(gs.byKey[key], g)
}

// runAhead records a, the checkpoint of member m of g run ahead.
func (gs *groupRuns) runAhead(g *groupRun, m *client, a *aheadRun) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	g.ahead[m] = a
}

// takeAhead is the checkpoint of pid run ahead into the image of key, if
// there is one not claimed yet: the request for pid then waits for it and
// takes its result.
func (gs *groupRuns) takeAhead(key deferKey, pid int64) *aheadRun {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for _, g := range gs.byKey[key] {
		for m, a := range g.ahead {
			if int64(m.pid) == pid && !a.claimed {
				a.claimed = true
				return a
			}
		}
	}
	return nil
}

// claimed says whether a's request took it.
func (gs *groupRuns) claimed(a *aheadRun) bool {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	return a.claimed
}

// done records that cl's checkpoint into the image of key succeeded.
func (gs *groupRuns) done(key deferKey, cl *client) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g := gs.runForLocked(key, cl); g != nil {
		g.done[cl] = true
		delete(g.quiesced, cl)
	}
}

// take forgets the runs of the image of key and returns them.
func (gs *groupRuns) take(key deferKey) []*groupRun {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	g := gs.byKey[key]
	delete(gs.byKey, key)
	return g
}

// pidList says pids as "1, 2 and 3".
func pidList(cls []*client) string {
	var p []string
	for _, c := range cls {
		p = append(p, fmt.Sprint(c.pid))
	}
	if len(p) < 2 {
		return strings.Join(p, "")
	}
	return strings.Join(p[:len(p)-1], ", ") + " and " + p[len(p)-1]
}

// others is group without cl.
func others(group []*client, cl *client) []*client {
	var out []*client
	for _, m := range group {
		if m != cl {
			out = append(out, m)
		}
	}
	return out
}

// quiesceGroup quiesces the group cl shares memory with, for cl's
// checkpoint (ctl: cl's control connection, held), unless an earlier
// member's checkpoint into the same image did. Nothing to do for a client
// that shares nothing.
func (r *checkpointRun) quiesceGroup() *stepError {
	s, cl := r.s, r.cl
	group := s.reg.peerGroup(cl)
	if len(group) < 2 {
		return nil
	}
	if s.cfg.Fault.Is(fault.NoGroupHold) {
		r.log.Warn("injected fault: processes sharing GPU memory are quiesced one by one (GPUCR_FAULT=no-group-hold)")
		return nil
	}
	peers := pidList(others(group, cl))
	if !r.req.DeferCommit {
		return stepFailed(helperpb.ErrorCode_ERROR_STATE,
			"it shares GPU memory with pid %s (the ranks of one job): they can only be checkpointed together, "+
				"as one process tree (gpucr checkpoint of the job's root process, or a CRIU dump of its tree), "+
				"not one alone", peers)
	}
	// Every member is held and quiesced for this request: its caller must
	// be allowed to control each of them, as it would to checkpoint them.
	for _, m := range group {
		if err := mayAct(r.requester.cred.Uid, m); err != nil {
			return stepFailed(helperpb.ErrorCode_ERROR_PERMISSION,
				"it shares GPU memory with pid %d, which uid %d may not checkpoint: %v", m.pid, r.requester.cred.Uid, err)
		}
	}
	key := deferKey{r.requester, r.req.ImageDir}
	g := s.groups.runFor(key, cl)
	if g != nil {
		return nil // an earlier member's checkpoint quiesced it
	}
	g = &groupRun{members: group, quiesced: map[*client]bool{}, done: map[*client]bool{}, ahead: map[*client]*aheadRun{}}
	t0 := time.Now()
	if e := r.holdGroup(g); e != nil {
		r.s.endGroup(g, true, r.cl, r.ctl)
		return e
	}
	s.groups.add(key, g)
	r.log.Info("processes sharing GPU memory quiesced together", zap.String("pids", pidList(group)),
		zap.Duration("took", time.Since(t0)))
	if r.req.Detach {
		r.ahead = g // once this checkpoint's image is open (openImage)
	}
	return nil
}

// checkpointAhead starts the checkpoint of every other member of g, each in
// parallel with this one: the dump asks for them one after the other, and
// their GPU copies and NVIDIA's checkpoints would add up. Each takes the
// member's control exchange for its whole run, as its own request would.
// Called once this checkpoint has opened the image they all go into.
func (r *checkpointRun) checkpointAhead(g *groupRun) {
	for _, m := range g.members {
		if m == r.cl {
			continue
		}
		// its own handle on the image directory: this request's closes
		// when this checkpoint returns
		fd, err := unix.FcntlInt(r.dir.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			r.log.Warn("checkpointing a member ahead: no handle on the image directory; it is checkpointed when asked",
				pidField("member", m.pid), zap.Error(err))
			continue
		}
		a := &aheadRun{done: make(chan struct{})}
		r.s.groups.runAhead(g, m, a)
		o := r.checkpointOpts
		o.dir = os.NewFile(uintptr(fd), r.dir.Name())
		o.req = proto.Clone(r.req).(*helperpb.Checkpoint)
		o.req.Pid = int64(m.pid)
		o.log = m.log.With(zap.String("image", o.req.ImageDir), zap.Bool("leave_running", o.req.LeaveRunning),
			zap.Bool("ahead", true))
		go func() {
			defer close(a.done)
			defer o.dir.Close()
			err := m.withControl(o.wait, func(ctl *control) error {
				a.reply, a.failed = r.s.checkpointLocked(m, ctl, o)
				return nil
			})
			if err != nil && a.failed == nil {
				a.failed = errResp(o.id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "checkpoint of pid %d: %v", m.pid, err)
			}
		}()
	}
}

// response is the run's answer to the request id that takes it.
func (a *aheadRun) response(id uint64) *helperpb.Response {
	<-a.done
	if a.failed != nil {
		f := proto.Clone(a.failed).(*helperpb.Response)
		f.Id = id
		return f
	}
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Checkpoint{Checkpoint: a.reply}}
}

// memberCall sends req to group member m: on r's own control connection
// for r's client, else taking m's control exchange for the call.
func (r *checkpointRun) memberCall(m *client, req *helperpb.Request, wait time.Duration) (*helperpb.Response, error) {
	var resp *helperpb.Response
	err := withMember(m, r.cl, r.ctl, wait, func(ctl *control) error {
		var err error
		resp, err = controlCall(ctl, req, wait)
		return err
	})
	if errors.Is(err, errBusy) {
		err = fmt.Errorf("another control operation is in progress")
	}
	return resp, err
}

// withMember runs f on member m's control connection: self's, whose control
// exchange the caller holds already (selfCtl), as it is; any other's with
// its control exchange taken for f (withControl).
func withMember(m, self *client, selfCtl *control, wait time.Duration, f func(*control) error) error {
	if m == self {
		return f(selfCtl)
	}
	return m.withControl(wait, f)
}

// holdGroup brings every member of g to the same count of peer sync
// operations and quiesces and drains every member but r's.
func (r *checkpointRun) holdGroup(g *groupRun) *stepError {
	counts := make([]uint64, len(g.members))
	var target uint64
	for i, m := range g.members {
		resp, err := r.memberCall(m, &helperpb.Request{Body: &helperpb.Request_HoldSync{HoldSync: &helperpb.HoldSync{}}}, r.wait)
		if err != nil {
			return stepFailed(helperpb.ErrorCode_ERROR_UNAVAILABLE, "hold pid %d (which shares GPU memory with it): %v", m.pid, err)
		}
		counts[i] = resp.GetSyncCount().GetCount()
		target = max(target, counts[i])
	}
	// Each member runs on by itself to the target: at once, so that one
	// that is slow to get there holds no other back.
	errs := make([]error, len(g.members))
	var wg sync.WaitGroup
	for i, m := range g.members {
		if counts[i] == target {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.memberCall(m, &helperpb.Request{Body: &helperpb.Request_ReachSync{ReachSync: &helperpb.ReachSync{
				Target: target, TimeoutMs: uint32(r.quiesce / time.Millisecond)}}}, r.wait)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return stepFailed(helperpb.ErrorCode_ERROR_TIMEOUT,
				"the processes sharing GPU memory did not reach a common point: pid %d was at %d of %d operations that wait for a peer (NCCL's kernels, stream waits on shared memory) and did not get there: %v",
				g.members[i].pid, counts[i], target, err)
		}
	}
	for _, m := range g.members {
		if m == r.cl {
			continue
		}
		if _, err := r.memberCall(m, &helperpb.Request{Body: &helperpb.Request_Quiesce{Quiesce: &helperpb.Quiesce{
			TimeoutMs: uint32(r.quiesce / time.Millisecond)}}}, r.wait); err != nil {
			return stepFailed(helperpb.ErrorCode_ERROR_TIMEOUT, "quiesce pid %d (which shares GPU memory with it): %v", m.pid, err)
		}
		g.quiesced[m] = true
		if err := m.fire(evQuiesced); err != nil {
			return stepFailed(helperpb.ErrorCode_ERROR_STATE, "quiesce pid %d: %v", m.pid, err)
		}
		if _, err := r.memberCall(m, &helperpb.Request{Body: &helperpb.Request_Drain{Drain: &helperpb.Drain{}}}, r.wait); err != nil {
			return stepFailed(helperpb.ErrorCode_ERROR_DRIVER, "drain pid %d (which shares GPU memory with it): %v", m.pid, err)
		}
	}
	return nil
}

// missingMembers says which members of the groups were not checkpointed
// into their image ("" if none).
func missingMembers(groups []*groupRun) string {
	var msgs []string
	for _, g := range groups {
		var missing, done []*client
		for _, m := range g.members {
			// a member checkpointed ahead counts once the dump asked for it
			if a := g.ahead[m]; g.done[m] && (a == nil || a.claimed) {
				done = append(done, m)
			} else {
				missing = append(missing, m)
			}
		}
		if len(missing) > 0 {
			msgs = append(msgs, fmt.Sprintf("pid %s shares GPU memory with pid %s but was not checkpointed with it "+
				"(it is not part of the dumped process tree?)", pidList(missing), pidList(done)))
		}
	}
	return strings.Join(msgs, "; ")
}

// endGroup ends a group's checkpoint: the members it quiesced and that
// were not checkpointed run again, and every member still connected lets
// its held operations go (a member that detached does when it comes back).
// failed: the checkpoint failed (logged as such). self, if not nil, is a
// member whose control exchange the caller holds, on ctl.
func (s *Server) endGroup(g *groupRun, failed bool, self *client, selfCtl *control) {
	for m, a := range g.ahead {
		<-a.done
		if !s.groups.claimed(a) && a.failed == nil {
			// checkpointed and detached ahead, and the dump never asked for
			// it (it failed first): it gets its GPU back, as a process whose
			// dump ended without a report does
			m.log.Warn("a process checkpointed ahead of its dump's request was not asked for: it gets its GPU back")
			s.recoverDetached(m.pid)
		}
	}
	for _, m := range g.members {
		wait := s.cfg.OpTimeout
		err := withMember(m, self, selfCtl, wait, func(ctl *control) error {
			if g.quiesced[m] && m.lifeState() == lifeQuiesced {
				if _, err := controlCall(ctl, m.resumeRequest(), wait); err != nil {
					return fmt.Errorf("resume: %w", err)
				}
				if err := m.fire(evResumed); err != nil {
					return err
				}
			}
			_, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_ReleaseSync{ReleaseSync: &helperpb.ReleaseSync{}}}, wait)
			return err
		})
		if err != nil && !errors.Is(err, errNoControl) {
			m.log.Warn("ending the checkpoint of processes sharing GPU memory", zap.Bool("failed", failed), zap.Error(err))
		}
	}
}

// endGroups ends the group runs of the image of key.
func (s *Server) endGroups(key deferKey, failed bool) {
	for _, g := range s.groups.take(key) {
		s.endGroup(g, failed, nil, nil)
	}
}
