package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/internal/units"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
)

// DumpOptions is a whole-process checkpoint of a tree.
type DumpOptions struct {
	Pid proc.Pid // the root of the tree
	Dir string   // the image directory (absolute; made 0700 if missing)
	// Parent is the parent image directory of an incremental GPU image
	// (absolute); "" for a full one.
	Parent string
	// LeaveRunning: the tree runs on after the dump (with its GPU).
	// LeaveStopped: the tree stays, stopped (SIGSTOP), with its GPU given
	// back, so that it can either be killed or go on (SIGCONT): a
	// migration's source. Neither: the tree is ended.
	LeaveRunning, LeaveStopped bool
	// Concurrent (with LeaveRunning): the tree runs on while its GPU memory
	// is written. The helper copies it on the device into memory of its own
	// when the tree stops (as much as fits beyond its snapshot reserve; the
	// rest is copied while the tree waits) and writes that into the image
	// after the tree runs again; Dump returns once the image is complete.
	// The tree's stop no longer grows with its GPU memory.
	Concurrent bool
	// Template: a served process's library also writes the script that
	// makes its objects in a new worker, which the image keeps for a
	// template (gpucr image load --template): its restore then attaches to
	// a worker that holds them already.
	Template bool
	// PreCopy copies the GPU memory while the tree runs, in rounds, before
	// the dump stops it (precopy.go); the dump copies only what changed
	// since the last round. The rounds go into Dir (PreCopyDir), and once
	// the image is committed what it uses of them is folded into it and
	// they are removed.
	PreCopy PreCopy
	// preCopied: the rounds were done already (a migration sent them to
	// its target before the stop); Dir holds them, and the dump uses them.
	// They stay: the target's image reads them there, and only the rest
	// goes after the stop.
	preCopied *preCopyResult
	// Force replaces an image Dir already holds: it is put aside, removed
	// once the new one is complete, and put back if the checkpoint fails.
	Force  bool
	CRIU   CRIU
	Env    Environment
	Events Events
	// Job: the tree is one part of a job checkpointed across hosts
	// (jobdump.go): its connections to the other parts count as inside,
	// and the dump waits at the job's barrier once CRIU has frozen it.
	Job *JobPart
}

// JobPart is what a part of a job adds to its dump.
type JobPart struct {
	// Conns are the tree's TCP connections whose peers are other parts of
	// the job (as the coordinator matched them).
	Conns []JobConn
	// Frozen runs once CRIU has frozen the tree and before it dumps any of
	// it; the dump goes on when it returns, and fails (the tree running
	// on) on its error.
	Frozen func() error
}

func (p *JobPart) frozen() func() error {
	if p == nil {
		return nil
	}
	return p.Frozen
}

