package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// checkpointCommand is `gpucr checkpoint PID -D DIR`: the whole process
// through CRIU (criu swrk) with gpucr's plugin; with --gpu-only, the GPU state
// alone through the helper, without CRIU (the process stays checkpointed
// until `gpucr resume`, or keeps running with --leave-running).
func checkpointCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "checkpoint",
		Usage:     "checkpoint a process (CRIU with gpucr's plugin), or with --gpu-only its GPU state alone, into DIR",
		ArgsUsage: "PID",
		Flags: []ucli.Flag{socketFlag(),
			&ucli.StringFlag{Name: "images-dir", Aliases: []string{"D"}, Usage: "image directory (created if missing)"},
			&ucli.BoolFlag{Name: "gpu-only", Usage: "only the GPU state, through the helper, without CRIU"},
			&ucli.BoolFlag{Name: "shell-job", Usage: "the process was started from a shell (CRIU --shell-job)"},
			pluginDirFlag(), criuTimeoutFlag(),
			&ucli.BoolFlag{Name: "leave-running", Usage: "give the process its GPU back at once"},
			&ucli.StringFlag{Name: "parent", Usage: "parent image directory: an incremental GPU image (only chunks the parent chain lacks are copied)"},
			&ucli.BoolFlag{Name: "auto-parent", Usage: "the parent is the newest committed image beside DIR (a series such as -D base/N)"},
			&ucli.BoolFlag{Name: "compress", Usage: "zstd-compress chunks (slow storage)"},
			&ucli.BoolFlag{Name: "force", Usage: "replace the image DIR already holds (removed once the new one is complete; kept if the checkpoint fails)"},
			&ucli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "how long the process may take to reach a quiet point"},
			&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}},
		Action: func(c *ucli.Context) error {
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
			parent, err := checkpointParent(c, abs)
			if err != nil {
				return err
			}
			if !c.Bool("gpu-only") {
				return wholeCheckpoint(c, pid, abs, parent)
			}
			d, err := gpuImageDir(abs)
			if err != nil {
				return err
			}
			defer d.Close()
			req := &helperpb.Checkpoint{Pid: pid, ImageDir: abs, LeaveRunning: c.Bool("leave-running"), Parent: parent,
				Compress: c.Bool("compress"), TimeoutMs: uint32(c.Duration("timeout") / time.Millisecond)}
			return callCheckpoint(c, &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: req}},
				fmt.Sprintf("checkpoint %d", pid), int(d.Fd()))
		},
	}
}

// checkpointParent is the parent image of an incremental checkpoint into
// dir: --parent, or with --auto-parent the newest committed image beside
// dir (image.LatestOwned: the caller's own images; as root, those of
// whoever owns the series directory), "" for a full image.
func checkpointParent(c *ucli.Context, dir string) (string, error) {
	parent := c.String("parent")
	switch {
	case parent != "" && c.Bool("auto-parent"):
		return "", usageError{fmt.Errorf("checkpoint: --parent and --auto-parent exclude each other")}
	case parent != "":
		return filepath.Abs(parent)
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
			fmt.Fprintf(c.App.Writer, "no committed image in %s yet: a full GPU image\n", base)
		} else {
			fmt.Fprintf(c.App.Writer, "parent: %s\n", latest)
		}
	}
	return latest, nil
}

// resumeCommand is `gpucr resume PID`: a process that `gpucr checkpoint`
// left checkpointed gets its GPU back.
func resumeCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "resume",
		Usage:     "give a process left checkpointed by `gpucr checkpoint` its GPU back",
		ArgsUsage: "PID",
		Flags:     []ucli.Flag{socketFlag(), &ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}},
		Action: func(c *ucli.Context) error {
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) != 1 {
				return usageError{fmt.Errorf("usage: gpucr resume PID")}
			}
			pid, err := parsePid("resume", pos[0])
			if err != nil {
				return err
			}
			return callCheckpoint(c, &helperpb.Request{Body: &helperpb.Request_ResumeCheckpointed{
				ResumeCheckpointed: &helperpb.ResumeCheckpointed{Pid: pid}}}, fmt.Sprintf("resume %d", pid), -1)
		},
	}
}

// gpuImageDir prepares the image directory of a --gpu-only checkpoint, as
// the user who runs gpucr: DIR and DIR/gpucr are made (0700) if missing, so
// the kernel checks that this user may write there, and DIR is opened. The
// helper, which runs as root, writes only beneath the descriptor passed to
// it, into DIR/gpucr, and gives what it writes to this user.
func gpuImageDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	if err := unix.Mkdirat(fd, image.SubDir, 0o700); err != nil && err != unix.EEXIST {
		d.Close()
		return nil, fmt.Errorf("image directory %s: %w", filepath.Join(dir, image.SubDir), err)
	}
	return d, nil
}

// callCheckpoint sends a Checkpoint (with dirFD, the image directory, if not
// -1) or a ResumeCheckpointed and prints the reply.
func callCheckpoint(c *ucli.Context, req *helperpb.Request, what string, dirFD int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	conn, err := client.Dial(ctx, client.SocketPath(c.String("socket")), helperpb.Role_ROLE_CLI, "gpucr")
	if err != nil {
		return err
	}
	defer conn.Close()
	var send []int
	if dirFD >= 0 {
		send = []int{dirFD}
	}
	resp, _, err := conn.CallFDs(ctx, req, send)
	var he *client.Error
	if errors.As(err, &he) && he.Code == helperpb.ErrorCode_ERROR_STATE && req.GetResumeCheckpointed() != nil {
		return fmt.Errorf("%s: nothing to resume: %s; only a process that `gpucr checkpoint --gpu-only` (without --leave-running) left checkpointed waits for its GPU",
			what, he.Message)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	r := resp.GetCheckpoint()
	if r == nil {
		return fmt.Errorf("%s: the helper answered without a checkpoint reply", what)
	}
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
	_, err = fmt.Fprintf(c.App.Writer, "%s; state %s\n  %s\n", line, stateName(r.State), strings.Join(parts, ", "))
	if err == nil && r.State == helperpb.ClientState_CLIENT_STATE_DROPPED {
		if ck := req.GetCheckpoint(); ck != nil {
			_, err = fmt.Fprintf(c.App.Writer, "  pid %d waits without its GPU memory: `gpucr resume %d` gives it back from %s (`gpucr image inspect %s` describes the image)\n",
				ck.Pid, ck.Pid, ck.ImageDir, ck.ImageDir)
		}
	}
	return err
}
