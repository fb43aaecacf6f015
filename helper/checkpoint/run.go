package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/helper/swrk"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// emitter hands events to the caller one at a time: CRIU's phases come
// from the RPC's goroutine, the GPU copy's progress from the watcher's.
type emitter struct {
	mu    sync.Mutex
	out   Events
	start time.Time
}

func (e *emitter) emit(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev.Elapsed = time.Since(e.start)
	e.out.send(ev)
}

// notifier turns CRIU's RPC notifications into events.
type notifier struct {
	criu.NoNotify
	ev       *emitter
	pid      proc.Pid
	noPlugin bool      // CRIU runs without gpucr's plugin
	pre      time.Time // CRIU's pre-dump or pre-restore notice
	post     time.Time // its post-dump notice: the tree is dumped
	// postDump runs at the post-dump notice (its error fails the dump,
	// and the tree runs on).
	postDump func() error
	// frozen runs at CRIU's query-ext-files notice of a dump: the tree is
	// frozen and nothing of it dumped yet (a job's barrier; jobdump.go).
	// Its error fails the dump, and the tree runs on.
	frozen func() error
	// postRestore runs at the post-restore notice: every process and
	// socket is there, the sockets still in repair mode, nothing runs
	// yet (a job's restore barrier). Its error makes CRIU kill the tree.
	postRestore func() error
}

func (n *notifier) Frozen() error {
	if n.frozen != nil {
		return n.frozen()
	}
	return nil
}

func (n *notifier) PreDump() error {
	n.pre = time.Now()
	what := "dumping (the plugin saves the GPU state through the helper)"
	if n.noPlugin {
		what = "dumping (without gpucr's plugin)"
	}
	n.ev.emit(Event{Kind: Phase, Text: what})
	return nil
}
func (n *notifier) PostDump() error {
	n.post = time.Now()
	n.ev.emit(Event{Kind: Phase, Text: "dumped"})
	if n.postDump != nil {
		return n.postDump()
	}
	return nil
}
func (n *notifier) PreRestore() error {
	n.pre = time.Now()
	what := "restoring (the helper loads the GPU memory meanwhile)"
	if n.noPlugin {
		what = "restoring (without gpucr's plugin)"
	}
	n.ev.emit(Event{Kind: Phase, Text: what})
	return nil
}
func (n *notifier) PostRestore(criuPid int32) error {
	pid := proc.Pid(criuPid)
	n.pid = pid
	n.ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("CRIU restored pid %d", pid), Pid: pid})
	if n.postRestore != nil {
		return n.postRestore()
	}
	return nil
}

// job is one CRIU dump or restore of the image directory dir.
type job struct {
	dir     string
	dump    bool
	criu    CRIU
	env     Environment
	what    string     // "criu dump of pid 42", for messages
	clients []proc.Pid // the GPU processes of a dump's tree (given back after a timeout)
	parent  string     // a dump's parent GPU image (absolute), "" for a full one
	// concurrent: a dump whose GPU memory is written after the tree runs
	// on (DumpOptions.Concurrent); CRIU's images are published only once
	// the GPU image is committed
	concurrent bool
	template   bool // the plugin asks served processes for their template's script
	// leaveRunning: a dump whose GPU processes run on; it waits until they
	// do (or resumeWait), for the report of their stop
	leaveRunning bool
	// lazy: a restore whose host memory CRIU's lazy-pages daemon serves
	// on demand (RestoreOptions.LazyPages)
	lazy bool
	// deviceMap: a restore's GPUs onto others, "OLD=NEW,..." (the plugin
	// hands it to the helper, which checks it; RestoreOptions.DeviceMap)
	deviceMap string
	// onDemand: a restore whose processes run before their GPU data is
	// all loaded (RestoreOptions.OnDemand)
	onDemand bool
	// record: a dump's record of how it ran CRIU, published with its
	// images (dumprecord.go)
	record *DumpRecord
	// imagePids: a restore's pids and thread ids, as its image has them
	imagePids []proc.Pid
	fill      func(*rpc.CriuOpts)
	ev        *emitter
	// frozen, postRestore: the notifier's hooks of a job's part (see
	// notifier)
	frozen, postRestore func() error
}

// ran is what a CRIU run that succeeded leaves for the report.
type ran struct {
	pid    proc.Pid             // a restore's root
	gpu    *helperpb.Transfer   // the helper's copy of the GPU data, if it saw one
	each   []*helperpb.Transfer // the same, one per process
	plugin []string             // what the plugin said
	phases []Step               // CRIU's, as its notices mark them
	// lazyDone: a lazy restore's daemon had put every page in (zero: not
	// lazy); lazyErr: why not.
	lazyDone time.Time
	lazyErr  error
	end      time.Time // when CRIU answered (a restore: the tree runs from then)
}