// DumpResult is a checkpoint that succeeded.
type DumpResult struct {
	Pid       proc.Pid `json:"pid"`
	ImagesDir string   `json:"images_dir"`
	Parent    string   `json:"parent,omitempty"`
	// Seconds is the whole checkpoint, from the command's start to its
	// return; DumpSeconds the part until the image was complete, and
	// PidsReleasedAfterSeconds (a dump that ends the tree) the wait after
	// it for the tree's pids to be free, which a slow reaper (pid 1) can
	// make the longer part.
	Seconds      float64 `json:"seconds"`
	DumpSeconds  float64 `json:"dump_seconds"`
	ImageBytes   int64   `json:"image_bytes"`
	LeaveRunning bool    `json:"leave_running"`
	LeaveStopped bool    `json:"leave_stopped,omitempty"`
	Concurrent   bool    `json:"concurrent,omitempty"`
	// Redone: the concurrent checkpoint found memory changed behind its
	// copy-on-write window and was taken again stop-the-world; why.
	Redone string `json:"redone,omitempty"`
	// StallSeconds (LeaveRunning): the longest a GPU process of the tree
	// was stopped, from its quiesce to its resume (0: not known).
	StallSeconds float64 `json:"stall_seconds,omitempty"`
	// PreCopy are the rounds before the dump (PreCopySeconds in all); the
	// tree's stop began after them.
	PreCopy        []PreCopyRound `json:"pre_copy,omitempty"`
	PreCopySeconds float64        `json:"pre_copy_seconds,omitempty"`
	GPU            *GPUCopy       `json:"gpu"`
	// GPUState says whether a GPU image was written; NoGPUState says why
	// not.
	GPUState       bool         `json:"gpu_state"`
	NoGPUState     string       `json:"no_gpu_state,omitempty"`
	GPUProcesses   []GPUProcess `json:"gpu_processes"`
	PluginDir      string       `json:"plugin_dir"`
	PluginMessages []string     `json:"plugin_messages"`
	// After a dump that ends the tree: how long its pids took to be free,
	// and, if some were still held, by whom.
	PidsReleasedAfterSeconds *float64 `json:"pids_released_after_seconds,omitempty"`
	PidsHeld                 string   `json:"pids_held,omitempty"`
	// Tree is every pid of the dumped tree (the pids a restore needs).
	Tree []proc.Pid `json:"tree"`
	// CRIU is CRIU's own account of its dump (nil: none written): how
	// long it froze the tree, and its memory.
	CRIU *CRIUDumpStats `json:"criu,omitempty"`
	// Phases are the checkpoint's steps: "checks" (before CRIU), CRIU's
	// (criu-start, criu-dump: the tree stopped, criu-finish) and
	// "pids-released". Each GPU process's own steps in the helper are in
	// GPUProcesses.
	Phases []Step `json:"phases"`
	// AutoOptions are the CRIU options the checkpoint turned on by itself
	// for what it found in the tree (autoopts.go), each with why; the
	// image's dump record keeps them for its restore.
	AutoOptions []AutoOption `json:"auto_options,omitempty"`
}

// treeGoneWait bounds how long a checkpoint that ends its tree waits for
// the tree's pids to be free (zombies reaped) before it returns.
const treeGoneWait = 10 * time.Second

// Dump checkpoints the tree of o.Pid into o.Dir: everything that can be
// checked is checked before the application is paused (the pid, its
// session, the directory, free space, the plugin), then CRIU dumps it with
// gpucr's plugin. A failed dump leaves the tree running with its GPU and
// the directory as it was. Without LeaveRunning or LeaveStopped, Dump
// returns once the tree's pids are free, so that a restore right after can
// have them. A concurrent dump whose copy-on-write window found memory
// changed behind its back is taken again stop-the-world (Redone says why).
//
// The directories it makes for the image are removed if it fails and
// nothing is left in them (its log stays where CRIU ran and failed).
//
// A dump that CRIU refused because a connection of the tree was in flight
// (connected, not yet accepted: the tree froze between the two) is taken
// again, up to inFlightRetries times: the failed one left the tree running
// as it was, and the accept is a moment away.
func Dump(ctx context.Context, o DumpOptions) (*DumpResult, error) {
	for attempt := 1; ; attempt++ {
		made := &madeDirs{}
		res, err := dump(ctx, o, made)
		if err != nil {
			made.removeEmpty()
		}
		// A job's part is not taken again alone: the other parts passed the
		// job's barriers with it, and a second freeze of this one would meet
		// a coordinator past them. The job fails and every part runs on; it
		// is the job that is checkpointed again.
		if err == nil || attempt > inFlightRetries || !inFlight(err) || ctx.Err() != nil || o.CRIU.TCPSkipInFlight || o.Job != nil {
			return res, err
		}
		(&emitter{out: o.Events, start: time.Now()}).emit(Event{Kind: Warning,
			Text: fmt.Sprintf("a TCP connection of the tree was in flight (connected, not yet accepted) when CRIU froze it; the tree runs on as it was: checkpointing again (%d of %d)", attempt, inFlightRetries)})
		select {
		case <-ctx.Done():
			return res, err
		case <-time.After(inFlightPause):
		}
	}
}

// inFlightRetries and inFlightPause bound the dumps taken again after a
// connection in flight.
const (
	inFlightRetries = 3
	inFlightPause   = 100 * time.Millisecond
)

