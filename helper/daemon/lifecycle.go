package daemon

// A client's lifecycle: one state machine, the only code that changes where a
// client is. The other files tell it what happened (an event, fired through
// the transition functions of this file) or ask it (the queries below); none
// of them reads or writes client.life.
//
// Locking: the registry's mu before cl.mu, never the other way round.
// cl.life is guarded by cl.mu; the registry a client moves through
// (registry.go: connected, by token and pid; parked, by pid) by its own mu,
// and a transition that moves it holds both.
//
// States, and the ClientState that Status shows for each:
//
//	registered  its calls connection is up; its control connection has not come up yet   RUNNING
//	up          its control connection came up; its gate is open                         RUNNING
//	quiesced    its gate is closed                                                        QUIESCED
//	dropped     its gate is closed and it gave its memory up (a checkpoint's drop, or it  DROPPED
//	            came back from a dump or a restore and waits for its memory)
//	detaching   a checkpoint asked it to detach for a CRIU dump; its connections close    DROPPED
//	detached    its connections closed while detaching: parked in s.waiting by pid; its   DROPPED
//	            memory is kept until the dump ends
//	prepared    memory a PrepareRestore made and is loading; no process yet. Lives only   DROPPED
//	            in its restore plan
//	restored    CRIU restored its process (Restored); parked in s.waiting until it        DROPPED
//	            reattaches with any token
//	gone        its memory is released (or being released); it is forgotten              as it was
//
// Transitions (lifeTable has them all; every other event is refused):
//
//	registered --control-up--> up
//	up, quiesced, dropped --quiesced--> quiesced, --dropped--> dropped, --resumed--> up:
//	    what the client did (its Ok to the helper's request) or says it is (Snapshot);
//	    the client is the authority on its gate. A new control connection (control-up)
//	    leaves them as they are.
//	dropped --detach--> detaching --parked--> detached --reattached--> dropped
//	            detaching --detach-failed--> dropped  (the Detach failed and it did not leave)
//	prepared --restored--> restored --reattached--> dropped
//	detaching, detached, restored --armed--> themselves: what to do once it is back
//	    (onAttach: give it its memory, run once its control connection is up)
//	registered, up, quiesced, dropped --calls-closed--> gone
//	detached, prepared, restored --released--> gone
//
// A reattached client is dropped, waiting for its memory; once it has it
// back (resumed) it is up, a client like any other: it can be checkpointed,
// detached and restored again any number of times.
//
// An event its state does not allow is refused: logged, returned as an
// error (*illegalTransition), the state left as it was. The caller decides
// what the refusal means: a checkpoint fails (and is undone), a control
// connection is turned away, a release leaves the memory alone.
//
// Processes are named by host pid, which the kernel reuses, and a container's
// processes share their pids inside it (every container's init is pid 1), so
// the helper never takes a pid alone as a process's identity:
//   - a prepared client is claimed only by the plugin connection whose
//     PrepareRestore made it (restore.go), never by another restore;
//   - every client but a prepared one holds its process (client.proc, a
//     pidfd): a process that takes its pid is never taken for it (a
//     reattach must come from that very process), a connected client whose
//     process exits is dropped at once (watchProcess), and the reaper
//     (reaper.go) releases the memory of a parked one whose process is gone,
//     so no stale entry outlives its process.

