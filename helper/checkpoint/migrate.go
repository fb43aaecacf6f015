package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
)

// A live migration: the tree is dumped and left stopped, its image goes to
// the target, the target restores it, and only then is the source killed.
// Until the target runs, every failure continues the source where it
// stopped, with its GPU.

// Target is the machine a migration goes to.
type Target interface {
	// Name is the target, for messages ("root@10.0.0.2").
	Name() string
	// Check makes sure the target can restore (its gpucr answers), before
	// anything is stopped.
	Check(ctx context.Context) error
	// Receive makes the image in localDir available at the target and
	// says where, and what went over. On error, Received.Dir is what
	// Discard is to remove ("": nothing there is this migration's).
	Receive(ctx context.Context, localDir string) (Received, error)
	// Restore restores the image in remoteDir at the target.
	Restore(ctx context.Context, remoteDir string) (*RestoreResult, error)
	// Discard removes what Receive put at the target (a failed migration).
	Discard(ctx context.Context, remoteDir string) error
}

// Received is an image a Target received.
type Received struct {
	Dir   string // its directory at the target
	Bytes int64  // the files' bytes that went over
	// NotSent are entries of the local directory that did not go: another
	// user's, or neither a directory nor a regular file (image.Send).
	NotSent []string
}

// MigrateOptions is a live migration of the tree of Pid to Target.
type MigrateOptions struct {
	Pid proc.Pid
	// Dir is the local image directory (absolute, new or empty; with Force
	// an image it holds is replaced, as a checkpoint's Force does).
	Dir    string
	Force  bool
	Target Target
	// PreCopy copies the GPU memory while the tree still runs here, before
	// the stop (DumpOptions.PreCopy): the downtime pays only for what
	// changed since the last round. A streamed image's rounds are sent to
	// the target before the stop too, and the stop sends only the rest.
	PreCopy PreCopy
	CRIU    CRIU
	Env     Environment
	Events  Events
}

// MigrateResult is a migration that succeeded.
type MigrateResult struct {
	Pid    proc.Pid `json:"pid"`    // the source's root
	Target string   `json:"target"` // where it runs now
	// TargetPid is its root's pid there (in the target's pid namespace).
	TargetPid proc.Pid `json:"target_pid"`
	ImagesDir string   `json:"images_dir"`
	RemoteDir string   `json:"remote_dir"`
	// Downtime is from the start of the dump (CRIU freezes the tree then)
	// to the target's report that the tree runs there with its GPU memory
	// (restored on demand: that it runs there, its GPU data still coming).
	DowntimeSeconds float64 `json:"downtime_seconds"`
	DumpSeconds     float64 `json:"dump_seconds"`
	TransferSeconds float64 `json:"transfer_seconds"`
	RestoreSeconds  float64 `json:"restore_seconds"` // the target's restore, as this end waited for it
	TransferBytes   int64   `json:"transfer_bytes"`
	// PreCopyBytesSent: a streamed image's pre-copy rounds, sent to the
	// target before the stop (TransferBytes is what went during it).
	PreCopyBytesSent int64          `json:"pre_copy_bytes_sent,omitempty"`
	Dump             *DumpResult    `json:"dump"`
	Restore          *RestoreResult `json:"restore"`
}

// MigrateError is a migration that failed after the source was stopped: the
// source has been continued (or why it could not be), and the target's copy
// discarded.
type MigrateError struct {
	Step          string // "transfer", "restore"
	Err           error
	SourceRunning bool     // the source runs on with its GPU
	Notes         []string // what was done afterwards
}

func (e *MigrateError) Error() string {
	s := fmt.Sprintf("migration failed in its %s: %v", e.Step, e.Err)
	for _, n := range e.Notes {
		s += "\n  " + n
	}
	return s
}

func (e *MigrateError) Unwrap() error { return e.Err }

// restoreMargin is what a migration waits for the target's restore beyond
// CRIU's own deadline there (the GPU memory's wait after CRIU).
const restoreMargin = 2 * time.Minute

// sourceBackWait bounds how long a failed migration waits for the source's
// GPU processes to have their GPU back.
const sourceBackWait = 30 * time.Second

