package daemon

// What became of each process of a restore: pending until it has its GPU
// memory back (running) or cannot get it (failed, with the reason). `gpucr
// restore` waits for that (WaitRestored) instead of reporting success while
// a process may still sit frozen.

import (
	"context"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// recentRestores is how long the outcome of a restore stays known after it.
const recentRestores = 10 * time.Minute

// outcomes are the results of one restore plan's processes.
type outcomes struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	byCl    map[*client]*helperpb.RestoreResult
	at      time.Time
}

func newOutcomes() *outcomes {
	return &outcomes{changed: make(chan struct{}), byCl: map[*client]*helperpb.RestoreResult{}, at: time.Now()}
}

// add makes cl, a prepared client, one of the plan's processes: pending.
func (o *outcomes) add(cl *client) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.byCl[cl] = &helperpb.RestoreResult{ImagePid: int64(cl.pid), State: helperpb.RestoreState_RESTORE_STATE_PENDING}
}

// setPhases records the steps of cl's give-back (before its final state).
func (o *outcomes) setPhases(cl *client, steps []*helperpb.Phase) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if r := o.byCl[cl]; r != nil {
		r.Phases = steps
	}
}

// set records what became of cl; a final state (running, failed) is kept.
func (o *outcomes) set(cl *client, pid proc.Pid, state helperpb.RestoreState, reason string) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.byCl[cl]
	if r == nil || r.State != helperpb.RestoreState_RESTORE_STATE_PENDING {
		return
	}
	if pid != 0 {
		r.Pid = int64(pid)
	}
	if state != helperpb.RestoreState_RESTORE_STATE_PENDING {
		r.State, r.Reason = state, reason
	}
	close(o.changed)
	o.changed = make(chan struct{})
}

// fail records that cl, which ran, failed after all (its on-demand load
// did): the one change of a final state.
func (o *outcomes) fail(cl *client, reason string) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.byCl[cl]
	if r == nil || r.State == helperpb.RestoreState_RESTORE_STATE_FAILED {
		return
	}
	r.State, r.Reason = helperpb.RestoreState_RESTORE_STATE_FAILED, reason
	close(o.changed)
	o.changed = make(chan struct{})
}

// snapshot copies the results in image pid order; done: none is pending.
func (o *outcomes) snapshot() (rs []*helperpb.RestoreResult, done bool, changed <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	done = true
	for _, r := range o.byCl {
		rs = append(rs, proto.Clone(r).(*helperpb.RestoreResult))
		done = done && r.State != helperpb.RestoreState_RESTORE_STATE_PENDING
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].ImagePid < rs[j].ImagePid })
	return rs, done, o.changed
}

// recentOutcomes are the outcomes of the restores of the last
// recentRestores, by image directory: what WaitRestored answers from. It
// has its own lock: nothing else is read or written with it.
type recentOutcomes struct {
	mu    sync.Mutex
	byDir map[string]*outcomes
}

func newRecentOutcomes() *recentOutcomes {
	return &recentOutcomes{byDir: map[string]*outcomes{}}
}

// remember keeps a plan's outcomes findable by its image directory.
func (r *recentOutcomes) remember(dir string, o *outcomes) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for d, old := range r.byDir {
		if time.Since(old.at) > recentRestores {
			delete(r.byDir, d)
		}
	}
	r.byDir[resolvedDir(dir)] = o
}

// find is the outcomes of the latest restore from dir; nil if none is known.
func (r *recentOutcomes) find(dir string) *outcomes {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byDir[resolvedDir(dir)]
}

// wait runs a WaitRestored request.
func (r *recentOutcomes) wait(c *conn, id uint64, req *helperpb.WaitRestored) *helperpb.Response {
	o := r.find(req.ImageDir)
	if o == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no restore from %s is known to this helper", req.ImageDir)
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		rs, done, changed := o.snapshot()
		if done || ctx.Err() != nil {
			if c.cred.Uid != 0 {
				// Another user's processes are not this caller's business.
				o.mu.Lock()
				for cl := range o.byCl {
					cl.mu.Lock()
					uid := cl.uid
					cl.mu.Unlock()
					if uid != c.cred.Uid {
						o.mu.Unlock()
						return errResp(id, helperpb.ErrorCode_ERROR_PERMISSION, "uid %d may not see the restore from %s", c.cred.Uid, req.ImageDir)
					}
				}
				o.mu.Unlock()
			}
			return &helperpb.Response{Id: id, Body: &helperpb.Response_RestoreResults{RestoreResults: &helperpb.RestoreResults{Results: rs}}}
		}
		select {
		case <-changed:
		case <-ctx.Done():
		}
	}
}
