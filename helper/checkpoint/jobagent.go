package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/gpucr/gpucr/helper/fault"
	"github.com/gpucr/gpucr/helper/proc"
)

// The agent of a job's part: `gpucr job-agent`, which the coordinator runs
// on each host over ssh, does what the coordinator asks of this host's
// part, one request at a time, and holds at the job's barriers until the
// coordinator says go. Whatever ends the conversation while the part is
// stopped (the coordinator's abort, its ssh session gone) gives the part
// back, running.

// JobAgentOptions is how the agent runs CRIU (as `gpucr checkpoint` would).
type JobAgentOptions struct {
	CRIU   CRIU
	Env    Environment
	Events Events // the dump's and the restore's, for this host's log
	// Fault is the failure injected for tests (GPUCR_FAULT: one of
	// fault.Job); none by default.
	Fault fault.Injected
}

// jobAgent is one agent's state.
type jobAgent struct {
	o       JobAgentOptions
	out     *jobLine
	in      chan jobMsg
	pid     proc.Pid // the part (prepare)
	gpu     *jobGPU  // its GPU processes held (hold), until the dump ends
	mark    string   // this part's mark beside its image directory (markDir)
	faulted bool     // the injected fault job-in-flight-once happened
	// restored: the tree a restore made, held from the restore's barrier
	// on (by pidfds: an end never reaches a process that took a pid of
	// one that died)
	restored []*proc.Process
	// aborted: await consumed the coordinator's abort (the failure that
	// follows is its answer, evAborted, not an error of this part)
	aborted bool
}

// defaultDrainTimeout bounds the wait for a part's connections to drain
// when the coordinator names no bound.
const defaultDrainTimeout = 10 * time.Second

// ServeJobAgent answers the coordinator's requests on in with events on
// out until in ends.
func ServeJobAgent(ctx context.Context, in io.Reader, out io.Writer, o JobAgentOptions) error {
	a := &jobAgent{o: o, out: &jobLine{w: out}, in: make(chan jobMsg, 8)}
	readErr := make(chan error, 1)
	go func() { readErr <- readJobMsgs(in, a.in); close(a.in) }()
	defer func() { a.gpu.close(); proc.CloseAll(a.restored); a.removeMark() }()
	for {
		m, ok := <-a.in
		if !ok {
			return <-readErr
		}
		var err error
		switch m.Op {
		case opPrepare:
			err = a.prepare(m)
		case opMarkDir:
			err = a.markDir(m)
		case opFindMarks:
			err = a.findMarks()
		case opHold:
			err = a.hold(ctx)
		case opQuiesce:
			err = a.quiesce(ctx, m)
		case opDump:
			err = a.dump(ctx, m)
		case opRestorePrepare:
			err = a.restorePrepare(m)
		case opRestore:
			err = a.restore(ctx, m)
		case opEnd:
			err = a.endRestored()
		case opAbort:
			// before the dump, or after this part failed on its own: it
			// runs (or never stopped) once its GPU processes are let go
			a.gpu.close()
			a.gpu = nil
			err = a.out.send(jobMsg{Event: evAborted, Running: a.pid != 0 && runs(a.pid)})
		default:
			err = a.fail(fmt.Errorf("unknown request %q", m.Op))
		}
		if err != nil {
			return err // the coordinator is gone
		}
	}
}

// fail tells the coordinator the request failed; its error is the
// coordinator's being gone.
func (a *jobAgent) fail(err error) error {
	return a.out.send(jobMsg{Event: evError, Error: err.Error()})
}

// failed answers a dump or a restore that failed: the answer to the abort
// that made it fail, or this part's own error.
func (a *jobAgent) failed(err error) error {
	if a.aborted {
		// CRIU's failure is the abort's doing: its message (a log that is
		// gone with the aborted dump's directory) says nothing more
		a.aborted = false
		return a.out.send(jobMsg{Event: evAborted, Running: runs(a.pid),
			Notes: []string{"stopped at the job's barrier and undone (CRIU resumed the tree)"}})
	}
	return a.fail(err)
}

