package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	ucli "github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/helper/swrk"
	"github.com/gpucr/gpucr/helper/trusted"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// The whole-process checkpoint and restore: CRIU's RPC (criu swrk, package swrk),
// with gpucr's plugin, which moves the GPU state through the helper.

// criuTimeoutFlag: the deadline of a CRIU run.
func criuTimeoutFlag() ucli.Flag {
	return &ucli.DurationFlag{Name: "criu-timeout", Value: defaultCRIUTimeout,
		Usage: "how long CRIU may run; then it is killed (the processes of a dump run on)"}
}

// defaultCRIUTimeout is generous: CRIU copies the process memory, and the
// plugin all GPU memory, within it.
const defaultCRIUTimeout = 10 * time.Minute

// criuBinary is the CRIU to run: $GPUCR_CRIU, else criu on PATH. As root,
// only one that root alone can change (package trusted): the environment
// (GPUCR_CRIU, PATH) may be a user's, kept by `sudo -E`, and name their own
// program. On PATH, one that root cannot trust is passed over; the system's
// directories come after PATH's.
func criuBinary() (string, error) {
	p := os.Getenv("GPUCR_CRIU")
	if os.Geteuid() != 0 {
		if p != "" {
			return p, nil
		}
		found, err := exec.LookPath("criu")
		if err != nil {
			return "", fmt.Errorf("no criu on PATH (scripts/install-criu.sh installs CRIU 4.2): %w", err)
		}
		return found, nil
	}
	if p != "" {
		real, err := trusted.Path(p)
		if err != nil {
			return "", fmt.Errorf("GPUCR_CRIU=%s: %w (as root, gpucr runs a CRIU that the environment names only where root alone can change it)", p, err)
		}
		return real, nil
	}
	found, _, err := trusted.LookPath("criu", os.Getenv("PATH"))
	if err != nil {
		return "", fmt.Errorf("%w (scripts/install-criu.sh installs CRIU 4.2)", err)
	}
	return found, nil
}

// notifier prints CRIU's phases on a terminal (not with --json).
type notifier struct {
	criu.NoNotify
	w     io.Writer
	start time.Time
	pid   int32
	gpu   *helperpb.Transfer // the helper's copy of the GPU data, if it saw one
	// plugin is what the plugin said in a run that succeeded.
	plugin   []string
	noPlugin bool // CRIU runs without gpucr's plugin
}

func (n *notifier) say(what string) {
	if n.w != nil {
		fmt.Fprintf(n.w, "  %6.3f s  %s\n", time.Since(n.start).Seconds(), what)
	}
}
func (n *notifier) PreDump() error {
	if n.noPlugin {
		n.say("dumping (without gpucr's plugin)")
	} else {
		n.say("dumping (the plugin saves the GPU state through the helper)")
	}
	return nil
}
func (n *notifier) PostDump() error { n.say("dumped"); return nil }
func (n *notifier) PreRestore() error {
	if n.noPlugin {
		n.say("restoring (without gpucr's plugin)")
	} else {
		n.say("restoring (the helper loads the GPU memory meanwhile)")
	}
	return nil
}
func (n *notifier) PostRestore(pid int32) error {
	n.pid = pid
	n.say(fmt.Sprintf("restored pid %d", pid))
	return nil
}

// criuJob is one CRIU dump or restore of the image directory dir.
type criuJob struct {
	dir       string
	dump      bool
	pluginDir string // "" to run CRIU without gpucr's plugin
	what      string // "criu dump of pid 42", for messages
	clients   []int  // the GPU processes of a dump's tree (given back after a timeout)
	parent    string // a dump's parent GPU image (absolute), "" for a full one
	fill      func(*rpc.CriuOpts)
}