import (
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// lifeState is where a client is in its lifecycle.
type lifeState uint8

const (
	lifeRegistered lifeState = iota
	lifeUp
	lifeQuiesced
	lifeDropped
	lifeDetaching
	lifeDetached
	lifePrepared
	lifeRestored
	lifeGone
	numLifeStates
)

var lifeStateNames = [numLifeStates]string{"registered", "up", "quiesced", "dropped", "detaching", "detached",
	"prepared", "restored", "gone"}

func (st lifeState) String() string {
	if st < numLifeStates {
		return lifeStateNames[st]
	}
	return fmt.Sprintf("lifeState(%d)", int(st))
}

// lifeEvent is what happened to a client.
type lifeEvent uint8

const (
	// evControlUp: its control connection came up.
	evControlUp lifeEvent = iota
	// evQuiesced: it closed its gate (its Ok to Quiesce or Reimport), or
	// says it is quiesced.
	evQuiesced
	// evDropped: it gave its memory up (its Ok to Drop), or says so.
	evDropped
	// evResumed: it opened its gate (its Ok to Resume), or says it runs.
	evResumed
	// evDetach: a checkpoint asks it to detach for a dump.
	evDetach
	// evDetachFailed: the Detach failed and it did not leave.
	evDetachFailed
	// evParked: its calls connection closed while it was detaching.
	evParked
	// evReattached: its process came back (a calls Hello with a token).
	evReattached
	// evRestored: CRIU restored its process (Restored, or the adoption of
	// a process a dead helper left).
	evRestored
	// evArmed: what to do once it is back is set (onAttach).
	evArmed
	// evCallsClosed: its calls connection closed (not detaching).
	evCallsClosed
	// evReleased: its memory is released while it waits (its process is
	// gone, its dump ended with it, its restore failed).
	evReleased
	numLifeEvents
)

var lifeEventNames = [numLifeEvents]string{"control-up", "quiesced", "dropped", "resumed", "detach", "detach-failed",
	"parked", "reattached", "restored", "armed", "calls-closed", "released"}

func (ev lifeEvent) String() string {
	if ev < numLifeEvents {
		return lifeEventNames[ev]
	}
	return fmt.Sprintf("lifeEvent(%d)", int(ev))
}

// lifeTable is every transition: lifeTable[from][event] = to. An event a
// state has no entry for is illegal there.
var lifeTable = [numLifeStates]map[lifeEvent]lifeState{
	lifeRegistered: {evControlUp: lifeUp, evCallsClosed: lifeGone},
	lifeUp: {evControlUp: lifeUp, evQuiesced: lifeQuiesced, evDropped: lifeDropped, evResumed: lifeUp,
		evCallsClosed: lifeGone},
	lifeQuiesced: {evControlUp: lifeQuiesced, evQuiesced: lifeQuiesced, evDropped: lifeDropped, evResumed: lifeUp,
		evCallsClosed: lifeGone},
	lifeDropped: {evControlUp: lifeDropped, evQuiesced: lifeQuiesced, evDropped: lifeDropped, evResumed: lifeUp,
		evDetach: lifeDetaching, evCallsClosed: lifeGone},
	lifeDetaching: {evDetachFailed: lifeDropped, evParked: lifeDetached, evArmed: lifeDetaching},
	lifeDetached:  {evReattached: lifeDropped, evArmed: lifeDetached, evReleased: lifeGone},
	lifePrepared:  {evRestored: lifeRestored, evReleased: lifeGone},
	lifeRestored:  {evReattached: lifeDropped, evArmed: lifeRestored, evReleased: lifeGone},
	lifeGone:      {},
}

// nextState is where ev takes a client that is in st; false: ev may not
// happen there.
func nextState(st lifeState, ev lifeEvent) (lifeState, bool) {
	if st >= numLifeStates {
		return st, false
	}
	to, ok := lifeTable[st][ev]
	return to, ok
}

// shownState is the ClientState Status shows for a client in st (gone: none
// of its own; the client shows what it showed before).
func shownState(st lifeState) helperpb.ClientState {
	switch st {
	case lifeRegistered, lifeUp:
		return helperpb.ClientState_CLIENT_STATE_RUNNING
	case lifeQuiesced:
		return helperpb.ClientState_CLIENT_STATE_QUIESCED
	case lifeDropped, lifeDetaching, lifeDetached, lifePrepared, lifeRestored:
		return helperpb.ClientState_CLIENT_STATE_DROPPED
	}
	return helperpb.ClientState_CLIENT_STATE_UNSPECIFIED
}

// life is the part of a client that this file alone reads and changes,
// under the client's mu.
type life struct {
	st    lifeState
	shown helperpb.ClientState // what Status shows: shownState(st), kept as it was once gone
	// onAttach is what to do once it is back (armed), run when its control
	// connection is up.
	onAttach func()
	nsPid    proc.Pid     // prepared/restored: the pid inside its namespace, from the image
	wakeAs   proc.Pid     // prepared/restored: the pid its wake file is named after (the one it detached as)
	load     *restoreLoad // prepared/restored: the background load that fills its memory
	out      *outcomes    // prepared/restored, until it runs or fails: where its restore's result goes
}

func newLife(st lifeState) life { return life{st: st, shown: shownState(st)} }

// illegalTransition is the error of an event that the client's state does
// not allow; the state is left as it was.
type illegalTransition struct {
	pid  proc.Pid
	from lifeState
	ev   lifeEvent
}

func (e *illegalTransition) Error() string {
	return fmt.Sprintf("client %d is %s, where %s cannot happen", e.pid, e.from, e.ev)
}

// fireLocked moves cl on ev; cl.mu held. An illegal event changes nothing:
// it is logged and returned.
func (cl *client) fireLocked(ev lifeEvent) error {
	from := cl.life.st
	to, ok := nextState(from, ev)
	if !ok {
		cl.log.Warn("lifecycle: illegal transition refused", zap.Stringer("state", from), zap.Stringer("event", ev))
		return &illegalTransition{pid: cl.pid, from: from, ev: ev}
	}
	cl.life.st = to
	if to == lifeGone {
		cl.life.onAttach = nil
	} else {
		cl.life.shown = shownState(to)
	}
	if to != from {
		cl.log.Debug("lifecycle", zap.Stringer("from", from), zap.Stringer("event", ev), zap.Stringer("to", to))
	}
	return nil
}

// fire is fireLocked taking cl.mu.
func (cl *client) fire(ev lifeEvent) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.fireLocked(ev)
}