// run runs a CRIU job under its deadline, in a private world (stage.go,
// session.go): CRIU reads no configuration but the session's, gets only the
// environment the session gives it, and works in private directories; the
// log and a dump's images are moved into the image directory afterwards.
// Cancelling ctx stops CRIU as the deadline does (a dump's processes get
// their GPU back). Its failure is a *Failure: what CRIU's log and the
// plugin said.
func run(ctx context.Context, j job) (*ran, error) {
	if err := j.criu.check(); err != nil {
		return nil, err
	}
	deadline := j.criu.timeout()
	// O_DIRECTORY: what replaced the directory since it was checked (a
	// FIFO) is refused, not waited on.
	fd, err := unix.Open(j.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", j.dir, err)
	}
	d := os.NewFile(uintptr(fd), j.dir)
	defer d.Close()
	sess, err := newSession(j.env.TempDir, j.criu.PluginDir, j.criu.Extra)
	if err != nil {
		return nil, fmt.Errorf("CRIU configuration: %w", err)
	}
	defer sess.close()
	work, err := sess.workDir()
	if err != nil {
		return nil, err
	}
	defer work.Close()
	var cd *criuDir
	if j.dump {
		cd, err = stageDump(d, j.dir)
	} else {
		cd, err = stageRestore(d, j.dir)
	}
	if err != nil {
		return nil, err
	}
	defer cd.remove()
	log := "restore.log"
	if j.dump {
		log = "dump.log"
	}
	opts := &rpc.CriuOpts{
		ImagesDirFd: proto.Int32(int32(cd.stage.Fd())),
		WorkDirFd:   proto.Int32(int32(work.Fd())),
		LogFile:     proto.String(log),
		// CRIU's own limit on stopping the tree (alarm() around
		// collect_pstree, 10 s by default), which is where the plugin's
		// PAUSE_DEVICES copies all GPU memory: the deadline instead.
		Timeout: proto.Uint32(uint32(math.Ceil(deadline.Seconds()))),
	}
	j.criu.fill(opts)
	if sess.config != "" {
		opts.ConfigFile = proto.String(sess.config)
	}
	j.fill(opts)
	var lazy *lazyPages
	if j.lazy && !j.dump {
		lazy, err = startLazyPages(j.criu.Binary, sess, sess.criuEnv(j.env), cd.stage, work)
		if err != nil {
			return nil, err
		}
		defer lazy.stop() // a restore that failed
		opts.LazyPages = proto.Bool(true)
	}
	n := &notifier{ev: j.ev, noPlugin: j.criu.PluginDir == "", frozen: j.frozen, postRestore: j.postRestore}
	if j.dump {
		// CRIU's links to files the tree had unlinked go with the image
		// (linkremap.go): the images are written, the links not yet removed.
		n.postDump = func() error { return saveLinkRemaps(cd.stage) }
	}
	// The plugin, inside CRIU, reaches the helper the caller named, writes
	// its messages where this package reads them, puts the GPU image into
	// (or takes it from) the image directory itself, passed as descriptor
	// 4, and asks for an incremental GPU image against the parent chosen.
	extra := []string{"GPUCR_IMAGE_DIR_FD=4"}
	if j.parent != "" {
		extra = append(extra, "GPUCR_PARENT="+j.parent)
	}
	if j.concurrent {
		extra = append(extra, "GPUCR_CONCURRENT=1")
	}
	if j.template && j.dump {
		extra = append(extra, "GPUCR_TEMPLATE=1")
	}
	if j.deviceMap != "" && !j.dump {
		extra = append(extra, "GPUCR_DEVICE_MAP="+j.deviceMap)
	}
	if j.onDemand && !j.dump {
		extra = append(extra, "GPUCR_ON_DEMAND=1")
	}
	stderr, err := sess.openStderr()
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	runStart := time.Now()
	cmd := swrk.Cmd{CRIU: j.criu.Binary, Env: sess.criuEnv(j.env, extra...), Files: []*os.File{d}, Deadline: deadline,
		KillNew: !j.dump, Cancel: ctx.Done(), Stderr: stderr}
	direction := helperpb.Transfer_DIRECTION_LOAD
	if j.dump {
		direction = helperpb.Transfer_DIRECTION_DUMP
	}
	watch := watchGPU(j.env.Socket, j.dir, direction, runStart, j.ev)
	var out swrk.Outcome
	if j.dump {
		out = cmd.Dump(opts, n)
	} else {
		out = cmd.Restore(opts, n)
	}
	end := time.Now()
	var lazyDone time.Time
	var lazyErr error
	if lazy != nil && out.Err == nil && !out.TimedOut {
		// The tree runs; the daemon reads the rest of its memory from the
		// staged images, which stay until it has.
		j.ev.emit(Event{Kind: Phase, Text: "the tree runs; its host memory is still coming in (lazy pages)"})
		if lazyErr = lazy.wait(lazyDoneWait); lazyErr == nil {
			lazyDone = time.Now()
		}
	}
	var bgErr error
	// After a dump that succeeded: the background copy of a concurrent
	// one, and the return of GPU processes that run on.
	awaited := (j.concurrent || j.leaveRunning) && out.Err == nil && !out.TimedOut
	if awaited {
		if j.concurrent {
			// The tree runs on; its GPU memory is still being written.
			j.ev.emit(Event{Kind: Phase, Text: "the tree runs on; writing its GPU memory into the image"})
		}
		err := awaitBackground(ctx, j.env.Socket, j.dir, runStart, j.leaveRunning)
		switch {
		case j.concurrent:
			bgErr = err
		case err != nil: // the image is committed: only the report of the stop is missing
			j.ev.emit(Event{Kind: Warning, Text: "how long the GPU processes were stopped is not known: " + err.Error()})
		}
	}
	r := &ran{pid: n.pid, lazyDone: lazyDone, lazyErr: lazyErr, end: end}
	r.gpu, r.each = watch.stop()
	r.phases = criuPhases(j.dump, runStart, n.pre, n.post, end)
	if awaited {
		name := "gpu-resume" // the GPU processes' return, after CRIU
		if j.concurrent {
			name = "gpu-background"
		}
		r.phases = append(r.phases, Step{name, time.Since(end).Seconds()})
	}
	privateLog := filepath.Join(sess.dir, log)
	logPath := filepath.Join(j.dir, log)
	// CRIU writes its log and its statistics (stats-dump, stats-restore)
	// into its work directory. A CRIU that stopped at its options wrote no
	// log: then no failure points to one.
	for _, name := range []string{log, "stats-dump", "stats-restore", "lazy-pages.log"} {
		err := placeFile(d, j.dir, filepath.Join(sess.dir, name), name)
		if err != nil && name == log {
			logPath = ""
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) { // CRIU writes one of the two statistics
			why := err.Error()
			if errors.Is(err, unix.ENOSPC) {
				// said once, by the failure's hint, not again with each file
				why = "its file system is full"
			}
			j.ev.emit(Event{Kind: Warning, Text: fmt.Sprintf("CRIU's %s could not be placed in the image directory: %s", name, why)})
		}
	}
	if bgErr != nil {
		// CRIU's images stay unpublished: the directory gets no image
		// whose GPU part is missing.
		f := &Failure{Log: logPath, GPU: gpuCopyOf(r.gpu), Plugin: sess.pluginLines(), background: true, cause: bgErr,
			Summary: fmt.Sprintf("%s: the tree runs on, but its GPU memory could not be written into the image: %v", j.what, bgErr)}
		f.Hints = criuHintsFor(append(append([]string{}, f.Plugin...), bgErr.Error()), j.dump)
		return r, f
	}
	if out.Err == nil && !out.TimedOut {
		if j.dump {
			if j.record != nil {
				if err := writeDumpRecord(cd.stage, *j.record); err != nil {
					return r, fmt.Errorf("%s: the record of its options: %w", j.what, err)
				}
			}
			if err := cd.publish(); err != nil {
				return r, err
			}
		} else {
			cd.keepNew()
		}
		r.plugin = sess.pluginLines()
		return r, nil
	}
	f := &Failure{Log: logPath, TimedOut: out.TimedOut, Cancelled: out.Cancelled, Err: out.Err,
		Summary: j.what + " failed" + seeLog(logPath), GPU: gpuCopyOf(r.gpu)}
	if out.TimedOut {
		f.Summary = timeoutSummary(j.what, deadline, out, logPath)
	}
	if out.Cancelled {
		f.Summary = fmt.Sprintf("%s interrupted: stopped CRIU", j.what)
		if len(out.Killed) > 0 {
			f.Summary += fmt.Sprintf(" and the processes it was restoring (%v)", out.Killed)
		}
	}
	f.CRIU, err = criuLogFile(privateLog, maxCRIUErrors)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		f.CRIU = []string{fmt.Sprintf("(CRIU's log cannot be read: %v)", err)}
	}
	// What CRIU said on its stderr: before it had its log (its options),
	// or beside it.
	said := criuStderr(sess.stderrLines())
	f.CRIU = append(f.CRIU, said...)
	optHints := criuOptionHints(said, j.criu.Extra)
	if logPath == "" && !out.TimedOut && !out.Cancelled {
		f.Summary = j.what + " failed before CRIU began its log"
		if len(optHints) > 0 {
			f.Summary = j.what + " failed: CRIU refused its options before it touched the process"
		}
	}
	f.Plugin = sess.pluginLines()
	if len(f.Plugin) > 0 {
		f.CRIU = withoutDetachNoise(f.CRIU)
	}
	if out.Cancelled {
		// what CRIU said after it was stopped is noise
		f.CRIU, f.Plugin = nil, nil
	}
	f.Hints = append(optHints, criuHintsFor(append(append([]string{}, f.CRIU...), f.Plugin...), j.dump)...)
	if !j.dump {
		f.Hints = restoreForkHints(f.Hints, f.CRIU, j.imagePids, j.criu.ShellJob)
	}
	if (out.TimedOut || out.Cancelled) && len(j.clients) > 0 {
		f.Processes = waitGPUBack(j.env.Socket, j.clients, gpuBackWait)
	}
	return r, f
}