// inFlight says whether err is CRIU's refusal of a connection in flight
// ("inet: In-flight connection (l) for ..."), which --skip-in-flight would
// have left out.
func inFlight(err error) bool {
	var f *Failure
	if !errors.As(err, &f) || f.Cancelled || f.TimedOut || f.background {
		return false
	}
	for _, l := range f.CRIU {
		if strings.Contains(l, "In-flight connection") {
			return true
		}
	}
	return false
}

// dump is Dump, recording the directories it makes.
func dump(ctx context.Context, o DumpOptions, made *madeDirs) (*DumpResult, error) {
	ev := &emitter{out: o.Events, start: time.Now()}
	if o.LeaveRunning && o.LeaveStopped {
		return nil, errors.New("a checkpoint leaves the tree running or stopped, not both")
	}
	if o.Concurrent && !o.LeaveRunning {
		return nil, errors.New("a concurrent checkpoint leaves the tree running: it needs LeaveRunning")
	}
	if !filepath.IsAbs(o.Dir) {
		return nil, fmt.Errorf("image directory %q: must be absolute", o.Dir)
	}
	if err := o.CRIU.check(); err != nil {
		return nil, err
	}
	pid := o.Pid
	if !proc.Exists(pid) {
		return nil, fmt.Errorf("no process %d", pid)
	}
	tree := proc.Tree(pid)
	if err := sessionLeaderCheck(pid, tree, o.CRIU.ShellJob); err != nil {
		return nil, err
	}
	// Before anything is made or stopped: the options the tree needs, or
	// a refusal of what CRIU could dump only at a peer's expense.
	var jobConns []JobConn
	if o.Job != nil {
		jobConns = o.Job.Conns
	}
	criu, auto, err := chooseJobCRIUOptions(pid, tree, o.CRIU, jobConns)
	if err != nil {
		return nil, err
	}
	o.CRIU = criu
	for _, a := range auto {
		ev.emit(Event{Kind: Note, Text: fmt.Sprintf("CRIU option %s, chosen by gpucr: %s", a.Option, a.Why)})
	}
	if err := checkpointDir(o.Dir, made); err != nil {
		return nil, err
	}
	tc := gpuClientsOf(o.Env.Socket, pid)
	if o.CRIU.PluginDir == "" && len(tc.Clients) > 0 {
		return nil, fmt.Errorf("checkpoint %d refused: its tree holds GPU processes of the helper (%s), and %s",
			pid, pidList(tc.Clients), o.CRIU.NoPlugin)
	}
	if err := unknownGPUProcesses(pid, tc, o.Env.Socket); err != nil {
		return nil, err
	}
	if free, err := freeBytes(o.Dir); err == nil && tc.Bytes > free {
		// Refused before anything is paused: the copy would fail on a full
		// disk only after the application had waited for it. With a parent
		// image only the chunks it lacks are written, so that may fit.
		if o.Parent == "" {
			return nil, fmt.Errorf("checkpoint refused: %s has %s free, and the GPU memory of the tree alone is %s; free space there or choose another directory",
				o.Dir, units.Bytes(free), units.Bytes(tc.Bytes))
		}
		ev.emit(Event{Kind: Warning, Text: fmt.Sprintf("%s has %s free; the GPU memory of the tree alone is %s (the parent image may hold most of it)",
			o.Dir, units.Bytes(free), units.Bytes(tc.Bytes))})
	}
	held, err := heldEntries(o.Dir)
	if err != nil {
		return nil, err
	}
	if o.preCopied != nil {
		held = slices.DeleteFunc(held, func(n string) bool { return n == PreCopyDir })
	}
	var aside *asideDir
	if len(held) > 0 {
		if !o.Force {
			return nil, fmt.Errorf("checkpoint refused: %s already holds %s, which a new image would mix with; choose a new directory, or --force to replace it",
				o.Dir, describeHeld(held))
		}
		// Not an image that is being restored from: the restore reads it.
		lock, err := lockForReplace(o.Dir)
		if err != nil {
			return nil, err
		}
		defer lock.Close()
		if aside, err = putAside(o.Dir, held); err != nil {
			return nil, err
		}
	}
	checked := time.Now()
	pc, err := o.preCopied, error(nil)
	if pc == nil {
		pc, err = preCopy(ctx, o.PreCopy, o.Dir, o.Parent, tc.Clients, tc.Bytes, o.Env, ev)
	}
	if err != nil {
		if aside != nil {
			if perr := aside.putBack(); perr != nil {
				err = fmt.Errorf("%w; %v", err, perr)
			}
		}
		return nil, err
	}
	manifest := image.ManifestPath(o.Dir)
	before, _ := os.Stat(manifest)
	rec := dumpRecordOf(o.CRIU)
	j := job{dir: o.Dir, dump: true, criu: o.CRIU, env: o.Env, clients: tc.Clients, parent: pc.last, ev: ev, record: &rec,
		concurrent: o.Concurrent && len(tc.Clients) > 0, leaveRunning: o.LeaveRunning && len(tc.Clients) > 0,
		template: o.Template,
		what:     fmt.Sprintf("criu dump of pid %d", pid), frozen: o.Job.frozen(),
		fill: func(opts *rpc.CriuOpts) {
			opts.Pid = proto.Int32(int32(pid))
			opts.LeaveRunning = proto.Bool(o.LeaveRunning)
			if o.LeaveStopped {
				opts.LeaveStopped = proto.Bool(true)
			}
		}}
	r, err := run(ctx, j)
	redone := ""
	if err != nil && j.concurrent && IsChanged(err) {
		// The tree runs on and DIR got no image: take it again, exact by
		// construction (the tree waits while its memory is copied). The
		// helper kept the chunks the window saved in DIR, so this copies
		// only those that changed since the first stop.
		redone = redoReason(err)
		ev.emit(Event{Kind: Warning, Text: redone})
		j.concurrent = false
		r, err = run(ctx, j)
	}
	if err != nil {
		var waiting []proc.Pid
		if f := (*Failure)(nil); !errors.As(err, &f) || !f.background {
			waiting = waitingForGPU(o.Env.Socket, tc.Clients, err)
			// a process another checkpoint holds waits for that one, not
			// for a GPU image of this one
			waiting = slices.DeleteFunc(waiting, func(p proc.Pid) bool { return heldByAnother(f, p) })
		}
		if len(pc.rounds) > 0 && len(waiting) == 0 {
			_ = os.RemoveAll(filepath.Join(o.Dir, PreCopyDir))
		}
		return nil, failedDump(o.Dir, err, aside, !slices.Contains(held, image.SubDir), waiting)
	}
	if aside != nil {
		if derr := aside.discard(); derr != nil {
			ev.emit(Event{Kind: Warning, Text: derr.Error()})
		}
	}
	after, _ := os.Stat(manifest)
	if len(pc.rounds) > 0 && o.preCopied == nil {
		foldPreCopy(o.Dir, ev)
	}
	res := &DumpResult{Pid: pid, ImagesDir: o.Dir, Parent: o.Parent, LeaveRunning: o.LeaveRunning, LeaveStopped: o.LeaveStopped,
		Concurrent: o.Concurrent, Redone: redone, PreCopy: pc.rounds, PreCopySeconds: pc.seconds,
		GPU: gpuCopyOf(r.gpu), PluginDir: o.CRIU.PluginDir, PluginMessages: nonNil(r.plugin), Tree: tc.Tree,
		GPUState:     after != nil && (before == nil || !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime())),
		GPUProcesses: []GPUProcess{}, AutoOptions: auto}
	for _, c := range tc.Clients {
		g := GPUProcess{Pid: c, ImagePid: c, State: "checkpointed", Phases: helperPhases(r.each, c)}
		if o.LeaveRunning {
			g.StoppedSeconds = stoppedSeconds(r.each, c)
			res.StallSeconds = max(res.StallSeconds, g.StoppedSeconds)
		}
		res.GPUProcesses = append(res.GPUProcesses, g)
	}
	res.Phases = []Step{{"checks", checked.Sub(ev.start).Seconds()}}
	if len(pc.rounds) > 0 {
		res.Phases = append(res.Phases, Step{"pre-copy", pc.seconds})
	}
	res.Phases = append(res.Phases, r.phases...)
	res.DumpSeconds = time.Since(ev.start).Seconds()
	res.ImageBytes = dirBytes(o.Dir)
	res.CRIU = dumpStats(o.Dir, checked.Add(-time.Second))
	if !o.LeaveRunning && !o.LeaveStopped {
		// Return once the tree's pids are free, so that a restore right
		// after (a script's next line) can have them.
		t0 := time.Now()
		wctx, cancel := context.WithTimeout(ctx, treeGoneWait)
		held := proc.WaitReleased(wctx, tc.Tree)
		cancel()
		secs := time.Since(t0).Seconds()
		res.PidsReleasedAfterSeconds = &secs
		res.Phases = append(res.Phases, Step{"pids-released", secs})
		if len(held) > 0 {
			res.PidsHeld = heldPidsReason(held, time.Since(t0).Round(100*time.Millisecond))
			ev.emit(Event{Kind: Warning, Text: res.PidsHeld})
		}
	}
	if !res.GPUState {
		res.NoGPUState = noGPUStateReason(tc, o.CRIU)
	}
	res.Seconds = time.Since(ev.start).Seconds()
	return res, nil
}

