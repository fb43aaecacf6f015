package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/image/level"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// checkpointCommand is `gpucr checkpoint PID -D DIR`: the whole process
// through CRIU with gpucr's plugin (checkpoint.Dump); with --gpu-only, the
// GPU state alone through the helper, without CRIU (the process stays
// checkpointed until `gpucr resume`, or keeps running with --leave-running).
func checkpointCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "checkpoint",
		Usage:     "checkpoint a process (CRIU with gpucr's plugin), or with --gpu-only its GPU state alone, into DIR",
		ArgsUsage: "PID",
		Description: "A CRIU dump needs no CRIU flags for a training job: before anything stops, the checkpoint reads the tree's\n" +
			"/proc (open and mapped files, TCP connections) as the user who runs it and turns on --link-remap for files unlinked\n" +
			"while another name links them (Python's multiprocessing semaphores), and --tcp-established with --network-lock skip\n" +
			"where every TCP connection has both ends in the tree. It prints them, with why (auto_options in --json), and records\n" +
			"them in DIR/gpucr-dump.json for the restore. A connection to a peer outside the tree is refused before anything stops,\n" +
			"naming it: --tcp-close, --tcp-established or a tree that holds the peer. Options given explicitly always win.",
		Flags: append([]ucli.Flag{socketFlag(),
			&ucli.StringFlag{Name: "images-dir", Aliases: []string{"D"}, Usage: "image directory (created if missing)"},
			&ucli.BoolFlag{Name: "gpu-only", Usage: "only the GPU state, through the helper, without CRIU"},
			shellJobFlag(),
			pluginDirFlag(), criuTimeoutFlag(),
			&ucli.BoolFlag{Name: "leave-running", Usage: "give the process its GPU back at once"},
			&ucli.BoolFlag{Name: "concurrent", Usage: "with --leave-running: snapshot the GPU memory on the device and write it into the image while the process runs on, so that the stop does not grow with it; a helper that dies during a CRIU dump's stop then costs the process its GPU memory (default with --gpu-only, where the process never gives its memory up)"},
			preCopyFlag(),
			&ucli.StringFlag{Name: "drain", Usage: "once the image is complete, push it to an object store in the background (s3://BUCKET/PATH: gpucr image push; credentials and endpoint from the environment, AWS_ENDPOINT_URL); gpucr status shows it"},
			&ucli.BoolFlag{Name: "wait", Usage: "with --drain: push in the foreground and return once the image is safe in the store (a final checkpoint on a preemption notice: README, \"Images on an object store\")"},
			keepFlag(),
			&ucli.DurationFlag{Name: "deadline", Usage: "with --drain --wait: the time from this command's start that the image must be safe by (a preemption notice's grace period); the report says whether it was, and a miss exits 1 (the push is not cut at it)"},
			&ucli.BoolFlag{Name: "template", Usage: "served mode: keep in the image what a worker needs to hold the process's GPU objects before its restore (gpucr image load --template), so that the restore attaches to a worker that made them ahead"},
			&ucli.StringFlag{Name: "parent", Usage: "parent image directory: an incremental GPU image (only chunks the parent chain lacks are copied)"},
			&ucli.BoolFlag{Name: "auto-parent", Usage: "the parent is the newest committed image beside DIR (a series such as -D base/N)"},
			&ucli.BoolFlag{Name: "compress", Usage: "zstd-compress chunks (slow storage)"},
			&ucli.BoolFlag{Name: "force", Usage: "replace the image DIR already holds (removed once the new one is complete; kept if the checkpoint fails)"},
			&ucli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "how long the process may take to reach a quiet point"},
			&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}}, criuOptionFlags()...),
		Action: func(c *ucli.Context) error {
			began := time.Now() // a deadline counts from here: the notice
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) != 1 {
				return usageError{fmt.Errorf("usage: gpucr checkpoint PID -D DIR [--gpu-only] [--leave-running]")}
			}
			pid, err := parsePid("checkpoint", pos[0])
			if err != nil {
				return err
			}
			dir := c.String("images-dir")
			if dir == "" {
				return usageError{fmt.Errorf("checkpoint: -D DIR is required")}
			}
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			if d := c.String("drain"); d != "" {
				if _, err := level.Parse(d); err != nil {
					return usageError{fmt.Errorf("checkpoint --drain: %w", err)}
				}
			}
			if c.IsSet("keep") && c.String("drain") == "" {
				return usageError{fmt.Errorf("checkpoint --keep: images are pruned once safe at a level, and no --drain was given")}
			}
			if c.IsSet("keep") && c.Int("keep") < 1 {
				return usageError{fmt.Errorf("checkpoint --keep %d: at least the newest image must stay", c.Int("keep"))}
			}
			if c.Bool("wait") && c.String("drain") == "" {
				return usageError{fmt.Errorf("checkpoint --wait: it waits for --drain's push, and no --drain was given")}
			}
			if c.IsSet("deadline") && !c.Bool("wait") {
				return usageError{fmt.Errorf("checkpoint --deadline: it bounds --drain --wait (a background drain has no end to measure)")}
			}
			if c.IsSet("deadline") && c.Duration("deadline") <= 0 {
				return usageError{fmt.Errorf("checkpoint --deadline: %s is no time to make it in", c.Duration("deadline"))}
			}
			if c.Bool("wait") && c.Bool("gpu-only") {
				return usageError{fmt.Errorf("checkpoint --drain --wait: a GPU-only checkpoint is no image that restores elsewhere")}
			}
			ctx, stop := interruptible(c.Context)
			defer stop()
			events := newEventPrinter(c.App.Writer, c.App.ErrWriter, c.Bool("json"))
			parent, err := checkpointParent(c, abs, events)
			if err != nil {
				return err
			}
			if c.Bool("gpu-only") && c.Int("pre-copy") > 0 {
				return usageError{fmt.Errorf("checkpoint: --pre-copy is for a CRIU dump (a GPU-only checkpoint with --leave-running --concurrent stops the process only for its snapshot already)")}
			}
			if c.Bool("gpu-only") && c.Bool("template") {
				return usageError{fmt.Errorf("checkpoint: --template is for a CRIU dump (a GPU-only checkpoint lets no served process go from its worker)")}
			}
			if c.Bool("gpu-only") {
				r, err := checkpoint.DumpGPU(ctx, checkpoint.GPUOptions{Pid: pid, Dir: abs, Parent: parent,
					LeaveRunning: c.Bool("leave-running"), Concurrent: concurrent(c),
					Compress: c.Bool("compress"), Quiesce: c.Duration("timeout"),
					Socket: client.SocketPath(c.String("socket")), Force: c.Bool("force")})
				if err != nil {
					return err
				}
				return reportGPU(c, r, fmt.Sprintf("checkpoint %d", pid), pid, abs)
			}
			criu, env, err := criuSetup(c)
			if err != nil {
				return err
			}
			res, err := checkpoint.Dump(ctx, checkpoint.DumpOptions{Pid: pid, Dir: abs, Parent: parent,
				LeaveRunning: c.Bool("leave-running"), Concurrent: concurrent(c), Template: c.Bool("template"),
				PreCopy: checkpoint.PreCopy{Rounds: c.Int("pre-copy")},
				Force:   c.Bool("force"), CRIU: criu, Env: env, Events: events.handle})
			if err != nil {
				return err
			}
			line := fmt.Sprintf("checkpoint %d: done in %s, image %s in %s", pid, dumpTimes(res), humanBytes(uint64(res.ImageBytes)), abs)
			line += preCopyText(res.PreCopy)
			if res.Redone != "" {
				line += "\n  redone: " + res.Redone
			}
			if res.StallSeconds > 0 {
				line += fmt.Sprintf("\n  stopped %.3f s (the longest of its GPU processes, from the quiesce to the resume)", res.StallSeconds)
			}
			if len(res.AutoOptions) > 0 {
				line += "\n  CRIU options chosen by gpucr for what the tree holds: " + autoOptionsText(res.AutoOptions)
			}
			line += "\n  steps: " + stepsText(res.Phases)
			if s := res.CRIU; s != nil {
				line += fmt.Sprintf("\n  CRIU: the tree frozen %.3f s (freezing it %.3f s), its memory collected in %.3f s and written in %.3f s (%d pages)",
					s.FrozenSeconds, s.FreezingSeconds, s.MemdumpSeconds, s.MemwriteSeconds, s.PagesWritten)
			}
			for _, g := range res.GPUProcesses {
				if len(g.Phases) > 0 {
					line += fmt.Sprintf("\n  pid %d in the helper: %s", g.Pid, stepsText(g.Phases))
				}
			}
			if g := res.GPU.String(); g != "" {
				line = "  " + g + "\n" + line
			}
			if !res.GPUState {
				line += "\nno GPU state saved: " + res.NoGPUState
			}
			if c.Bool("wait") {
				return drainNow(ctx, c, began, pid, res, line, abs)
			}
			if err := report(c, res, line, res.PluginMessages); err != nil {
				return err
			}
			if d := c.String("drain"); d != "" {
				dpid, err := startDrain(abs, d, c.Int("keep"))
				if err != nil {
					return fmt.Errorf("checkpoint %d is complete in %s, but its drain to %s did not start: %w", pid, abs, d, err)
				}
				fmt.Fprintf(c.App.ErrWriter, "gpucr: draining %s to %s in the background (pid %d; gpucr status shows it)\n", abs, d, dpid)
			}
			return nil
		},
	}
}