// timeoutSummary says that CRIU ran past its deadline and what was done.
func timeoutSummary(what string, deadline time.Duration, out swrk.Outcome, logPath string) string {
	s := fmt.Sprintf("%s did not finish within %v; killed it", what, deadline)
	if len(out.Killed) > 0 {
		s += fmt.Sprintf(" and the processes it was restoring (%v)", out.Killed)
	}
	if out.Hung {
		s += fmt.Sprintf("; its RPC did not end within %v after that (a process CRIU started holds it)", swrk.ReturnGrace)
	}
	return s + seeLog(logPath)
}

// seeLog points to CRIU's log where it is ("": CRIU wrote none).
func seeLog(logPath string) string {
	if logPath == "" {
		return ""
	}
	return "; see " + logPath
}

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func pidList(pids []proc.Pid) string {
	if len(pids) == 1 {
		return fmt.Sprintf("pid %d", pids[0])
	}
	return fmt.Sprintf("pids %v", pids)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// stateName: "running", "quiesced", "dropped" or "unknown".
func stateName(s helperpb.ClientState) string {
	if s == helperpb.ClientState_CLIENT_STATE_UNSPECIFIED {
		return "unknown"
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "CLIENT_STATE_"))
}

// Step is one step of a checkpoint or a restore and how long it took.
type Step struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// criuPhases are CRIU's steps as its notices mark them: its start (up to
// the pre-dump notice), the dump itself (the tree stopped: the plugin's
// GPU checkpoint of each process is inside it), and the end (a dump's tree
// killed or resumed, CRIU gone). A restore has no post notice from go-criu
// before its end: its start and the restore.
func criuPhases(dump bool, start, pre, post, end time.Time) []Step {
	if pre.IsZero() {
		return []Step{{"criu", end.Sub(start).Seconds()}}
	}
	if !dump {
		return []Step{{"criu-start", pre.Sub(start).Seconds()}, {"criu-restore", end.Sub(pre).Seconds()}}
	}
	if post.IsZero() {
		return []Step{{"criu-start", pre.Sub(start).Seconds()}, {"criu-dump", end.Sub(pre).Seconds()}}
	}
	return []Step{{"criu-start", pre.Sub(start).Seconds()}, {"criu-dump", post.Sub(pre).Seconds()},
		{"criu-finish", end.Sub(post).Seconds()}}
}

// helperPhases are the helper's steps of the checkpoint of pid, from the
// copies seen.
// stoppedSeconds is how long the checkpoint of pid stopped it (0: not known).
func stoppedSeconds(each []*helperpb.Transfer, pid proc.Pid) float64 {
	for _, t := range each {
		if slices.Contains(t.Pids, int64(pid)) {
			return t.StoppedSeconds
		}
	}
	return 0
}

func helperPhases(each []*helperpb.Transfer, pid proc.Pid) []Step {
	for _, t := range each {
		if slices.Contains(t.Pids, int64(pid)) {
			var out []Step
			for _, p := range t.Phases {
				out = append(out, Step{p.Name, p.Seconds})
			}
			return out
		}
	}
	return nil
}