// heldByAnother says whether the helper refused f's dump of pid because
// another checkpoint of it runs.
func heldByAnother(f *Failure, pid proc.Pid) bool {
	if f == nil {
		return false
	}
	want := fmt.Sprintf("another checkpoint of pid %d is running", pid)
	return slices.ContainsFunc(f.Plugin, func(l string) bool { return strings.Contains(l, want) })
}

// failedDump cleans up after a dump that failed: the GPU image the helper
// began in DIR is removed where DIR held none before (a failed GPU image
// only misleads), an interrupted run's log goes too, and an old image put
// aside for Force comes back. What was done is added to the failure. But
// where processes of the tree may still wait for their GPU memory in the
// partial image (waiting: the helper does not say they run again, and
// their part of the image is sealed, which a checkpoint does before a
// process gives its memory up), it is what a new helper gives it back
// from: it stays, and so does the old image, aside. A process without a
// sealed part waits for nothing the partial image holds.
func failedDump(dir string, err error, aside *asideDir, gpuNew bool, waiting []proc.Pid) error {
	var f *Failure
	errors.As(err, &f)
	note := func(s string) {
		if f != nil {
			f.Cleanup = append(f.Cleanup, s)
		}
	}
	partial := filepath.Join(dir, image.SubDir)
	waiting = slices.DeleteFunc(slices.Clone(waiting), func(p proc.Pid) bool { return !sealedPart(dir, p) })
	if len(waiting) > 0 {
		note(fmt.Sprintf("kept the partial GPU image %s: %s of the tree may wait for their GPU memory in it (their part of it was sealed before the helper died, as a process's is before it gives its memory up); the next gpucr helper gives it back from there, after which `gpucr image gc %s` removes the partial image",
			partial, pidList(waiting), dir))
		if aside != nil {
			note(fmt.Sprintf("the image %s held before stays in %s", dir, filepath.Join(dir, aside.name)))
			aside.dir.Close()
		}
		return err
	}
	if _, serr := os.Lstat(partial); serr == nil && (gpuNew || aside != nil) {
		if rerr := os.RemoveAll(partial); rerr != nil {
			note(fmt.Sprintf("the partial GPU image %s could not be removed: %v", partial, rerr))
		} else {
			note("removed the partial GPU image " + partial)
		}
	}
	if f != nil && f.Cancelled {
		for _, name := range []string{"dump.log", "stats-dump"} {
			_ = os.Remove(filepath.Join(dir, name))
		}
		f.Log = ""
	}
	if aside != nil {
		if perr := aside.putBack(); perr != nil {
			note(perr.Error())
			if f == nil {
				return fmt.Errorf("%w; %v", err, perr)
			}
		} else {
			note("the image " + dir + " held before is back")
		}
	}
	return err
}