// await waits for the coordinator's op: an abort, or the coordinator gone,
// is an error.
func (a *jobAgent) await(ctx context.Context, op string) error {
	select {
	case m, ok := <-a.in:
		switch {
		case !ok:
			return errors.New("the job's coordinator is gone")
		case m.Op == opAbort:
			a.aborted = true
			return errAborted
		case m.Op != op:
			return fmt.Errorf("the job's coordinator asked %q, not %q", m.Op, op)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// prepare looks at the part: its connections to peers outside its tree.
func (a *jobAgent) prepare(m jobMsg) error {
	if !proc.Exists(m.Pid) {
		return a.fail(fmt.Errorf("no process %d", m.Pid))
	}
	a.pid = m.Pid
	return a.out.send(jobMsg{Event: evPrepared, Conns: OutsideConns(m.Pid)})
}

// hold holds the part's GPU processes where they are and says the highest
// count of peer sync operations among them.
func (a *jobAgent) hold(ctx context.Context) error {
	if a.pid == 0 || a.gpu != nil {
		return a.fail(errors.New("hold before prepare, or twice"))
	}
	g, top, err := holdGPU(ctx, a.o.Env.Socket, a.pid, defaultQuiesceTimeout)
	if err != nil {
		return a.fail(err)
	}
	a.gpu = g
	return a.out.send(jobMsg{Event: evHeld, SyncCount: top, GPUProcesses: len(g.clients)})
}

// quiesce brings the part's GPU processes to the job's count of peer sync
// operations, then quiesces and drains them.
func (a *jobAgent) quiesce(ctx context.Context, m jobMsg) error {
	if a.gpu == nil {
		return a.fail(errors.New("quiesce before hold"))
	}
	timeout := time.Duration(m.QuiesceMillis) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultQuiesceTimeout
	}
	if err := a.gpu.quiesce(ctx, m.SyncTarget, timeout); err != nil {
		return a.fail(err)
	}
	return a.out.send(jobMsg{Event: evQuiesced})
}

// dump dumps the part at the job's cut and leaves it stopped, then commits
// or gives it back as the coordinator says.
func (a *jobAgent) dump(ctx context.Context, m jobMsg) error {
	if a.pid == 0 || !filepath.IsAbs(m.Dir) {
		return a.fail(errors.New("dump before prepare, or without an absolute image directory"))
	}
	if a.o.Fault.Is(fault.JobInFlightOnce) && !a.faulted {
		// as a dump that met a connection in flight: this part runs on
		a.faulted = true
		return a.out.send(jobMsg{Event: evError, InFlight: true,
			Error: "injected fault (GPUCR_FAULT=job-in-flight-once): CRIU refused an in-flight TCP connection"})
	}
	// Held from now on by pidfds: a signal of the commit or the abort
	// never reaches a process that took the pid of one that died.
	held, err := proc.HoldTree(a.pid)
	if err != nil {
		return a.fail(fmt.Errorf("holding the tree of %d: %w", a.pid, err))
	}
	defer func() { proc.CloseAll(held) }()
	_, statErr := os.Lstat(m.Dir)
	dirExisted := statErr == nil
	drain := time.Duration(m.DrainMillis) * time.Millisecond
	if drain <= 0 {
		drain = defaultDrainTimeout
	}
	var lost error // the conversation ended while the dump waited
	part := &JobPart{Conns: m.Conns, Frozen: func() error {
		// Every part's tree is frozen before any part's sockets are read,
		// and nothing of the job's connections is in flight: see
		// docs/job-checkpoint.md.
		if err := a.out.send(jobMsg{Event: evFrozen}); err != nil {
			lost = err
			return err
		}
		if err := a.await(ctx, opDrain); err != nil {
			return err
		}
		full, err := waitDrained(ctx, a.pid, m.Conns, drain)
		if err != nil {
			return err
		}
		if err := a.out.send(jobMsg{Event: evDrained, Unsent: full}); err != nil {
			lost = err
			return err
		}
		return a.await(ctx, opGo)
	}}
	res, err := Dump(ctx, DumpOptions{Pid: a.pid, Dir: m.Dir, LeaveStopped: true, CRIU: a.o.CRIU, Env: a.o.Env, Events: a.o.Events, Job: part})
	// The dump checkpointed the GPU processes it held (or, failed, gave
	// them back): the holds end.
	a.gpu.close()
	a.gpu = nil
	if lost != nil {
		return lost
	}
	if err != nil {
		// A failed dump leaves the tree running. One the coordinator
		// aborted got past the dump's checks, so its directory was new or
		// empty: CRIU's log of the aborted run goes too, as the image of an
		// aborted checkpoint does.
		// A dump met by a connection in flight is taken again with the
		// whole job, into this directory too, as new or empty as it was.
		retried := !a.aborted && inFlight(err)
		if a.aborted || retried {
			_ = removeImage(m.Dir, dirExisted)
		}
		if retried {
			return a.out.send(jobMsg{Event: evError, Error: err.Error(), InFlight: true})
		}
		return a.failed(err)
	}
	held = proc.AddDescendants(held)
	if a.o.Fault.Is(fault.JobAfterDump) {
		running, notes := a.giveBack(res, held, m.Dir, dirExisted)
		return a.out.send(jobMsg{Event: evError, Error: "injected fault (GPUCR_FAULT=job-after-dump): the part failed once dumped",
			Running: running, Notes: notes})
	}
	result, _ := json.Marshal(res)
	if err := a.out.send(jobMsg{Event: evDumped, Result: result}); err != nil {
		a.giveBack(res, held, m.Dir, dirExisted)
		return err
	}
	// stopped, dumped: the coordinator decides
	next, ok := <-a.in
	if !ok || next.Op != opCommit {
		running, notes := a.giveBack(res, held, m.Dir, dirExisted)
		if !ok {
			return errors.New("the job's coordinator is gone: the part was given back")
		}
		return a.out.send(jobMsg{Event: evAborted, Running: running, Notes: notes})
	}
	notes, err := a.commit(next, res, held, m)
	if err != nil {
		return a.out.send(jobMsg{Event: evError, Error: err.Error(), Notes: notes})
	}
	return a.out.send(jobMsg{Event: evDone, Notes: notes})
}

// giveBack continues a stopped part (SIGCONT, its GPU back) and removes
// the image it left, which no job's record names: says whether it runs.
func (a *jobAgent) giveBack(res *DumpResult, held []*proc.Process, dir string, dirExisted bool) (bool, []string) {
	running, notes := continueSource(a.o.Env.Socket, res, held, nil)
	if err := removeImage(dir, dirExisted); err != nil {
		notes = append(notes, fmt.Sprintf("the image %s of the aborted checkpoint could not be removed: %v", dir, err))
	} else {
		notes = append(notes, "removed the image "+dir+" of the aborted checkpoint")
	}
	return running, notes
}

// removeImage removes what a dump put in dir: dir itself if the dump made
// it, else what it holds (it was empty: a dump refuses anything else).
func removeImage(dir string, dirExisted bool) error {
	if !dirExisted {
		return os.RemoveAll(dir)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// commit ends a dumped part (or, with LeaveRunning, continues it) and
// writes its job record, which makes the image a part of the job's
// checkpoint.
func (a *jobAgent) commit(m jobMsg, res *DumpResult, held []*proc.Process, dm jobMsg) ([]string, error) {
	var notes []string
	if m.Record == nil {
		return nil, errors.New("a commit without the job's record")
	}
	if err := writeJobRecord(dm.Dir, *m.Record); err != nil {
		return nil, err
	}
	if dm.LeaveRunning {
		running, n := continueSource(a.o.Env.Socket, res, held, notes)
		if !running {
			return n, errors.New("the part, checkpointed, does not run on")
		}
		return n, nil
	}
	// Reset the job's connections first: a part killed with its
	// connections open would leave their endpoints in TIME_WAIT on one
	// host, for a minute, and a restore could not make them again.
	if err := endJobConns(a.pid, dm.Conns); err != nil {
		notes = append(notes, fmt.Sprintf("%v: a restore within a minute may find their endpoints taken", err))
	}
	if left := killHeld(context.Background(), held); left != "" {
		notes = append(notes, "the part's processes, killed, still hold their pids: "+left)
	}
	return notes, nil
}

// runs says whether pid is there and not stopped.
func runs(pid proc.Pid) bool {
	st, err := proc.ReadStat(pid)
	return err == nil && st.State != 'T' && st.State != 't' && st.State != 'Z'
}

// restorePrepare reads the part's job record.
func (a *jobAgent) restorePrepare(m jobMsg) error {
	r, err := readJobRecord(m.Dir)
	if err != nil {
		return a.fail(err)
	}
	return a.out.send(jobMsg{Event: evReady, Record: r})
}

// restore restores the part, holding it at the job's barrier once CRIU has
// made it (its sockets still in repair mode) until every part is made.
func (a *jobAgent) restore(ctx context.Context, m jobMsg) error {
	var lost error
	root, err := imageRoot(m.Dir)
	if err != nil {
		return a.fail(err)
	}
	res, err := Restore(ctx, RestoreOptions{Dir: m.Dir, CRIU: a.o.CRIU, Env: a.o.Env, Events: a.o.Events, Restored: func() error {
		// CRIU made the tree (the image's pids): held from here, so that
		// a failure of any part after the go can end it
		if held, err := proc.HoldTree(root); err == nil {
			a.restored = held
		}
		if err := a.out.send(jobMsg{Event: evMade}); err != nil {
			lost = err
			return err
		}
		return a.await(ctx, opGo)
	}})
	if lost != nil {
		return lost
	}
	if err != nil {
		return a.failed(err) // CRIU killed what it had restored, or the GPU memory did not come back
	}
	if a.o.Fault.Is(fault.JobAfterRestore) {
		return a.fail(errors.New("injected fault (GPUCR_FAULT=job-after-restore): the part failed once restored"))
	}
	result, _ := json.Marshal(res)
	return a.out.send(jobMsg{Event: evRestored, Result: result})
}

// endRestored ends the tree this agent's restore made (another part failed
// after the restore's go: a job with a part missing only waits for it)
// and says whether anything of it still runs.
func (a *jobAgent) endRestored() error {
	held := proc.AddDescendants(a.restored)
	var notes []string
	left := killHeld(context.Background(), held) // the restored root is this agent's child: reaped
	if left != "" {
		notes = append(notes, "killed, still there: "+left)
	}
	proc.CloseAll(held)
	a.restored = nil
	return a.out.send(jobMsg{Event: evEnded, Running: left != "", Notes: notes})
}

// imageRoot is the pid of the root of the tree an image restores (the
// first process of pstree.img).
func imageRoot(dir string) (proc.Pid, error) {
	pids, err := imagePids(dir)
	if err != nil {
		return 0, err
	}
	return pids[0], nil
}
