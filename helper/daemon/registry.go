package daemon

import (
	"cmp"
	"slices"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/proc"
)

// registry is where the helper finds its clients: connected ones by token
// and by pid, parked ones (detached for a dump, or restored and not back
// yet) by pid, and the client that owns each allocation. A client moves
// between its maps in one call (lifecycle.go decides when). It is guarded by
// the server's mu: every method expects it held.
type registry struct {
	byToken map[uint64]*client
	byPID   map[proc.Pid]*client
	waiting map[proc.Pid]*client
	owner   map[uint64]*client // allocation id -> its client
	sh      shares             // memory shared between clients (sharing.go)
}

func newRegistry() registry {
	return registry{byToken: map[uint64]*client{}, byPID: map[proc.Pid]*client{}, waiting: map[proc.Pid]*client{},
		owner: map[uint64]*client{}, sh: newShares()}
}

// connect makes cl findable by its token and its pid.
func (r *registry) connect(cl *client) {
	r.byToken[cl.token] = cl
	r.byPID[cl.pid] = cl
}

// disconnect forgets a connected client (its pid entry only if it is still
// cl's: another client may have the pid now).
func (r *registry) disconnect(cl *client) {
	delete(r.byToken, cl.token)
	if r.byPID[cl.pid] == cl {
		delete(r.byPID, cl.pid)
	}
}

// park moves a connected client to the waiting list.
func (r *registry) park(cl *client) {
	r.disconnect(cl)
	r.waiting[cl.pid] = cl
}

// wait puts cl into the waiting list under pid (a restored process).
func (r *registry) wait(pid proc.Pid, cl *client) { r.waiting[pid] = cl }

// unpark takes cl out of the waiting list; false if it is not there (a
// reattach, the reaper took it first).
func (r *registry) unpark(cl *client) bool {
	if r.waiting[cl.pid] != cl {
		return false
	}
	delete(r.waiting, cl.pid)
	return true
}

// forgetWaiting drops whatever waits under pid.
func (r *registry) forgetWaiting(pid proc.Pid) { delete(r.waiting, pid) }

func (r *registry) waitingFor(pid proc.Pid) *client  { return r.waiting[pid] }
func (r *registry) connectedAs(pid proc.Pid) *client { return r.byPID[pid] }
func (r *registry) withToken(t uint64) *client       { return r.byToken[t] }

// own records that allocation id is cl's; ownerOf and disown read and undo it.
func (r *registry) own(id uint64, cl *client) { r.owner[id] = cl }
func (r *registry) ownerOf(id uint64) *client { return r.owner[id] }
func (r *registry) disown(id uint64)          { delete(r.owner, id) }

// connectedClients and waitingClients list the clients, by pid.
func (r *registry) connectedClients() []*client { return byPid(r.byToken) }
func (r *registry) waitingClients() []*client   { return byPid(r.waiting) }

func byPid[K comparable](m map[K]*client) []*client {
	out := make([]*client, 0, len(m))
	for _, cl := range m {
		out = append(out, cl)
	}
	slices.SortFunc(out, func(a, b *client) int { return cmp.Compare(a.pid, b.pid) })
	return out
}

// pidField logs a pid as a number.
func pidField(key string, p proc.Pid) zap.Field { return zap.Int32(key, int32(p)) }