// dumpTimes is how long a checkpoint took in all, and where a wait for the
// tree's pids followed the dump, its two parts: "2.130 s (the image 0.498
// s, then 1.632 s until the tree's pids were free)".
func dumpTimes(res *checkpoint.DumpResult) string {
	s := fmt.Sprintf("%.3f s", res.Seconds)
	if w := res.PidsReleasedAfterSeconds; w != nil {
		s += fmt.Sprintf(" (the image %.3f s, then %.3f s until the tree's pids were free)", res.DumpSeconds, *w)
	}
	return s
}

// autoOptionsText is "--link-remap --tcp-established ...": the options a
// checkpoint chose (why is in its notes and in --json's auto_options).
func autoOptionsText(auto []checkpoint.AutoOption) string {
	opts := make([]string, len(auto))
	for i, a := range auto {
		opts[i] = a.Option
	}
	return strings.Join(opts, " ")
}

// concurrent says whether a checkpoint is concurrent: only one that leaves
// the process running; as --concurrent says, else for a GPU-only one (its
// process never gives its memory up, so nothing is at stake) but not for a
// CRIU dump (the helper holds the memory alone during the stop).
func concurrent(c *ucli.Context) bool {
	if !c.Bool("leave-running") {
		return false
	}
	if c.IsSet("concurrent") {
		return c.Bool("concurrent")
	}
	return c.Bool("gpu-only")
}