// ---- queries ----

// lifeState is where cl is now.
func (cl *client) lifeState() lifeState {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.life.st
}

// shownStateLocked is the ClientState Status shows for cl; cl.mu held.
func (cl *client) shownStateLocked() helperpb.ClientState { return cl.life.shown }

// waitingWhyLocked is what status says about a client the helper keeps
// memory for while it is not connected; cl.mu held.
func (cl *client) waitingWhyLocked() string {
	switch cl.life.st {
	case lifeDetached:
		return "detached for a dump; waits for the dump to end"
	case lifeRestored:
		return "restored from an image; waits for the process to come back"
	case lifePrepared:
		return "being restored from an image"
	}
	return "waiting"
}

// process is cl's process (nil: none yet).
func (cl *client) process() *proc.Process {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.proc
}

// parkedAs is what the reaper checks of a parked client: its pid, its
// process and its state.
func (cl *client) parkedAs() (pid proc.Pid, p *proc.Process, st lifeState) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.pid, cl.proc, cl.life.st
}

// preparedFor reports whether cl is a prepared client for the restored
// process pid: by pid when CRIU restored it into the helper's own pid
// namespace (sameNS), else by ns, its pid inside its own (0: unknown).
func (cl *client) preparedFor(pid proc.Pid, sameNS bool, ns proc.Pid) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.life.st == lifePrepared && ((sameNS && cl.pid == pid) || (!sameNS && ns != 0 && cl.life.nsPid == ns))
}

// restoreLoad is the load that fills a prepared or restored client's memory
// (nil once it reattached).
func (cl *client) restoreLoad() *restoreLoad {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.life.load
}

// outcomes is where the result of cl's restore goes (nil: none, or taken).
func (cl *client) outcomes() *outcomes {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.life.out
}

// takeOutcomes is outcomes, taken: the result is given once.
func (cl *client) takeOutcomes() *outcomes {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	out := cl.life.out
	cl.life.out = nil
	return out
}

// wakesAs is the pid cl's wake file is named after: the one it detached as
// (0: its own pid).
func (cl *client) wakesAs() proc.Pid {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.life.wakeAs
}

// waitsForWakeLocked reports whether w, parked as p, waits for the wake
// file named after pid as a restored process (two restores of one image
// wait for the same file); w.mu held.
func (w *client) waitsForWakeLocked(p, pid proc.Pid) bool {
	return w.life.st == lifeRestored && (w.life.wakeAs == pid || (w.life.wakeAs == 0 && p == pid))
}

// takeOnAttach takes what cl is to do once it is back (nil: nothing).
func (cl *client) takeOnAttach() func() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	f := cl.life.onAttach
	cl.life.onAttach = nil
	return f
}

// ---- transitions ----

// newClient is a new client of the process whose calls connection said
// Hello without a token: registered; the registry's connect makes it
// findable by token and pid.
func newClient(log *zap.Logger, p *proc.Process, uid, gid uint32, program string) *client {
	cl := &client{pid: p.Pid(), proc: p, uid: uid, gid: gid, program: program, token: newToken(), allocs: map[uint64]*alloc{},
		opSem: make(chan struct{}, 1), life: newLife(lifeRegistered)}
	cl.log = log.With(pidField("pid", cl.pid), zap.Uint32("uid", cl.uid), zap.String("program", cl.program))
	return cl
}

// newPreparedClient is a client for process pid of an image (ns: its pid
// inside its namespace) that a restore plan makes memory for: prepared, its
// memory uid's (the image's owner) until the process is back, filled by
// load, its result going to out.
func newPreparedClient(log *zap.Logger, pid, ns proc.Pid, uid uint32, load *restoreLoad, out *outcomes) *client {
	cl := &client{pid: pid, uid: uid, allocs: map[uint64]*alloc{}, opSem: make(chan struct{}, 1), log: log,
		life: newLife(lifePrepared)}
	cl.life.nsPid, cl.life.wakeAs, cl.life.load, cl.life.out = ns, pid, load, out
	out.add(cl)
	return cl
}

// errHasControl: a second control connection for a client that has one.
var errHasControl = errors.New("already has a control connection")

// controlUp makes ctl cl's control connection (control-up). errHasControl
// if it has one; an illegal transition (cl is not connected) if it may not
// have one now.
func (cl *client) controlUp(ctl *control) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.ctrl != nil {
		return errHasControl
	}
	if err := cl.fireLocked(evControlUp); err != nil {
		return err
	}
	cl.ctrl = ctl
	return nil
}

