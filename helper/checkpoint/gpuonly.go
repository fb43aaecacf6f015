package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// A GPU-only checkpoint goes through the helper alone, without CRIU: the
// process's GPU state is saved and it either runs on (LeaveRunning) or waits
// without its GPU memory until Resume gives it back.

// GPUOptions is a GPU-only checkpoint of one process.
type GPUOptions struct {
	Pid    proc.Pid
	Dir    string // the image directory (absolute); the GPU image goes to Dir/gpucr
	Parent string // parent image directory of an incremental image, "" for a full one
	// LeaveRunning gives the process its GPU back at once.
	LeaveRunning bool
	// Concurrent (with LeaveRunning): the GPU memory is snapshotted on the
	// device and written while the process runs on (DumpOptions.Concurrent).
	Concurrent bool
	Compress   bool          // zstd-compress chunks
	Quiesce    time.Duration // how long the process may take to reach a quiet point (0: 10 s)
	Socket     string
	// Force replaces an image Dir already holds (else refused, as a
	// whole-process checkpoint is): the GPU image in place (the old one's
	// chunk files the new one does not reuse are removed once it is
	// committed), anything else (a whole-process image's CRIU files) put
	// aside, removed once the new image is committed, put back if the
	// checkpoint fails.
	Force bool
}

// gpuCallTimeout bounds a GPU-only checkpoint or a resume.
const gpuCallTimeout = 30 * time.Minute

// DumpGPU checkpoints the GPU state of o.Pid into o.Dir/gpucr. The
// directories it makes for it are removed if it fails and they stay empty.
func DumpGPU(ctx context.Context, o GPUOptions) (*helperpb.CheckpointReply, error) {
	made := &madeDirs{}
	r, err := dumpGPUInto(ctx, o, made)
	if err != nil {
		if g := filepath.Join(o.Dir, image.SubDir); made.made(g) {
			removeWriteLeftovers(g)
		}
		made.removeEmpty()
	}
	return r, err
}

// dumpGPUInto is DumpGPU, recording the directories it makes.
func dumpGPUInto(ctx context.Context, o GPUOptions, made *madeDirs) (*helperpb.CheckpointReply, error) {
	if !filepath.IsAbs(o.Dir) {
		return nil, fmt.Errorf("image directory %q: must be absolute", o.Dir)
	}
	held, err := gpuHeld(o.Dir)
	if err != nil {
		return nil, err
	}
	var aside *asideDir
	if len(held) > 0 {
		if !o.Force {
			return nil, fmt.Errorf("checkpoint refused: %s already holds %s, which a new image would replace; choose a new directory, or --force to replace it",
				o.Dir, describeHeld(held))
		}
		// Not an image that is being restored from: the restore reads it.
		lock, err := lockForReplace(o.Dir)
		if err != nil {
			return nil, err
		}
		defer lock.Close()
		if others := slices.DeleteFunc(slices.Clone(held), func(n string) bool { return n == image.SubDir }); len(others) > 0 {
			if aside, err = putAside(o.Dir, others); err != nil {
				return nil, err
			}
		}
	}
	r, err := dumpGPU(ctx, o, made)
	if aside != nil {
		if err != nil {
			if perr := aside.putBack(); perr != nil {
				err = fmt.Errorf("%w; %v", err, perr)
			}
		} else if derr := aside.discard(); derr != nil {
			err = fmt.Errorf("the image is written, but the files it replaced stay: %w", derr)
		}
	}
	return r, err
}

// gpuHeld is what Dir holds that a GPU-only image would replace: as for a
// whole-process checkpoint (heldEntries), except that DIR/gpucr counts only
// with an image in it, committed or not (an empty one, or a lock file, is
// what an earlier attempt left).
func gpuHeld(dir string) ([]string, error) {
	held, err := heldEntries(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if slices.Contains(held, image.SubDir) {
		_, merr := os.Lstat(image.ManifestPath(dir))
		_, perr := os.Lstat(image.PartsPath(dir))
		if merr != nil && perr != nil {
			held = slices.DeleteFunc(held, func(n string) bool { return n == image.SubDir })
		}
	}
	return held, nil
}

// lockForReplace takes Dir's image lock (image.LockImage) for a checkpoint
// that replaces the image there: refused while it is restored from.
func lockForReplace(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	if err := image.LockImage(d, dir); err != nil {
		d.Close()
		return nil, fmt.Errorf("checkpoint refused: %w", err)
	}
	return d, nil
}

// dumpGPU is DumpGPU once Dir may take the image.
func dumpGPU(ctx context.Context, o GPUOptions, made *madeDirs) (*helperpb.CheckpointReply, error) {
	d, err := gpuImageDirMade(o.Dir, made)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	quiesce := o.Quiesce
	if quiesce <= 0 {
		quiesce = 10 * time.Second
	}
	req := &helperpb.Checkpoint{Pid: int64(o.Pid), ImageDir: o.Dir, LeaveRunning: o.LeaveRunning, Parent: o.Parent,
		Compress: o.Compress, TimeoutMs: uint32(quiesce / time.Millisecond), Concurrent: o.Concurrent && o.LeaveRunning}
	what := fmt.Sprintf("checkpoint %d", o.Pid)
	r, err := callCheckpoint(ctx, o.Socket, &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: req}}, what, int(d.Fd()))
	if err != nil && req.Concurrent && IsChanged(err) {
		// Exact by construction: the process waits while it is copied.
		first := err
		req.Concurrent = false
		r, err = callCheckpoint(ctx, o.Socket, &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: req}}, what, int(d.Fd()))
		if r != nil {
			r.Redone = redoReason(first)
		}
	}
	return r, err
}

// Resume gives a process that a GPU-only checkpoint left waiting its GPU
// back.
func Resume(ctx context.Context, socket string, pid proc.Pid) (*helperpb.CheckpointReply, error) {
	return callCheckpoint(ctx, socket, &helperpb.Request{Body: &helperpb.Request_ResumeCheckpointed{
		ResumeCheckpointed: &helperpb.ResumeCheckpointed{Pid: int64(pid)}}}, fmt.Sprintf("resume %d", pid), -1)
}

// callCheckpoint sends a Checkpoint (with dirFD, the image directory, if not
// -1) or a ResumeCheckpointed and returns the helper's reply.
func callCheckpoint(ctx context.Context, socket string, req *helperpb.Request, what string, dirFD int) (*helperpb.CheckpointReply, error) {
	ctx, cancel := context.WithTimeout(ctx, gpuCallTimeout)
	defer cancel()
	conn, err := client.Dial(ctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var send []int
	if dirFD >= 0 {
		send = []int{dirFD}
	}
	resp, _, err := conn.CallFDs(ctx, req, send)
	var he *client.Error
	if errors.As(err, &he) && he.Code == helperpb.ErrorCode_ERROR_STATE && req.GetResumeCheckpointed() != nil {
		return nil, fmt.Errorf("%s: nothing to resume: %s; only a process that `gpucr checkpoint --gpu-only` (without --leave-running) left checkpointed waits for its GPU",
			what, he.Message)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	r := resp.GetCheckpoint()
	if r == nil {
		return nil, fmt.Errorf("%s: the helper answered without a checkpoint reply", what)
	}
	return r, nil
}

// StateName is a helper client state in words: "running", "quiesced",
// "dropped", ...
func StateName(s helperpb.ClientState) string { return stateName(s) }