// Migrate moves the tree of o.Pid to o.Target.
func Migrate(ctx context.Context, o MigrateOptions) (*MigrateResult, error) {
	ev := &emitter{out: o.Events, start: time.Now()}
	if o.Target == nil {
		return nil, errors.New("migration without a target")
	}
	if c, ok := o.Target.(io.Closer); ok {
		defer c.Close()
	}
	if err := o.Target.Check(ctx); err != nil {
		return nil, fmt.Errorf("migration refused before anything was stopped: target %s: %w", o.Target.Name(), err)
	}
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("target %s answers", o.Target.Name())})
	// The source is signalled at the end (SIGKILL once the target runs,
	// SIGCONT if the migration fails): its processes are held from now on,
	// each by a pidfd, so that a signal never reaches a process that took
	// the pid of one that died meanwhile.
	held, err := proc.HoldTree(o.Pid)
	if errors.Is(err, proc.ErrGone) {
		return nil, fmt.Errorf("no process %d", o.Pid) // as a checkpoint says it
	}
	if err != nil {
		return nil, fmt.Errorf("migration of %d refused before anything was stopped: %w", o.Pid, err)
	}
	defer func() { proc.CloseAll(held) }()
	// A connection the dump would refuse (autoopts.go) is refused before
	// the pre-copy rounds stop the tree's GPU processes even briefly; the
	// dump looks again, and chooses its options, when it runs.
	if _, _, err := chooseCRIUOptions(o.Pid, proc.Pids(held), o.CRIU); err != nil {
		return nil, err
	}
	// A streamed image's pre-copy rounds go to the target while the tree
	// runs: the stop then sends only the rest.
	var early *preCopyResult
	var earlyDir string
	var earlySent int64
	made := &madeDirs{} // the image directory, if the rounds made it: gone again if nothing is dumped
	st, streamed := o.Target.(*SSHTarget)
	if streamed && o.PreCopy.Rounds > 0 && !st.Shared {
		if early, earlyDir, earlySent, err = preCopyAhead(ctx, o, st, ev, made); err != nil {
			made.removeEmpty()
			return nil, err
		}
	}
	t0 := time.Now()
	// the dump's events, timed from the migration's start
	dumpEvents := func(e Event) { e.Elapsed += t0.Sub(ev.start); ev.out.send(e) }
	dopts := DumpOptions{Pid: o.Pid, Dir: o.Dir, LeaveStopped: true, Force: o.Force, PreCopy: o.PreCopy,
		CRIU: o.CRIU, Env: o.Env, Events: dumpEvents}
	if early != nil {
		dopts.preCopied, dopts.Parent, dopts.PreCopy = early, early.last, PreCopy{}
	}
	dump, err := Dump(ctx, dopts)
	if err != nil {
		if earlyDir != "" {
			_ = discard(o.Target, earlyDir)
			_ = os.RemoveAll(filepath.Join(o.Dir, PreCopyDir))
		}
		made.removeEmpty()
		return nil, err // a failed dump leaves the tree running
	}
	if early == nil {
		t0 = t0.Add(time.Duration(dump.PreCopySeconds * float64(time.Second))) // the tree ran during the rounds
	}
	// A process forked after the tree was held was dumped too: it is
	// found through its parent, which (stopped now) forks no other.
	held = proc.AddDescendants(held)
	res := &MigrateResult{Pid: o.Pid, Target: o.Target.Name(), ImagesDir: o.Dir, Dump: dump, DumpSeconds: time.Since(t0).Seconds(),
		PreCopyBytesSent: earlySent}
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("dumped in %.3f s; the source is stopped", res.DumpSeconds)})
	// From here on the source is stopped: whatever fails continues it.
	fail := func(step string, err error, remoteDir string) error {
		me := &MigrateError{Step: step, Err: err}
		if remoteDir != "" {
			if derr := discard(o.Target, remoteDir); derr != nil {
				me.Notes = append(me.Notes, fmt.Sprintf("the image at the target (%s) could not be removed: %v", remoteDir, derr))
			}
		}
		me.SourceRunning, me.Notes = continueSource(o.Env.Socket, dump, held, me.Notes)
		me.Notes = append(me.Notes, "the image stays in "+o.Dir)
		return me
	}
	t1 := time.Now()
	var rcv Received
	if earlyDir != "" {
		// the rest: all but the rounds, into the directory they went to
		rcv, err = st.receivePart(ctx, o.Dir, false, func(rel string) bool { return !inPreCopy(rel) })
		rcv.Dir = earlyDir
	} else {
		rcv, err = o.Target.Receive(ctx, o.Dir)
	}
	warnNotSent(ev, o.Dir, rcv.NotSent)
	remoteDir, sent := rcv.Dir, rcv.Bytes
	if err != nil {
		return nil, fail("transfer", err, remoteDir)
	}
	res.RemoteDir, res.TransferBytes, res.TransferSeconds = remoteDir, sent, time.Since(t1).Seconds()
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("image at %s:%s (%d bytes sent in %.3f s)", o.Target.Name(), remoteDir, sent, res.TransferSeconds)})
	t2 := time.Now()
	// Not cancelled midway: a restore cut off at the target could leave the
	// tree running there while the source goes on here. An interrupt
	// waits for its outcome (bounded by CRIU's deadline there), which
	// decides which copy runs on.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), o.CRIU.timeout()+restoreMargin)
	stopNote := context.AfterFunc(ctx, func() {
		ev.emit(Event{Kind: Warning, Text: "interrupted while the target restores: waiting for its outcome, so that one copy runs on"})
	})
	restored, err := o.Target.Restore(rctx, remoteDir)
	stopNote()
	rcancel()
	if err != nil {
		return nil, fail("restore", err, remoteDir)
	}
	res.Restore, res.TargetPid, res.RestoreSeconds = restored, restored.Pid, time.Since(t2).Seconds()
	res.DowntimeSeconds = time.Since(t0).Seconds()
	if rd := restored.Ready; rd.GPUResident > rd.GPULaunch && rd.GPULaunch > 0 && restored.Seconds > rd.GPULaunch {
		// On demand: the tree ran before the target's command ended, which
		// waited for the rest of its GPU data.
		res.DowntimeSeconds -= restored.Seconds - rd.GPULaunch
	}
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("runs at %s as pid %d", o.Target.Name(), restored.Pid)})
	// The target runs: the source goes (a process of it that died
	// meanwhile is simply gone).
	if left := killHeld(ctx, held); left != "" {
		ev.emit(Event{Kind: Warning, Text: "the source's processes, killed, still hold their pids: " + left})
	}
	return res, nil
}