// sealedPart says whether DIR's unfinished GPU image holds the sealed part
// of process pid (image.Writer.SealProcess): what a new helper would give
// that process its memory back from.
func sealedPart(dir string, pid proc.Pid) bool {
	fi, err := os.Lstat(image.PartPath(dir, int(pid)))
	return err == nil && fi.Mode().IsRegular()
}

// heldPidsReason says which processes still hold a dumped tree's pids, and
// what that means for a restore.
func heldPidsReason(held []proc.Holder, waited time.Duration) string {
	text, _ := holdersText(held)
	return fmt.Sprintf("%v after the dump, processes still hold the tree's pids: %s; a restore fails with \"File exists\" until they are gone",
		waited, text)
}

// noGPUStateReason says why a successful dump wrote no GPU image.
func noGPUStateReason(tc treeClients, c CRIU) string {
	switch {
	case tc.HelperErr != nil:
		return tc.HelperErr.Error()
	case len(tc.Clients) == 0:
		return "no process of the tree is a gpucr client"
	case c.PluginDir == "":
		return c.NoPlugin
	default:
		return fmt.Sprintf("%s of the tree were gpucr clients, but no GPU image was written (see dump.log)", pidList(tc.Clients))
	}
}

// unknownGPUProcesses refuses, before anything is paused, a tree in which a
// process uses the GPU (holds the driver's device files) without being a
// client of the helper: CRIU would fail on its device file only after the
// clients' GPU memory had been copied, with a message about file types.
func unknownGPUProcesses(root proc.Pid, tc treeClients, socket string) error {
	var bad []string
	interposed := 0
	for _, p := range tc.Tree {
		if slices.Contains(tc.Clients, p) {
			continue
		}
		if files := proc.DeviceFiles(p); len(files) > 0 {
			what := fmt.Sprintf("%d", p)
			if c := proc.Comm(p); c != "" {
				what += " (" + c + ")"
			}
			bad = append(bad, fmt.Sprintf("%s holds %s", what, strings.Join(files, ", ")))
			if runsInterposed(p) {
				interposed++
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	msg := fmt.Sprintf("checkpoint of %d refused: processes of its tree use the GPU without gpucr: %s; CRIU cannot dump the GPU driver's files",
		root, strings.Join(bad, "; "))
	if tc.HelperErr != nil {
		return fmt.Errorf("%s, and no gpucr helper answers at %s (%v): start it (`gpucr helper`, or systemctl start gpucr-helper); a process started with `gpucr run` rejoins it within a second or so, its GPU memory moved into the new helper's",
			msg, socket, tc.HelperErr)
	}
	if interposed == len(bad) {
		// Under gpucr run but not a client of this helper: a worker forked
		// without gpucr's fork handling, or a process whose helper ended
		// and that has not rejoined this one yet (it does on its own).
		return fmt.Errorf("%s, and these processes are not gpucr clients, though they run under `gpucr run`: a worker forked after CUDA was "+
			"initialised keeps the driver's files without gpucr run's fork handling (GPUCR_FORK_SCRUB=0?), and a process whose helper "+
			"ended rejoins the helper at %s within a second or so of its start: then try again (`gpucr status` lists it once it has)",
			msg, socket)
	}
	return fmt.Errorf("%s, and these processes are not gpucr clients: start the program with `gpucr run -- PROGRAM`, so that the helper holds its GPU memory "+
		"(a worker forked after CUDA was initialised needs gpucr run's fork handling, which releases the driver's files in it)", msg)
}

// runsInterposed says whether pid has gpucr's interposer (libgpucr.so)
// loaded: it was started with `gpucr run`.
func runsInterposed(pid proc.Pid) bool {
	return len(proc.FilesOf(pid, func(name string) bool { return filepath.Base(name) == "libgpucr.so" })) > 0
}

// waitingForGPU lists the GPU processes of a failed dump that have not got
// their GPU memory back (the helper does not answer, or says they wait),
// once the helper has had a moment to give it back. A failure reported
// with the processes' fate (a timeout, an interrupt) is read from there.
func waitingForGPU(socket string, clients []proc.Pid, err error) []proc.Pid {
	if len(clients) == 0 {
		return nil
	}
	var f *Failure
	var after []ProcessAfter
	if errors.As(err, &f) && f.Processes != nil {
		after = f.Processes
	} else {
		after = waitGPUBack(socket, clients, gpuBackWait)
	}
	var out []proc.Pid
	for _, p := range after {
		if !p.Running && p.State != "gone" {
			out = append(out, p.PID)
		}
	}
	return out
}