// preCopyFlag is --pre-copy N of checkpoint and migrate.
func preCopyFlag() ucli.Flag {
	return &ucli.IntFlag{Name: "pre-copy", Value: 0, Usage: "copy the GPU memory while the process runs, in up to N rounds (each copies what changed since the one before; they stop once that no longer shrinks), then stop it and copy only what changed since (0: no pre-copy)"}
}

// preCopyText is the rounds of a pre-copy, one line each.
func preCopyText(rounds []checkpoint.PreCopyRound) string {
	var s string
	for _, r := range rounds {
		s += fmt.Sprintf("\n  pre-copy round %d: %s copied of %s in %.3f s (stopped %.3f s)", r.Round,
			humanBytes(r.CopiedBytes), humanBytes(r.Bytes), r.Seconds, r.StallSeconds)
	}
	return s
}

// interruptible is ctx, cancelled by Ctrl-C or a SIGTERM: a checkpoint or a
// restore then stops CRIU as its deadline does (the processes get their GPU
// back), rather than being killed midway. The signal is noted where Run
// finds it (ctx's caughtSignal), so that the command exits 130 or 143, as
// one the signal had killed, not 1 as any failure.
func interruptible(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-ch:
			if c, ok := ctx.Value(caughtKey{}).(*caughtSignal); ok {
				c.set(s)
			}
			cancel()
		case <-ctx.Done():
		}
	}()
	// Until stop, a second Ctrl-C is caught too: the command is already
	// ending, giving the processes their GPU back.
	return ctx, func() { signal.Stop(ch); cancel() }
}

// caughtSignal is the signal that interrupted a command (Run's context
// holds it under caughtKey).
type caughtSignal struct{ sig atomic.Int32 }

type caughtKey struct{}

func (c *caughtSignal) set(s os.Signal) {
	if n, ok := s.(syscall.Signal); ok {
		c.sig.Store(int32(n))
	}
}

func (c *caughtSignal) signal() syscall.Signal { return syscall.Signal(c.sig.Load()) }