// criuRun runs a CRIU job under the --criu-timeout deadline, in a private
// world (criudir.go, criusession.go): CRIU reads no configuration but the
// session's, gets only the environment the session gives it, and works in
// private directories; the log and a dump's images are moved into the image
// directory afterwards. Its failure is a *criuFailure: what CRIU's log and
// the plugin said.
func criuRun(c *ucli.Context, job criuJob) (*notifier, error) {
	deadline := c.Duration("criu-timeout")
	if deadline <= 0 {
		return nil, usageError{fmt.Errorf("--criu-timeout %v: must be positive", deadline)}
	}
	criuBin, err := criuBinary()
	if err != nil {
		return nil, err
	}
	// O_DIRECTORY: what replaced the directory since it was checked (a
	// FIFO) is refused, not waited on.
	fd, err := unix.Open(job.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", job.dir, err)
	}
	d := os.NewFile(uintptr(fd), job.dir)
	defer d.Close()
	sess, err := newCRIUSession(job.pluginDir)
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
	if job.dump {
		cd, err = stageDump(d, job.dir)
	} else {
		cd, err = stageRestore(d, job.dir)
	}
	if err != nil {
		return nil, err
	}
	defer cd.remove()
	log := "restore.log"
	if job.dump {
		log = "dump.log"
	}
	opts := &rpc.CriuOpts{
		ImagesDirFd: proto.Int32(int32(cd.stage.Fd())),
		WorkDirFd:   proto.Int32(int32(work.Fd())),
		LogFile:     proto.String(log),
		LogLevel:    proto.Int32(4),
		ShellJob:    proto.Bool(c.Bool("shell-job")),
		// CRIU's own limit on stopping the tree (alarm() around
		// collect_pstree, 10 s by default), which is where the plugin's
		// PAUSE_DEVICES copies all GPU memory: the deadline instead.
		Timeout: proto.Uint32(uint32(math.Ceil(deadline.Seconds()))),
	}
	if sess.config != "" {
		opts.ConfigFile = proto.String(sess.config)
	}
	job.fill(opts)
	n := &notifier{start: time.Now(), noPlugin: job.pluginDir == ""}
	if !c.Bool("json") {
		n.w = c.App.Writer
	}
	// The plugin, inside CRIU, reaches the helper this command was told
	// about, writes its messages where this command reads them, puts the
	// GPU image into (or takes it from) the image directory itself, passed
	// as descriptor 4, and asks for an incremental GPU image against the
	// parent this command chose.
	socket := client.SocketPath(c.String("socket"))
	extra := []string{"GPUCR_IMAGE_DIR_FD=4"}
	if job.parent != "" {
		extra = append(extra, "GPUCR_PARENT="+job.parent)
	}
	// Ctrl-C or a SIGTERM stops CRIU as the deadline does (the processes
	// get their GPU back), rather than killing this command midway.
	sigCtx, stopSignals := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	cmd := swrk.Cmd{CRIU: criuBin, Env: sess.criuEnv(socket, extra...), Files: []*os.File{d}, Deadline: deadline,
		KillNew: !job.dump, Cancel: sigCtx.Done()}
	var bar io.Writer
	if n.w != nil && isTerminal(n.w) {
		bar = n.w
	}
	direction := helperpb.Transfer_DIRECTION_LOAD
	if job.dump {
		direction = helperpb.Transfer_DIRECTION_DUMP
	}
	watch := watchGPU(socket, job.dir, direction, n.start, bar)
	var out swrk.Outcome
	if job.dump {
		out = cmd.Dump(opts, n)
	} else {
		out = cmd.Restore(opts, n)
	}
	n.gpu = watch.stop()
	zlog := logger(c)
	zlog.Debug("criu ran", zap.String("criu", criuBin), zap.Int("swrk_pid", out.Pid), zap.String("plugin_dir", job.pluginDir),
		zap.String("config", sess.config), zap.Bool("timed_out", out.TimedOut), zap.Error(out.Err))
	_ = zlog.Sync()
	if _, line := gpuSummary(n.gpu); line != "" && n.w != nil {
		fmt.Fprintf(n.w, "  %s\n", line)
	}
	privateLog := filepath.Join(sess.dir, log)
	logPath := filepath.Join(job.dir, log)
	// CRIU writes its log and its statistics (stats-dump, stats-restore)
	// into its work directory.
	for _, name := range []string{log, "stats-dump", "stats-restore"} {
		err := placeFile(d, job.dir, filepath.Join(sess.dir, name), name)
		if err != nil && (name == log || !errors.Is(err, fs.ErrNotExist)) { // CRIU writes one of the two statistics
			fmt.Fprintf(c.App.ErrWriter, "gpucr: warning: CRIU's %s could not be placed in the image directory: %v\n", name, err)
		}
	}
	if out.Err == nil && !out.TimedOut {
		if job.dump {
			if err := cd.publish(); err != nil {
				return n, err
			}
		} else {
			cd.keepNew()
		}
		n.plugin = sess.pluginLines()
		return n, nil
	}
	f := &criuFailure{Log: logPath, TimedOut: out.TimedOut, Cancelled: out.Cancelled, Err: out.Err,
		Summary: fmt.Sprintf("%s failed; see %s", job.what, logPath)}
	if out.TimedOut {
		f.Summary = timeoutSummary(job.what, deadline, out, logPath)
	}
	if out.Cancelled {
		f.Summary = fmt.Sprintf("%s interrupted: stopped CRIU", job.what)
		if len(out.Killed) > 0 {
			f.Summary += fmt.Sprintf(" and the processes it was restoring (%v)", out.Killed)
		}
	}
	f.CRIU, err = criuLogFile(privateLog, maxCRIUErrors)
	if err != nil {
		f.CRIU = []string{fmt.Sprintf("(CRIU's log cannot be read: %v)", err)}
	}
	f.Plugin = sess.pluginLines()
	if out.Cancelled {
		// what CRIU said after it was stopped is noise
		f.CRIU, f.Plugin = nil, nil
	}
	f.Hints = criuHintsFor(append(append([]string{}, f.CRIU...), f.Plugin...))
	if (out.TimedOut || out.Cancelled) && len(job.clients) > 0 {
		f.Processes = waitGPUBack(socket, job.clients, gpuBackWait)
	}
	return n, f
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
	return s + "; see " + logPath
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

// wholeCheckpoint is `gpucr checkpoint PID -D DIR` without --gpu-only.
func wholeCheckpoint(c *ucli.Context, pid int64, dir, parent string) error {
	if !processExists(int(pid)) {
		return fmt.Errorf("no process %d", pid)
	}
	if err := sessionLeaderCheck(int32(pid), c.Bool("shell-job")); err != nil {
		return err
	}
	if err := checkpointDir(dir); err != nil {
		return err
	}
	socket := client.SocketPath(c.String("socket"))
	tc := gpuClientsOf(socket, int(pid))
	plugin, err := findPlugin(c.String("plugin-dir"))
	if err != nil {
		return err
	}
	if plugin.Dir == "" && len(tc.Clients) > 0 {
		return fmt.Errorf("checkpoint %d refused: its tree holds GPU processes of the helper (%s), and %s",
			pid, pidList(tc.Clients), plugin.notFound())
	}
	if free, err := freeBytes(dir); err == nil && tc.Bytes > free {
		// Refused before anything is paused: the copy would fail on a full
		// disk only after the application had waited for it. With a parent
		// image only the chunks it lacks are written, so that may fit.
		if parent == "" {
			return fmt.Errorf("checkpoint refused: %s has %s free, and the GPU memory of the tree alone is %s; free space there or choose another directory",
				dir, humanBytes(free), humanBytes(tc.Bytes))
		}
		fmt.Fprintf(c.App.ErrWriter, "gpucr: warning: %s has %s free; the GPU memory of the tree alone is %s (the parent image may hold most of it)\n",
			dir, humanBytes(free), humanBytes(tc.Bytes))
	}
	held, err := heldEntries(dir)
	if err != nil {
		return err
	}
	var aside *asideDir
	if len(held) > 0 {
		if !c.Bool("force") {
			return fmt.Errorf("checkpoint refused: %s already holds %s, which a new image would mix with; choose a new directory, or --force to replace it",
				dir, describeHeld(held))
		}
		if aside, err = putAside(dir, held); err != nil {
			return err
		}
	}
	manifest := filepath.Join(dir, "gpucr", "manifest.pb")
	before, _ := os.Stat(manifest)
	// the pids a restore must get back, known before CRIU kills the tree
	// (the tree read for the helper's clients above)
	tree := make([]int32, 0, len(tc.Tree))
	for _, p := range tc.Tree {
		tree = append(tree, int32(p))
	}
	n, err := criuRun(c, criuJob{dir: dir, dump: true, pluginDir: plugin.Dir, clients: tc.Clients, parent: parent,
		what: fmt.Sprintf("criu dump of pid %d", pid),
		fill: func(o *rpc.CriuOpts) {
			o.Pid = proto.Int32(int32(pid))
			o.LeaveRunning = proto.Bool(c.Bool("leave-running"))
		}})
	if err != nil {
		return failedDump(dir, err, aside, !slices.Contains(held, "gpucr"))
	}
	if aside != nil {
		if derr := aside.discard(); derr != nil {
			fmt.Fprintf(c.App.ErrWriter, "gpucr: warning: %v\n", derr)
		}
	}
	after, _ := os.Stat(manifest)
	gpuState := after != nil && (before == nil || !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()))
	secs := time.Since(n.start).Seconds()
	gpu, _ := gpuSummary(n.gpu)
	v := map[string]any{"pid": pid, "images_dir": dir, "seconds": secs, "image_bytes": dirBytes(dir),
		"leave_running": c.Bool("leave-running"), "gpu": gpu, "gpu_state": gpuState,
		"gpu_processes": nonNilInts(tc.Clients), "plugin_dir": plugin.Dir, "plugin_messages": nonNil(n.plugin)}
	line := fmt.Sprintf("checkpoint %d: done in %.3f s, image %s in %s", pid, secs, humanBytes(uint64(dirBytes(dir))), dir)
	if !c.Bool("leave-running") {
		// Return once the tree's pids are free, so that a restore right
		// after (a script's next line) can have them.
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(c.Context, treeGoneWait)
		held := proc.WaitReleased(ctx, tree)
		cancel()
		v["pids_released_after_seconds"] = time.Since(t0).Seconds()
		if len(held) > 0 {
			why := heldPidsReason(held, time.Since(t0).Round(100*time.Millisecond))
			v["pids_held"] = why
			fmt.Fprintf(c.App.ErrWriter, "gpucr: warning: %s\n", why)
		}
	}
	if !gpuState {
		why := noGPUStateReason(tc, plugin)
		v["no_gpu_state"] = why
		line += "\nno GPU state saved: " + why
	}
	return report(c, v, line, n.plugin)
}

