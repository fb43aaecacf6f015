package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// Checks made before CRIU starts, so that a wrong pid or directory is named
// plainly instead of surfacing as one of CRIU's log lines.

// checkpointDir makes sure the image directory of a checkpoint exists (made
// 0700 if missing, and recorded in made), is a directory, and takes a new
// file: a probe file is created and removed, which finds a read-only or
// full file system and missing permissions alike.
func checkpointDir(dir string, made *madeDirs) error {
	if err := made.mkdirAll(dir); err != nil {
		return fmt.Errorf("image directory %s: %w", dir, err)
	}
	if err := isDir(dir); err != nil {
		return err
	}
	if err := probeWritable(dir); err != nil {
		return fmt.Errorf("image directory %s cannot take CRIU's images: %w", dir, err)
	}
	if free, err := freeBytes(dir); err == nil && free == 0 {
		return fmt.Errorf("image directory %s: its file system is full", dir)
	}
	return nil
}

// restoreDir checks the image directory of a restore: it exists, is a
// directory, holds CRIU's images (inventory.img, a regular file of the
// caller's: CRIU restores only images of the user who restores), and takes
// CRIU's log.
func restoreDir(dir string) error {
	if err := isDir(dir); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("image directory %s: %w", dir, err)
	}
	defer d.Close()
	if uid := uint32(os.Geteuid()); !regularOf(int(d.Fd()), "inventory.img", uid) {
		return inventoryProblem(d, dir, uid)
	}
	if err := probeWritable(dir); err != nil {
		return fmt.Errorf("image directory %s does not take CRIU's restore.log: %w", dir, err)
	}
	return nil
}

func isDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("image directory %s does not exist", dir)
	case err != nil:
		return fmt.Errorf("image directory %s: %w", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("image directory %s is not a directory", dir)
	}
	return nil
}

// probeWritable creates and removes a file in dir.
func probeWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".gpucr-probe-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return pe.Err
		}
		return err
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}