// checkpointParent is the parent image of an incremental checkpoint into
// dir: --parent, or with --auto-parent the newest committed image beside
// dir (image.LatestOwned: the caller's own images; as root, those of
// whoever owns the series directory), "" for a full image.
func checkpointParent(c *ucli.Context, dir string, events *eventPrinter) (string, error) {
	parent := c.String("parent")
	switch {
	case parent != "" && c.Bool("auto-parent"):
		return "", usageError{fmt.Errorf("checkpoint: --parent and --auto-parent exclude each other")}
	case parent != "":
		abs, err := filepath.Abs(parent)
		if err == nil && !c.Bool("json") {
			if w := parentElsewhere(dir, abs); w != "" {
				fmt.Fprintf(c.App.ErrWriter, "gpucr: warning: %s\n", w)
			}
		}
		return abs, err
	case !c.Bool("auto-parent"):
		return "", nil
	}
	base := filepath.Dir(dir)
	latest, err := image.LatestOwned(base, dir)
	if err != nil {
		return "", fmt.Errorf("--auto-parent: %w", err)
	}
	if !c.Bool("json") {
		if latest == "" {
			fmt.Fprintf(events.out, "no committed image in %s yet: a full GPU image\n", base)
		} else {
			fmt.Fprintf(events.out, "parent: %s\n", latest)
		}
	}
	return latest, nil
}

// parentElsewhere says, where the parent image lies on another file system
// than the image to be written into dir, that its chunks will be stored
// again: an image links the chunk files it shares with its parent, and
// there are no hard links across file systems ("" otherwise).
func parentElsewhere(dir, parent string) string {
	pst, err := os.Stat(parent)
	if err != nil {
		return "" // the checkpoint says what is wrong with it
	}
	d := dir
	for {
		if st, err := os.Stat(d); err == nil {
			a, b := st.Sys().(*syscall.Stat_t), pst.Sys().(*syscall.Stat_t)
			if a != nil && b != nil && a.Dev != b.Dev {
				return fmt.Sprintf("the parent image %s is on another file system than %s: the chunks they share cannot be hard-linked, so they are stored again (an image never reads another image's files)",
					parent, dir)
			}
			return ""
		}
		up := filepath.Dir(d)
		if up == d {
			return ""
		}
		d = up
	}
}

// report prints a command's result: v with --json (one line, as a failure
// is), else line; the plugin's messages of a run that succeeded go to
// stderr as warnings.
func report(c *ucli.Context, v any, line string, plugin []string) error {
	if c.Bool("json") {
		return writeJSON(c.App.Writer, v)
	}
	for _, l := range plugin {
		fmt.Fprintf(c.App.ErrWriter, "gpucr: warning: %s\n", l)
	}
	_, err := fmt.Fprintln(c.App.Writer, line)
	return err
}

// reportGPU prints the helper's reply to a GPU-only checkpoint or a resume.
func reportGPU(c *ucli.Context, r *helperpb.CheckpointReply, what string, pid proc.Pid, dir string) error {
	if c.Bool("json") {
		b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
		return err
	}
	var parts []string
	for _, p := range r.Phases {
		parts = append(parts, fmt.Sprintf("%s %.3f s", p.Name, p.Seconds))
	}
	line := fmt.Sprintf("%s: done in %.3f s", what, r.TotalSeconds)
	if r.Bytes > 0 {
		line += fmt.Sprintf(", %d buffers, %s of GPU memory (%s over PCIe, %s stored)", r.Buffers, humanBytes(r.Bytes),
			humanBytes(r.BytesMoved), humanBytes(r.StoredBytes))
	}
	if r.GuardedBytes > 0 {
		line += fmt.Sprintf("; %s saved behind a copy-on-write window while it ran on", humanBytes(r.GuardedBytes))
	}
	if r.Redone != "" {
		line += "\n  redone: " + r.Redone
	}
	_, err := fmt.Fprintf(c.App.Writer, "%s; state %s\n  %s\n", line, checkpoint.StateName(r.State), strings.Join(parts, ", "))
	if err == nil && r.State == helperpb.ClientState_CLIENT_STATE_DROPPED && dir != "" {
		_, err = fmt.Fprintf(c.App.Writer, "  pid %d waits without its GPU memory: `gpucr resume %d` gives it back from %s (`gpucr image inspect %s` describes the image)\n",
			pid, pid, dir, dir)
	}
	return err
}

// stepsText is "quiesce 0.001 s, copy 0.812 s, ...".
func stepsText(steps []checkpoint.Step) string {
	parts := make([]string, len(steps))
	for i, s := range steps {
		parts[i] = fmt.Sprintf("%s %.3f s", s.Name, s.Seconds)
	}
	return strings.Join(parts, ", ")
}