// failedDump cleans up after a dump that failed: the GPU image the helper
// began in DIR is removed where DIR held none before (a failed GPU image
// only misleads), an interrupted run's log goes too, and an old image put
// aside for --force comes back. What was done is added to the failure.
func failedDump(dir string, err error, aside *asideDir, gpuNew bool) error {
	var f *criuFailure
	errors.As(err, &f)
	note := func(s string) {
		if f != nil {
			f.Cleanup = append(f.Cleanup, s)
		}
	}
	partial := filepath.Join(dir, "gpucr")
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

// treeGoneWait bounds how long a checkpoint that ends its tree waits for
// the tree's pids to be free (zombies reaped) before it returns.
const treeGoneWait = 10 * time.Second

// heldPidsReason says which processes still hold a dumped tree's pids, and
// what that means for a restore.
func heldPidsReason(held []proc.Holder, waited time.Duration) string {
	text, _ := holdersText(held)
	return fmt.Sprintf("%v after the dump, processes still hold the tree's pids: %s; a restore fails with \"File exists\" until they are gone",
		waited, text)
}

// noGPUStateReason says why a successful dump wrote no GPU image.
func noGPUStateReason(tc treeClients, plugin pluginSearch) string {
	switch {
	case tc.HelperErr != nil:
		return tc.HelperErr.Error()
	case len(tc.Clients) == 0:
		return "no process of the tree is a gpucr client"
	case plugin.Dir == "":
		return plugin.notFound()
	default:
		return fmt.Sprintf("%s of the tree were gpucr clients, but no GPU image was written (see dump.log)", pidList(tc.Clients))
	}
}

func pidList(pids []int) string {
	if len(pids) == 1 {
		return fmt.Sprintf("pid %d", pids[0])
	}
	return fmt.Sprintf("pids %v", pids)
}

func nonNilInts(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

// report prints a command's result: v with --json, else line; the plugin's
// messages of a run that succeeded go to stderr as warnings.
func report(c *ucli.Context, v map[string]any, line string, plugin []string) error {
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(v)
	}
	for _, l := range plugin {
		fmt.Fprintf(c.App.ErrWriter, "gpucr: warning: %s\n", l)
	}
	_, err := fmt.Fprintln(c.App.Writer, line)
	return err
}

// restoreCommand is `gpucr restore -D DIR`.
func restoreCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "restore",
		Usage: "restore a process tree from DIR (CRIU with gpucr's plugin)",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "images-dir", Aliases: []string{"D"}, Usage: "image directory"},
			&ucli.BoolFlag{Name: "shell-job", Usage: "the process was started from a shell (CRIU --shell-job)"},
			pluginDirFlag(), socketFlag(), criuTimeoutFlag(),
			&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}},
		Action: func(c *ucli.Context) error {
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) > 0 {
				return usageError{fmt.Errorf("restore: unexpected arguments %q (usage: gpucr restore -D DIR)", pos)}
			}
			dir := c.String("images-dir")
			if dir == "" {
				return usageError{errors.New("restore: -D DIR is required")}
			}
			if dir, err = filepath.Abs(dir); err != nil {
				return err
			}
			if err := restoreDir(dir); err != nil {
				return err
			}
			if err := restorePidsFree(c.Context, dir); err != nil {
				return err
			}
			plugin, err := findPlugin(c.String("plugin-dir"))
			if err != nil {
				return err
			}
			if _, err := os.Stat(filepath.Join(dir, "gpucr")); err == nil && plugin.Dir == "" {
				return fmt.Errorf("restore refused: %s holds GPU state (gpucr/), and %s", dir, plugin.notFound())
			}
			n, err := criuRun(c, criuJob{dir: dir, pluginDir: plugin.Dir, what: "criu restore from " + dir,
				fill: func(o *rpc.CriuOpts) { o.RstSibling = proto.Bool(true) }})
			_, statErr := os.Stat(filepath.Join(dir, "gpucr", "manifest.pb"))
			gpuState := statErr == nil
			socket := client.SocketPath(c.String("socket"))
			if err != nil {
				// CRIU also fails when a restored process that cannot get
				// its GPU memory back is stopped while CRIU still detaches
				// from it: the helper knows why.
				if gpuState {
					if _, werr := waitGPURestored(socket, dir, 3*time.Second); werr != nil && !strings.Contains(werr.Error(), "no restore from") {
						return fmt.Errorf("%w; %v", err, werr)
					}
				}
				return err
			}
			// CRIU is done; with GPU state, each process must also have its
			// GPU memory back before this says it runs.
			var procs []restoredProcess
			if gpuState {
				if procs, err = waitGPURestored(socket, dir, restoredWait); err != nil {
					return fmt.Errorf("restore from %s: CRIU restored the processes, but %w", dir, err)
				}
			}
			gpu, _ := gpuSummary(n.gpu)
			return report(c, map[string]any{"pid": n.pid, "images_dir": dir, "seconds": time.Since(n.start).Seconds(), "gpu": gpu,
				"plugin_dir": plugin.Dir, "plugin_messages": nonNil(n.plugin), "gpu_processes": procs},
				fmt.Sprintf("restore: pid %d running again after %.3f s", n.pid, time.Since(n.start).Seconds()), n.plugin)
		},
	}
}