// killHeld kills the held processes, reaps those that are this process's
// children (a job agent's restored tree: CRIU restores it as a sibling of
// the one that asked), and waits, at most treeGoneWait, until every pid
// is free; it names those still held ("": none).
func killHeld(ctx context.Context, held []*proc.Process) string {
	for _, p := range held {
		_ = p.Signal(syscall.SIGKILL)
	}
	for _, p := range held {
		if st, err := proc.ReadStat(p.Pid()); err == nil && st.PPid == proc.Pid(os.Getpid()) {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(int(p.Pid()), &ws, 0, nil)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, treeGoneWait)
	defer cancel()
	if left := proc.WaitGone(wctx, held); len(left) > 0 {
		text, _ := holdersText(holdersOf(left))
		return text
	}
	return ""
}

// holdersOf describes held processes that are still there (running, or
// zombies), as proc.Holders does.
func holdersOf(procs []*proc.Process) []proc.Holder {
	var out []proc.Holder
	for _, p := range procs {
		if st, err := proc.ReadStat(p.Pid()); err == nil && st.Start == p.Start() {
			out = append(out, proc.Holder{Pid: p.Pid(), State: st.State, PPid: st.PPid})
		}
	}
	return out
}

// preCopyAhead runs a migration's pre-copy rounds (while the tree runs) and
// sends them to the streamed target at once: the rounds, the target's
// directory they went to, and the bytes sent. On error nothing is left at
// the target, and the tree runs on.
func preCopyAhead(ctx context.Context, o MigrateOptions, st *SSHTarget, ev *emitter, made *madeDirs) (*preCopyResult, string, int64, error) {
	tc := gpuClientsOf(o.Env.Socket, o.Pid)
	if err := checkpointDir(o.Dir, made); err != nil {
		return nil, "", 0, err
	}
	pc, err := preCopy(ctx, o.PreCopy, o.Dir, "", tc.Clients, tc.Bytes, o.Env, ev)
	if err != nil {
		return nil, "", 0, err
	}
	if len(pc.rounds) == 0 {
		return nil, "", 0, nil
	}
	t := time.Now()
	rcv, err := st.receivePart(ctx, o.Dir, true, inPreCopy)
	warnNotSent(ev, o.Dir, rcv.NotSent)
	rdir, n := rcv.Dir, rcv.Bytes
	if err != nil {
		if rdir != "" {
			_ = discard(st, rdir)
		}
		_ = os.RemoveAll(filepath.Join(o.Dir, PreCopyDir))
		return nil, "", 0, fmt.Errorf("migration refused before anything was stopped: sending the pre-copy rounds to %s: %w", st.Name(), err)
	}
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("pre-copy rounds at %s:%s (%d bytes sent in %.3f s); stopping the tree",
		st.Name(), rdir, n, time.Since(t).Seconds())})
	return pc, rdir, n, nil
}

