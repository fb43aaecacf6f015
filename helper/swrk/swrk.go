// Package swrk runs one request of CRIU's RPC on a `criu swrk` it starts
// itself, under a deadline.
//
// go-criu (whose message types this package uses) starts `criu swrk FD` with
// this process's whole environment and a fixed command line. CRIU then reads
// its default configuration files, the user's ~/.criu/default.conf of
// whatever HOME it inherits included, and runs what they name (an
// action-script) as root. Here the command line is
// `criu --no-default-config swrk 3`, the environment is exactly the one
// given, and the caller's descriptors are passed as 4, 5, ...: CRIU reads no
// configuration but the file the request names.
package swrk

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/proc"
)

// Cmd is one CRIU to run a request on.
type Cmd struct {
	CRIU string   // the criu binary (or a launcher that execs it)
	Env  []string // its whole environment: nothing of this process's is inherited
	// Files are inherited by criu swrk as descriptors 4, 5, ... (3 is the
	// RPC socket).
	Files []*os.File
	// Deadline bounds the request; then criu is killed (SIGKILL).
	Deadline time.Duration
	// KillNew: at the deadline, children of this process that appeared
	// while CRIU ran are killed too (a restore with RstSibling makes the
	// restored tree's root one: half-restored, it must not stay).
	KillNew bool
	// Cancel (nil: never) ends the request as the deadline does, when it
	// is closed (the user interrupted the command).
	Cancel <-chan struct{}
	// Stderr (nil: discarded) gets what CRIU prints on its stderr: where it
	// says what it cannot parse in its configuration file, before it has
	// opened its log.
	Stderr *os.File
}

// Outcome is how one request ended.
type Outcome struct {
	Err       error // nil: CRIU answered success
	TimedOut  bool  // the deadline passed and CRIU was killed
	Cancelled bool  // Cancel was closed and CRIU was killed
	Pid       int   // criu swrk's pid (0: it did not start)
	Killed    []int // after a timeout: processes killed besides criu (a restore's half-made tree)
	Reaped    []int // with KillNew, after a failure: the new children (a failed restore's tree) reaped
	Hung      bool  // after the kill, the RPC still did not end (a child of CRIU holds its socket)
}

// ReturnGrace is how long the RPC gets to end once CRIU was killed (its
// read ends when the socket closes, unless a child of CRIU holds it open;
// then this side closes it).
const ReturnGrace = 5 * time.Second

// Dump runs a dump request; nfy (nil: none) hears CRIU's notifications.
func (c Cmd) Dump(opts *rpc.CriuOpts, nfy criu.Notify) Outcome {
	return c.run(rpc.CriuReqType_DUMP, opts, nfy)
}

// Restore runs a restore request.
func (c Cmd) Restore(opts *rpc.CriuOpts, nfy criu.Notify) Outcome {
	return c.run(rpc.CriuReqType_RESTORE, opts, nfy)
}

