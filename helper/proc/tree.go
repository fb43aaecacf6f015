package proc

// A process tree that is signalled later (a migration's source: SIGKILL
// once the target runs, SIGCONT if it fails) is held process by process:
// a signal by pid number would go to whatever process took the pid of one
// that died meanwhile, another user's included.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Signal sends sig to the process itself: with a pidfd, pidfd_send_signal,
// which never reaches another process that took the pid. A process that
// has exited is a *GoneError. Without a pidfd (a kernel before 5.3) the
// pid is signalled after its start time is checked: a pid reused in
// between cannot be told apart there.
func (p *Process) Signal(sig syscall.Signal) error {
	if p == nil {
		return &GoneError{Why: "never identified"}
	}
	if p.f == nil {
		if !p.Running() {
			return &GoneError{Pid: p.pid}
		}
		if err := syscall.Kill(int(p.pid), sig); err != nil {
			if err == syscall.ESRCH {
				return &GoneError{Pid: p.pid}
			}
			return fmt.Errorf("signal %v to pid %d: %w", sig, p.pid, err)
		}
		return nil
	}
	rc, err := p.f.SyscallConn()
	if err != nil {
		return &GoneError{Pid: p.pid, Why: "no longer held"}
	}
	var serr error
	if cerr := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); cerr != nil {
		return &GoneError{Pid: p.pid, Why: "no longer held"}
	}
	switch {
	case serr == nil:
		return nil
	case errors.Is(serr, unix.ESRCH):
		return &GoneError{Pid: p.pid}
	}
	return fmt.Errorf("signal %v to pid %d (pidfd): %w", sig, p.pid, serr)
}

// HoldTree holds the process that has pid root now and its descendants
// (children recursively), each by a pidfd (Process), as Tree lists them.
// A child counts only if it was the child of a held process while both
// were seen running: a pid that a dead child left to another process in
// between is not taken.
func HoldTree(root Pid) ([]*Process, error) {
	p, err := Open(root)
	if err != nil {
		return nil, err
	}
	return AddDescendants([]*Process{p}), nil
}

// AddDescendants returns held with the descendants of its processes that
// it lacks added, held as HoldTree holds them. A process of held that has
// exited adds nothing: its children are someone else's now.
func AddDescendants(held []*Process) []*Process {
	out := slices.Clone(held)
	for i := 0; i < len(out); i++ {
		out = append(out, newChildren(out[i], out)...)
	}
	return out
}

// newChildren holds p's children that are not in held.
func newChildren(p *Process, held []*Process) []*Process {
	pids, err := Children(p.pid)
	if err != nil || !p.Running() {
		return nil
	}
	var out []*Process
	for _, k := range pids {
		if slices.ContainsFunc(held, func(h *Process) bool { return h.pid == k && h.Running() }) {
			continue
		}
		c, err := Open(k)
		if err != nil {
			continue // exited meanwhile
		}
		// c is the process that has pid k (its pidfd); its parent, read
		// while c and p both still run, must be p.
		st, err := ReadStat(k)
		if err != nil || st.Start != c.start || st.PPid != p.pid || !c.Running() || !p.Running() {
			c.Close()
			continue
		}
		out = append(out, c)
	}
	return out
}

// Pids lists the pids of procs.
func Pids(procs []*Process) []Pid {
	out := make([]Pid, len(procs))
	for i, p := range procs {
		out[i] = p.pid
	}
	return out
}

// CloseAll lets every process of procs go.
func CloseAll(procs []*Process) {
	for _, p := range procs {
		p.Close()
	}
}

// WaitGone waits until every process of procs has exited and its pid no
// longer shows it (reaped: not even a zombie of it is left), or ctx ends;
// it returns those that are still there then. A process that took the pid
// since is not waited for.
func WaitGone(ctx context.Context, procs []*Process) []*Process {
	t := time.NewTicker(releasePoll)
	defer t.Stop()
	for {
		var left []*Process
		for _, p := range procs {
			if p.Running() {
				left = append(left, p)
				continue
			}
			if p.zombie() {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return left
		case <-t.C:
		}
	}
}

// Fd is a copy of descriptor fd of the process (pidfd_getfd), which the
// caller closes: through its pidfd, so never a descriptor of another
// process that took the pid. Without a pidfd it is refused.
func (p *Process) Fd(fd int) (int, error) {
	if p == nil || p.f == nil {
		return -1, errors.New("no pidfd to take a descriptor through")
	}
	rc, err := p.f.SyscallConn()
	if err != nil {
		return -1, &GoneError{Pid: p.pid, Why: "no longer held"}
	}
	out, gerr := -1, error(nil)
	if cerr := rc.Control(func(pfd uintptr) { out, gerr = unix.PidfdGetfd(int(pfd), fd, 0) }); cerr != nil {
		return -1, &GoneError{Pid: p.pid, Why: "no longer held"}
	}
	if gerr != nil {
		return -1, fmt.Errorf("pidfd_getfd of pid %d's fd %d: %w", p.pid, fd, gerr)
	}
	return out, nil
}