// reported records the state cl's own buffer table says it is in (a
// Snapshot's answer): the client is the authority on its gate.
// CLIENT_STATE_UNSPECIFIED says nothing.
func (cl *client) reported(st helperpb.ClientState) error {
	switch st {
	case helperpb.ClientState_CLIENT_STATE_UNSPECIFIED:
		return nil
	case helperpb.ClientState_CLIENT_STATE_RUNNING:
		return cl.fire(evResumed)
	case helperpb.ClientState_CLIENT_STATE_QUIESCED:
		return cl.fire(evQuiesced)
	case helperpb.ClientState_CLIENT_STATE_DROPPED:
		return cl.fire(evDropped)
	}
	cl.log.Warn("lifecycle: the client reports a state the helper does not know", zap.Stringer("reported", st))
	return fmt.Errorf("client %d reports state %v", cl.pid, st)
}

// arm sets what cl is to do once it is back (armed): f runs when its
// control connection is up after it reattached.
func (cl *client) arm(f func()) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if err := cl.fireLocked(evArmed); err != nil {
		return err
	}
	cl.life.onAttach = f
	return nil
}

// callsClosed handles the close of cl's calls connection. A client detaching
// for a dump is parked (true): it moves to the waiting list instead of
// losing its memory. Any other is gone (false): the caller releases its
// memory, then unregisters it.
func (r *registry) callsClosed(cl *client) (parked bool) {
	r.mu.Lock()
	cl.mu.Lock()
	if cl.life.st != lifeDetaching {
		_ = cl.fireLocked(evCallsClosed) // logged if illegal; its memory goes all the same
		cl.mu.Unlock()
		r.mu.Unlock()
		return false
	}
	_ = cl.fireLocked(evParked) // legal: detaching
	cl.mu.Unlock()
	r.disconnectLocked(cl)
	r.waiting[cl.pid] = cl
	r.mu.Unlock()
	cl.log.Info("client detached; its memory is kept until the dump ends")
	return true
}

// reattach finds the waiting client a calls Hello with a token comes from
// (p, the process that connected) and makes it connected again
// (reattached). It must be the very process the client waits for, not one
// that took its pid since. A detached client must present its token; a
// restored one presents the token of the process it was restored from,
// which another restore of the same image presents too, so it gets a new
// one. p becomes the client's, or is left to the caller if nil is returned.
func (r *registry) reattach(p *proc.Process, token uint64) *client {
	pid := p.Pid()
	r.mu.Lock()
	defer r.mu.Unlock()
	cl := r.waiting[pid]
	if cl == nil {
		return nil
	}
	cl.mu.Lock()
	if !proc.Same(cl.proc, p) {
		cl.mu.Unlock()
		cl.log.Warn("a process with a waiting client's pid is not that client's process; refused", zap.Stringer("process", p))
		return nil
	}
	switch {
	case cl.life.st == lifeDetached && cl.token == token:
	case cl.life.st == lifeRestored:
		cl.token = newToken()
	default:
		cl.mu.Unlock()
		return nil
	}
	_ = cl.fireLocked(evReattached) // legal: detached or restored
	// The same process, held twice now: the connection's hold stays.
	cl.proc.Close()
	cl.proc = p
	wakeAs := cl.life.wakeAs
	cl.life.wakeAs, cl.life.nsPid, cl.life.load = 0, 0, nil
	cl.mu.Unlock()
	delete(r.waiting, pid)
	r.connectLocked(cl)
	r.removeWakesLocked(pid, wakeAs)
	return cl
}

// parkRestored makes a prepared client the restored process p (CRIU's, or
// an orphan's that a dead helper left): it waits in the list until that
// process reattaches. A stale entry of a process that is gone under the same
// pid is taken out and returned, for the caller to reap. p becomes the
// client's, or is closed on an error.
func (r *registry) parkRestored(cl *client, p *proc.Process) (stale *client, err error) {
	pid := p.Pid()
	r.mu.Lock()
	old := r.waiting[pid]
	if old != nil && old != cl {
		if proc.Same(old.process(), p) {
			r.mu.Unlock()
			p.Close()
			return nil, fmt.Errorf("pid %d already waits for its GPU memory (%s)", pid, old.lifeState())
		}
		delete(r.waiting, pid) // its process is gone: that pid names another one now
	} else {
		old = nil
	}
	if c := r.byPID[pid]; c != nil && proc.Same(c.process(), p) {
		err = fmt.Errorf("pid %d is already a connected client of this helper", pid)
	} else {
		cl.mu.Lock()
		if err = cl.fireLocked(evRestored); err == nil {
			cl.pid = pid
			cl.proc = p
			cl.log = cl.log.With(pidField("restored_pid", pid))
		}
		cl.mu.Unlock()
		if err == nil {
			r.waiting[pid] = cl
		}
	}
	r.mu.Unlock()
	if err != nil {
		p.Close()
	}
	return old, err
}