func (c Cmd) run(typ rpc.CriuReqType, opts *rpc.CriuOpts, nfy criu.Notify) (o Outcome) {
	if nfy != nil {
		opts.NotifyScripts = proto.Bool(true)
	}
	first, err := proto.Marshal(&rpc.CriuReq{Type: typ.Enum(), Opts: opts})
	if err != nil {
		o.Err = fmt.Errorf("CRIU request: %w", err)
		return o
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		o.Err = fmt.Errorf("CRIU's RPC socket: %w", err)
		return o
	}
	// Ours non-blocking, so that its reads wait in the runtime's poller
	// and end when it is closed.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		o.Err = fmt.Errorf("CRIU's RPC socket: %w", err)
		return o
	}
	sk := os.NewFile(uintptr(fds[0]), "criu-rpc")
	defer sk.Close()
	theirs := os.NewFile(uintptr(fds[1]), "criu-rpc-swrk")
	// exec.Cmd passes ExtraFiles without close-on-exec, as 3, 4, ...
	cmd := &exec.Cmd{Path: c.CRIU, Args: []string{c.CRIU, "--no-default-config", "swrk", "3"}, Env: c.Env,
		ExtraFiles: append([]*os.File{theirs}, c.Files...),
		// its own process group: a terminal's Ctrl-C reaches this process,
		// which ends CRIU itself (Cancel), not CRIU in the middle of a dump
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
	if c.Stderr != nil {
		cmd.Stderr = c.Stderr
	}
	// A restore's half-made tree, killed at the deadline, is what appears
	// among this process's children while CRIU runs.
	self := proc.Pid(os.Getpid())
	var before []proc.Pid
	if c.KillNew {
		before, _ = proc.Children(self)
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		o.Err = fmt.Errorf("start %s swrk: %w", c.CRIU, err)
		return o
	}
	o.Pid = cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- converse(sk, typ, first, nfy) }()
	exited := make(chan error, 1)
	// finish reaps criu swrk, which exits once its socket is closed; one
	// that does not within ReturnGrace is killed first.
	finish := func() {
		sk.Close()
		go func() { exited <- cmd.Wait() }()
		var err error
		select {
		case err = <-exited:
		case <-time.After(ReturnGrace):
			_ = cmd.Process.Kill() // not reaped yet: still criu's pid
			err = <-exited
		}
		if err != nil && !o.TimedOut && !o.Cancelled && o.Err == nil {
			o.Err = fmt.Errorf("criu swrk: %w", err)
		}
	}
	timer := time.NewTimer(c.Deadline)
	defer timer.Stop()
	cancelled := false
	select {
	case o.Err = <-done:
		finish()
		if c.KillNew && o.Err != nil {
			// A failed restore: CRIU killed the tree it made, whose root
			// is this process's child (RstSibling). Reaped here, its pids
			// are free when the caller hears of the failure (not once the
			// init process gets round to the zombies after this process
			// has gone).
			o.Reaped = endNew(self, before, o.Pid)
		}
		return o
	case <-timer.C:
	case <-c.Cancel:
		cancelled = true
	}
	select { // finished at the same moment: not a timeout
	case o.Err = <-done:
		finish()
		return o
	default:
	}
	o.TimedOut, o.Cancelled = !cancelled, cancelled
	// Not reaped before this kill (Wait comes after it), so the pid is
	// still criu's.
	_ = cmd.Process.Kill()
	if c.KillNew {
		now, _ := proc.Children(self)
		for _, p := range now {
			if int(p) != o.Pid && !slices.Contains(before, p) && syscall.Kill(int(p), syscall.SIGKILL) == nil {
				o.Killed = append(o.Killed, int(p))
			}
		}
	}
	select {
	case o.Err = <-done:
	case <-time.After(ReturnGrace):
		// A child of CRIU holds its end: give up on the RPC.
		o.Hung = true
		sk.Close()
		<-done
		o.Err = errors.New("CRIU's RPC did not end after CRIU was killed")
	}
	finish()
	if c.KillNew {
		o.Reaped = endNew(self, before, o.Pid)
	}
	return o
}

// reapWait bounds how long endNew waits for killed children to become
// zombies it can reap (a task in the driver may take a moment to die).
const reapWait = 5 * time.Second