// freeBytes is what an unprivileged writer may still write on dir's file system.
func freeBytes(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// treeClients is what the helper said, before CRIU runs, about the process
// tree CRIU is to dump.
type treeClients struct {
	Tree      []proc.Pid // pid and its descendants
	Clients   []proc.Pid // those that are the helper's clients (GPU processes)
	Bytes     uint64     // their GPU memory
	HelperErr error      // no helper answered: Clients is unknown (empty)
}

// gpuClientsOf asks the helper at socket which processes of pid's tree are
// its clients.
func gpuClientsOf(socket string, pid proc.Pid) treeClients {
	tc := treeClients{Tree: proc.Tree(pid)}
	st, err := helperStatus(socket, tc.Tree)
	if err == nil && st.ClientsLeftOut > 0 {
		err = fmt.Errorf("the helper left %d of the tree's clients out of its answer (too many to list)", st.ClientsLeftOut)
	}
	if err != nil {
		tc.HelperErr = err
		return tc
	}
	for _, cl := range st.Clients {
		if p := proc.Pid(cl.Pid); slices.Contains(tc.Tree, p) && !slices.Contains(tc.Clients, p) {
			tc.Clients = append(tc.Clients, p)
			tc.Bytes += cl.Bytes
		}
	}
	slices.Sort(tc.Clients)
	return tc
}

// helperStatus is the helper's Status reply with the clients of pids
// alone: however many other clients the helper serves, the reply holds
// these.
func helperStatus(socket string, pids []proc.Pid) (*helperpb.StatusReply, error) {
	ps := make([]int64, len(pids))
	for i, p := range pids {
		ps[i] = int64(p)
	}
	return client.StatusOfPidsAt(socket, client.StatusTimeout, ps)
}

// imagePids lists the pids and thread ids a restore of dir gives back (CRIU's
// pstree.img): CRIU needs each of them free.
func imagePids(dir string) ([]proc.Pid, error) {
	f, err := os.OpenFile(filepath.Join(dir, "pstree.img"), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: the process tree: %w", dir, err)
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, true).Decode(&pstree.PstreeEntry{})
	if err != nil {
		return nil, fmt.Errorf("image directory %s: pstree.img: %w", dir, err)
	}
	var out []proc.Pid
	for _, e := range img.Entries {
		p, ok := e.Message.(*pstree.PstreeEntry)
		if !ok {
			continue
		}
		for _, id := range append([]uint32{p.GetPid()}, p.GetThreads()...) {
			if id != 0 && !slices.Contains(out, proc.Pid(id)) {
				out = append(out, proc.Pid(id))
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("image directory %s: pstree.img names no process", dir)
	}
	return out, nil
}

// pidsFreeWait is how long a restore waits for its pids to be released
// (a zombie being reaped) before it refuses.
const pidsFreeWait = 2 * time.Second

// restorePidsFree refuses a restore whose pids are taken, before CRIU starts
// and before any GPU memory is loaded: CRIU would fail on them only after
// that ("Can't fork for PID: File exists").
// It returns the image's pids (thread ids among them).
func restorePidsFree(ctx context.Context, dir string) ([]proc.Pid, error) {
	pids, err := imagePids(dir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, pidsFreeWait)
	defer cancel()
	held := proc.WaitReleased(ctx, pids)
	if len(held) == 0 {
		return pids, nil
	}
	text, running := holdersText(held)
	msg := fmt.Sprintf("restore from %s refused: CRIU gives every process and thread of the image its id back (%v), and these processes hold them: %s",
		dir, pids, text)
	if running {
		msg += "; if the image was made with --leave-running, stop that process first"
	}
	return nil, errors.New(msg)
}

// sessionLeaderCheck refuses, before anything is paused or copied, a dump
// CRIU would refuse only after the plugin had copied all GPU memory: without
// --shell-job, the root of the tree must lead its own session ("The root
// process N is not a session leader"); with it or without, no process of the
// tree may belong to a session whose leader is outside its pid namespace
// (getsid gives CRIU 0 there: "A session leader of N is outside of its pid
// namespace"), as a program started without setsid inside a container is.
// tree is pid's (proc.Tree).
func sessionLeaderCheck(pid proc.Pid, tree []proc.Pid, shellJob bool) error {
	st, err := proc.ReadStat(pid)
	if err != nil {
		return fmt.Errorf("no process %d", pid)
	}
	for _, p := range tree {
		if sid, ok := proc.NsSession(p); ok && sid == 0 {
			which := "it"
			if p != pid {
				which = fmt.Sprintf("its descendant %d", p)
				if c := proc.Comm(p); c != "" {
					which += " (" + c + ")"
				}
			}
			return fmt.Errorf("checkpoint of %d refused: %s belongs to a session whose leader is outside its pid namespace "+
				"(as a program started without setsid inside a container does), which CRIU cannot dump, with --shell-job or without; "+
				"start the program with setsid, so that it leads a session of its own", pid, which)
		}
	}
	if shellJob || st.Session == pid {
		return nil
	}
	leader := fmt.Sprintf("%d", st.Session)
	if c := proc.Comm(st.Session); c != "" {
		leader += " (" + c + ")"
	}
	return fmt.Errorf("checkpoint of %d refused: it is not the leader of its own session (its session is %s's), "+
		"which CRIU requires; start it with setsid and stdin from /dev/null, or checkpoint and restore it with --shell-job", pid, leader)
}

// holdersText names the processes that hold pids (proc.Holders) and who
// would reap each zombie among them; running says whether one is alive.
func holdersText(held []proc.Holder) (text string, running bool) {
	var parts []string
	for _, h := range held {
		what := fmt.Sprintf("%d", h.Pid)
		if c := proc.Comm(h.Pid); c != "" {
			what += " " + c
		}
		if h.State == 'Z' {
			what += fmt.Sprintf(" (a zombie its parent %d has not reaped)", h.PPid)
		} else {
			running = true
			what += fmt.Sprintf(" (running, parent %d)", h.PPid)
		}
		if len(h.Threads) > 0 {
			what += fmt.Sprintf(" with its threads %v", h.Threads)
		}
		parts = append(parts, what)
	}
	return strings.Join(parts, ", "), running
}

// lockImageDir takes the lock of a restore's image directory
// (image.LockImage), held while the returned descriptor stays open: the
// restore closes it when it ends, and a crash releases it. It is taken
// without waiting: a second restore of one image could only fail on the
// pids the first takes back, so it says so at once.
func lockImageDir(dir string) (*os.File, error) {
	if err := isDir(dir); err != nil {
		return nil, err
	}
	// O_CLOEXEC: CRIU and what it restores do not inherit the lock.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	if err := image.LockImage(d, dir); err != nil {
		d.Close()
		return nil, fmt.Errorf("restore refused: %w", err)
	}
	return d, nil
}