// warnNotSent tells what of the image directory did not go to the target
// (someone else's files, symlinks): a restore there would not have read
// them either.
func warnNotSent(ev *emitter, dir string, notSent []string) {
	if len(notSent) == 0 {
		return
	}
	const shown = 5
	text := strings.Join(notSent[:min(len(notSent), shown)], "; ")
	if len(notSent) > shown {
		text += fmt.Sprintf("; and %d more", len(notSent)-shown)
	}
	ev.emit(Event{Kind: Warning, Text: fmt.Sprintf("not sent to the target from %s (only this user's directories and regular files go): %s", dir, text)})
}

// discard removes what a failed migration put at the target, within 30 s
// and whether or not the migration's own context was cancelled.
func discard(t Target, remoteDir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return t.Discard(ctx, remoteDir)
}

// inPreCopy says whether rel (slash-separated, in an image directory) is a
// pre-copy round's.
func inPreCopy(rel string) bool { return rel == PreCopyDir || strings.HasPrefix(rel, PreCopyDir+"/") }

// continueSource continues a stopped migration source (SIGCONT to every
// process of its tree, held: one that died is not replaced by whoever has
// its pid now) and waits for its GPU processes to have their GPU back; it
// says whether they do, with notes.
func continueSource(socket string, dump *DumpResult, held []*proc.Process, notes []string) (bool, []string) {
	// its TCP connections out of the repair mode the dump left them in
	// (repair.go), before it runs again
	if err := repairOffTree(held); err != nil {
		notes = append(notes, fmt.Sprintf("TCP connections of the source could not be taken out of repair mode (their reads fail with EPERM): %v", err))
	}
	// and the links CRIU made for the dump gone, as after a dump that let
	// the tree run on (linkremap.go)
	if err := removeLinkRemaps(dump.ImagesDir); err != nil {
		notes = append(notes, fmt.Sprintf("the links CRIU made for the dump (link_remap.N) could not all be removed; the next dump of the source may fail on them: %v", err))
	}
	for _, p := range held {
		if err := p.Signal(syscall.SIGCONT); err != nil && !errors.Is(err, proc.ErrGone) {
			notes = append(notes, fmt.Sprintf("pid %d could not be continued: %v", p.Pid(), err))
		}
	}
	var pids []proc.Pid
	for _, g := range dump.GPUProcesses {
		pids = append(pids, g.Pid)
	}
	running := true
	for _, p := range held {
		if !p.Running() && !slices.Contains(pids, p.Pid()) {
			running = false
			notes = append(notes, fmt.Sprintf("pid %d of the source is gone", p.Pid()))
		}
	}
	for _, pa := range waitGPUBack(socket, pids, sourceBackWait) {
		if !pa.Running {
			running = false
		}
		notes = append(notes, "the source's "+pa.describe())
	}
	if running {
		notes = append(notes, fmt.Sprintf("the source (pid %d) runs on", dump.Pid))
	}
	return running, notes
}
