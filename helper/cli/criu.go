package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	ucli "github.com/urfave/cli/v2"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// The whole-process checkpoint and restore: CRIU through go-criu (swrk),
// with gpucr's plugin, which moves the GPU state through the helper.

// pluginDirFlag: where CRIU finds gpucr_plugin.so. By default CRIU's own
// plugin directory (make install puts it there), unless a plugin next to
// this binary (a build tree or a bundle) is found first.
func pluginDirFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "plugin-dir", Usage: "directory with gpucr_plugin.so for CRIU (default: next to gpucr, else CRIU's own)"}
}

func pluginDir(c *ucli.Context) string {
	if d := c.String("plugin-dir"); d != "" {
		return d
	}
	if exe, err := os.Executable(); err == nil {
		for _, d := range []string{filepath.Join(filepath.Dir(exe), "..", "lib", "criu"), filepath.Join(filepath.Dir(exe), "..", "lib")} {
			if _, err := os.Stat(filepath.Join(d, "gpucr_plugin.so")); err == nil {
				return filepath.Clean(d)
			}
		}
	}
	return ""
}

// criuConfig writes a CRIU configuration file naming the plugin directory
// (the RPC has no option for it) and returns its path, "" if none is needed.
func criuConfig(dir, libdir string) (string, error) {
	if libdir == "" {
		return "", nil
	}
	abs, err := filepath.Abs(libdir)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, ".gpucr-criu.conf")
	return p, os.WriteFile(p, []byte("libdir "+abs+"\n"), 0o644)
}

// notifier prints CRIU's phases on a terminal (not with --json).
type notifier struct {
	criu.NoNotify
	w     io.Writer
	start time.Time
	pid   int32
	gpu   *helperpb.Transfer // the helper's copy of the GPU data, if it saw one
}

func (n *notifier) say(what string) {
	if n.w != nil {
		fmt.Fprintf(n.w, "  %6.3f s  %s\n", time.Since(n.start).Seconds(), what)
	}
}
func (n *notifier) PreDump() error {
	n.say("dumping (the plugin saves the GPU state through the helper)")
	return nil
}
func (n *notifier) PostDump() error { n.say("dumped"); return nil }
func (n *notifier) PreRestore() error {
	n.say("restoring (the helper loads the GPU memory meanwhile)")
	return nil
}
func (n *notifier) PostRestore(pid int32) error {
	n.pid = pid
	n.say(fmt.Sprintf("restored pid %d", pid))
	return nil
}

// criuRun drives one CRIU dump or restore of the image directory dir.
func criuRun(c *ucli.Context, dir string, dump bool, fill func(*rpc.CriuOpts)) (*notifier, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image directory: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("image directory: %w", err)
	}
	defer d.Close()
	conf, err := criuConfig(dir, pluginDir(c))
	if err != nil {
		return nil, fmt.Errorf("CRIU configuration: %w", err)
	}
	if conf != "" {
		defer os.Remove(conf)
	}
	log := "restore.log"
	if dump {
		log = "dump.log"
	}
	opts := &rpc.CriuOpts{
		ImagesDirFd: proto.Int32(int32(d.Fd())),
		LogFile:     proto.String(log),
		LogLevel:    proto.Int32(4),
		ShellJob:    proto.Bool(c.Bool("shell-job")),
	}
	if conf != "" {
		opts.ConfigFile = proto.String(conf)
	}
	fill(opts)
	n := &notifier{start: time.Now()}
	if !c.Bool("json") {
		n.w = c.App.Writer
	}
	// The plugin, inside CRIU, reaches the helper this command was told about.
	socket := client.SocketPath(c.String("socket"))
	if err := os.Setenv("GPUCR_SOCKET", socket); err != nil {
		return nil, err
	}
	var bar io.Writer
	if n.w != nil && isTerminal(n.w) {
		bar = n.w
	}
	direction := helperpb.Transfer_DIRECTION_LOAD
	if dump {
		direction = helperpb.Transfer_DIRECTION_DUMP
	}
	watch := watchGPU(socket, dir, direction, n.start, bar)
	cr := criu.MakeCriu()
	if p := os.Getenv("GPUCR_CRIU"); p != "" {
		cr.SetCriuPath(p)
	}
	if dump {
		err = cr.Dump(opts, n)
	} else {
		err = cr.Restore(opts, n)
	}
	n.gpu = watch.stop()
	if _, line := gpuSummary(n.gpu); line != "" && n.w != nil {
		fmt.Fprintf(n.w, "  %s\n", line)
	}
	if err != nil {
		return n, fmt.Errorf("criu %s: %w (see %s)", map[bool]string{true: "dump", false: "restore"}[dump], err, filepath.Join(dir, log))
	}
	return n, nil
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
func wholeCheckpoint(c *ucli.Context, pid int64, dir string) error {
	n, err := criuRun(c, dir, true, func(o *rpc.CriuOpts) {
		o.Pid = proto.Int32(int32(pid))
		o.LeaveRunning = proto.Bool(c.Bool("leave-running"))
	})
	if err != nil {
		return err
	}
	gpu, _ := gpuSummary(n.gpu)
	return report(c, map[string]any{"pid": pid, "images_dir": dir, "seconds": time.Since(n.start).Seconds(),
		"image_bytes": dirBytes(dir), "leave_running": c.Bool("leave-running"), "gpu": gpu},
		fmt.Sprintf("checkpoint %d: done in %.3f s, image %s in %s", pid, time.Since(n.start).Seconds(), humanBytes(uint64(dirBytes(dir))), dir))
}

func report(c *ucli.Context, v map[string]any, line string) error {
	if c.Bool("json") {
		return json.NewEncoder(c.App.Writer).Encode(v)
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
			pluginDirFlag(), socketFlag(),
			&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}},
		Action: func(c *ucli.Context) error {
			if _, err := flagsAnywhere(c); err != nil {
				return helpOK(err)
			}
			dir := c.String("images-dir")
			if dir == "" {
				return usageError{errors.New("restore: -D DIR is required")}
			}
			n, err := criuRun(c, dir, false, func(o *rpc.CriuOpts) { o.RstSibling = proto.Bool(true) })
			if err != nil {
				return err
			}
			gpu, _ := gpuSummary(n.gpu)
			return report(c, map[string]any{"pid": n.pid, "images_dir": dir, "seconds": time.Since(n.start).Seconds(), "gpu": gpu},
				fmt.Sprintf("restore: pid %d running again after %.3f s", n.pid, time.Since(n.start).Seconds()))
		},
	}
}
