package daemon

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/proc"
)

// registry is where the helper finds its clients: connected ones by token
// and by pid, parked ones (detached for a dump, or restored and not back
// yet) by pid, prepared ones in the restore plans that made them, and the
// client that owns each allocation, with the memory clients share
// (sharing.go). A client moves between its maps in one call, under the
// registry's own lock (lifecycle.go decides when); the wake files that
// parked clients wait for are removed under that lock too, so that a
// client that starts to wait for one is seen.
//
// Lock order: r.mu before a client's mu, never the other way round; r.mu is
// taken inside gpuReservations' lock (limits.go), and takes no other part's.
type registry struct {
	wakes *wakeFiles

	mu      sync.Mutex
	byToken map[uint64]*client
	byPID   map[proc.Pid]*client
	waiting map[proc.Pid]*client
	owner   map[uint64]*client    // allocation id -> its client
	sh      shares                // memory shared between clients (sharing.go)
	plans   map[*restorePlan]bool // restores being prepared (restore.go)
}

func newRegistry(wakes *wakeFiles) *registry {
	return &registry{wakes: wakes, byToken: map[uint64]*client{}, byPID: map[proc.Pid]*client{},
		waiting: map[proc.Pid]*client{}, owner: map[uint64]*client{}, sh: newShares(), plans: map[*restorePlan]bool{}}
}

// connect makes a new client findable by its token and its pid.
func (r *registry) connect(cl *client) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.connectLocked(cl)
}

func (r *registry) connectLocked(cl *client) {
	r.byToken[cl.token] = cl
	r.byPID[cl.pid] = cl
}

// disconnect forgets a connected client that is gone (its pid entry only if
// it is still cl's: another client may have the pid now): it leaves the
// status list.
func (r *registry) disconnect(cl *client) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disconnectLocked(cl)
}

func (r *registry) disconnectLocked(cl *client) {
	delete(r.byToken, cl.token)
	if r.byPID[cl.pid] == cl {
		delete(r.byPID, cl.pid)
	}
}

// unpark takes cl out of the waiting list; false if it is not there (a
// reattach, the reaper took it first).
func (r *registry) unpark(cl *client) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.waiting[cl.pid] != cl {
		return false
	}
	delete(r.waiting, cl.pid)
	return true
}

// waitingFor, connectedAs and withToken look a client up.
func (r *registry) waitingFor(pid proc.Pid) *client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting[pid]
}

func (r *registry) connectedAs(pid proc.Pid) *client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byPID[pid]
}

func (r *registry) withToken(t uint64) *client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byToken[t]
}

// detachedAs is the client parked as pid while a dump holds it detached
// (nil: none).
func (r *registry) detachedAs(pid proc.Pid) *client {
	cl := r.waitingFor(pid)
	if cl == nil || cl.lifeState() != lifeDetached {
		return nil
	}
	return cl
}

// parkedWithin reports whether cl is in the waiting list within d.
func (r *registry) parkedWithin(cl *client, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		ok := r.waitingFor(cl.pid) == cl
		if ok || time.Now().After(deadline) {
			return ok
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// own records that allocation id is cl's; ownerOf and disown read and undo it.
func (r *registry) own(id uint64, cl *client) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.owner[id] = cl
}

func (r *registry) ownerOf(id uint64) *client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owner[id]
}

func (r *registry) disown(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.owner, id)
}

// connectedClients and waitingClients list the clients, by pid.
func (r *registry) connectedClients() []*client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return byPid(r.byToken)
}

func (r *registry) waitingClients() []*client {
	r.mu.Lock()
	defer r.mu.Unlock()
	return byPid(r.waiting)
}

func byPid[K comparable](m map[K]*client) []*client {
	out := make([]*client, 0, len(m))
	for _, cl := range m {
		out = append(out, cl)
	}
	slices.SortFunc(out, func(a, b *client) int { return cmp.Compare(a.pid, b.pid) })
	return out
}

// everyClient is every client the helper holds memory for: connected,
// parked, or prepared by a restore plan (the GPU memory limit counts them
// all).
func (r *registry) everyClient() map[*client]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[*client]bool{}
	for _, cl := range r.byToken {
		seen[cl] = true
	}
	for _, cl := range r.waiting {
		seen[cl] = true
	}
	for p := range r.plans {
		for _, cl := range p.clients {
			seen[cl] = true
		}
	}
	return seen
}

// heldBy is the GPU memory the clients of uid hold.
func (r *registry) heldBy(uid uint32) uint64 {
	var held uint64
	for cl := range r.everyClient() {
		cl.mu.Lock()
		if cl.uid == uid {
			held += cl.bytes
		}
		cl.mu.Unlock()
	}
	return held
}

// trackPlan makes the plan's memory its clients' (ownership checks) and
// shows the plan in status until dropPlan.
func (r *registry) trackPlan(p *restorePlan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cl := range p.clients {
		for aid := range cl.allocs {
			r.owner[aid] = cl
		}
	}
	r.plans[p] = true
}

func (r *registry) dropPlan(p *restorePlan) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.plans, p)
}

// preparedClients are the clients of the plans still prepared (no process
// claimed them yet).
func (r *registry) preparedClients() []*client {
	r.mu.Lock()
	var all []*client
	for p := range r.plans {
		all = append(all, p.clients...)
	}
	r.mu.Unlock()
	var out []*client
	for _, cl := range all {
		if cl.lifeState() == lifePrepared {
			out = append(out, cl)
		}
	}
	return out
}

// takeContinued takes every parked client that a dump left stopped and
// whose process has been continued since (stopped.go): each is to get its
// GPU back once.
func (r *registry) takeContinued() []*client {
	r.mu.Lock()
	defer r.mu.Unlock()
	var cont []*client
	for _, cl := range r.waiting {
		// Stopped is false for a process that has exited too: the reaper
		// releases that one
		if cl.stoppedAfterDump && cl.lifeState() == lifeDetached && cl.process().Running() && !cl.process().Stopped() {
			cl.stoppedAfterDump = false
			cont = append(cont, cl)
		}
	}
	return cont
}

// leftStopped marks cl as a process a dump left stopped.
func (r *registry) leftStopped(cl *client) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cl.stoppedAfterDump = true
}

// removeWakes removes the wake files a parked process pid waited for: its
// own, and wakeAs's (the pid it detached as; 0 or pid: none other).
func (r *registry) removeWakes(pid, wakeAs proc.Pid) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removeWakesLocked(pid, wakeAs)
}

func (r *registry) removeWakesLocked(pid, wakeAs proc.Pid) {
	r.removeWakeLocked(pid, pid)
	if wakeAs != 0 && wakeAs != pid {
		r.removeWakeLocked(wakeAs, pid)
	}
}

// removeWakeLocked removes the wake file named after pid unless a client
// other than the one now waiting as self still waits for it (two restores
// of one image wait for the same file).
func (r *registry) removeWakeLocked(pid, self proc.Pid) {
	for p, w := range r.waiting {
		if p == self {
			continue
		}
		w.mu.Lock()
		shared := w.waitsForWakeLocked(p, pid)
		w.mu.Unlock()
		if shared {
			return
		}
	}
	r.wakes.remove(pid)
}

// pidField logs a pid as a number.
func pidField(key string, p proc.Pid) zap.Field { return zap.Int32(key, int32(p)) }