// endNew kills the children of self that are not in before (nor criu) and
// reaps them; it returns the pids reaped.
func endNew(self proc.Pid, before []proc.Pid, criuPid int) []int {
	now, _ := proc.Children(self)
	var mine []int
	for _, p := range now {
		if int(p) != criuPid && !slices.Contains(before, p) {
			_ = syscall.Kill(int(p), syscall.SIGKILL) // a zombie already: nothing happens
			mine = append(mine, int(p))
		}
	}
	var reaped []int
	deadline := time.Now().Add(reapWait)
	for len(mine) > 0 {
		left := mine[:0]
		for _, p := range mine {
			var ws unix.WaitStatus
			got, err := unix.Wait4(p, &ws, unix.WNOHANG, nil)
			switch {
			case got == p:
				reaped = append(reaped, p)
			case err != nil: // not our child (any more)
			default:
				left = append(left, p)
			}
		}
		mine = left
		if len(mine) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return reaped
}

// errNoAnswer: CRIU went (exited, was killed) before it answered.
var errNoAnswer = errors.New("CRIU closed the connection without an answer (it exited or was killed)")

// maxResponse bounds one CRIU response (they are small: a few hundred
// bytes); a longer one is an error, not silently cut.
const maxResponse = 64 << 10

// converse sends the request (first, marshaled) and answers CRIU's
// notifications until its final response.
func converse(sk *os.File, typ rpc.CriuReqType, first []byte, nfy criu.Notify) error {
	notified, err := proto.Marshal(&rpc.CriuReq{Type: rpc.CriuReqType_NOTIFY.Enum(), NotifySuccess: proto.Bool(true)})
	if err != nil {
		return err
	}
	b := first
	buf := make([]byte, maxResponse)
	for {
		if _, err := sk.Write(b); err != nil {
			if errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET) {
				return fmt.Errorf("CRIU's RPC: %w", errNoAnswer)
			}
			return fmt.Errorf("CRIU's RPC: send: %w", err)
		}
		n, err := recvOne(sk, buf)
		if err != nil {
			return fmt.Errorf("CRIU's RPC: %w", err)
		}
		resp := &rpc.CriuResp{}
		if err := proto.Unmarshal(buf[:n], resp); err != nil {
			return fmt.Errorf("CRIU's RPC: a response that does not parse: %w", err)
		}
		if !resp.GetSuccess() {
			return fmt.Errorf("criu %s failed (%s, errno %d)", typ, resp.GetCrErrmsg(), resp.GetCrErrno())
		}
		if resp.GetType() != rpc.CriuReqType_NOTIFY {
			if resp.GetType() != typ {
				return fmt.Errorf("CRIU's RPC: answer %s to a %s request", resp.GetType(), typ)
			}
			return nil
		}
		if nfy == nil {
			return errors.New("CRIU's RPC: a notification nobody asked for")
		}
		if err := notify(nfy, resp.GetNotify()); err != nil {
			return err
		}
		b = notified
	}
}

// recvOne reads one message of the SEQPACKET socket; end of file (CRIU gone)
// and a message cut short are errors.
func recvOne(sk *os.File, buf []byte) (int, error) {
	rc, err := sk.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n, flags int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, flags, _, rerr = unix.Recvmsg(int(fd), buf, nil, 0)
		return rerr != unix.EAGAIN && rerr != unix.EINTR
	}); err != nil {
		return 0, err
	}
	switch {
	case rerr != nil && rerr != unix.ECONNRESET:
		return 0, fmt.Errorf("receive: %w", rerr)
	case n == 0 || rerr == unix.ECONNRESET: // reset: it exited without reading our request
		return 0, errNoAnswer
	case flags&unix.MSG_TRUNC != 0:
		return 0, fmt.Errorf("a response longer than %d bytes", len(buf))
	}
	return n, nil
}

// notify hands a notification to nfy.
func notify(nfy criu.Notify, n *rpc.CriuNotify) error {
	switch n.GetScript() {
	case "pre-dump":
		return nfy.PreDump()
	case "post-dump":
		return nfy.PostDump()
	case "pre-restore":
		return nfy.PreRestore()
	case "post-restore":
		return nfy.PostRestore(n.GetPid())
	case "network-lock":
		return nfy.NetworkLock()
	case "network-unlock":
		return nfy.NetworkUnlock()
	case "setup-namespaces":
		return nfy.SetupNamespaces(n.GetPid())
	case "post-setup-namespaces":
		return nfy.PostSetupNamespaces()
	case "post-resume":
		return nfy.PostResume()
	case "query-ext-files":
		// CRIU asks this in swrk mode only, once it has seized the whole
		// tree and before it dumps a file or a socket of it (cr-dump.c,
		// after collect_pstree): the one moment a dump can be held with
		// the tree frozen and nothing of it read yet. go-criu's Notify has
		// no method for it; a Notify that wants it implements Frozen.
		if f, ok := nfy.(Frozen); ok {
			return f.Frozen()
		}
	}
	return nil
}

// Frozen is a Notify that hears CRIU's query-ext-files notice of a dump:
// the tree is frozen, none of its files or sockets dumped yet. An error
// fails the dump, which then resumes the tree.
type Frozen interface {
	Frozen() error
}
