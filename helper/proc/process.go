package proc

// A pid names a process only while that process lives: the kernel gives it to
// the next process once the first one is reaped. A root daemon that acts on a
// pid it learned earlier (a socket's peer, a state file) would then act on
// whichever process has it now, another user's included. A Process holds the
// process itself, by a pidfd, and says whether that one still runs.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrGone: the process has exited (its pid may name another one now).
var ErrGone = errors.New("process is gone")

// GoneError names the process that is gone.
type GoneError struct {
	Pid Pid
	Why string // "" or what showed it
}

func (e *GoneError) Error() string {
	if e.Why != "" {
		return fmt.Sprintf("process %d is gone (%s)", e.Pid, e.Why)
	}
	return fmt.Sprintf("process %d is gone", e.Pid)
}

func (e *GoneError) Unwrap() error { return ErrGone }

// Process is one process, held by a pidfd where the kernel has them
// (Linux 5.3 and newer); else by its pid and start time, which tell a reused
// pid apart as long as the process is looked at. Its pid, start time and uid
// are read once, while it was known to be that process.
type Process struct {
	pid   Pid
	start uint64
	uid   uint32
	f     *os.File // the pidfd, non-blocking; nil without one
	how   string   // how it was identified (HeldBy)

	once   sync.Once
	exited chan struct{} // closed once it is seen to have exited (Exited)
	closed chan struct{} // closed by Close
	close  sync.Once
}

// Pid is the process's pid (in this process's pid namespace).
func (p *Process) Pid() Pid { return p.pid }

// Start is its start time in clock ticks after boot (/proc/PID/stat).
func (p *Process) Start() uint64 { return p.start }

// UID is its effective uid when it was identified (for a socket's peer: at
// connect time).
func (p *Process) UID() uint32 { return p.uid }

// HeldBy says how the process was identified and is held: "SO_PEERPIDFD"
// (the very process that connected), "pidfd_open" (a pidfd of the pid) or
// "pid and start time" (a kernel without pidfds).
func (p *Process) HeldBy() string { return p.how }

// HasPidfd says whether the kernel gave a pidfd for it.
func (p *Process) HasPidfd() bool { return p.f != nil }

func (p *Process) String() string { return fmt.Sprintf("pid %d (started at %d)", p.pid, p.start) }

// Running reports whether the process has not exited. A zombie has exited.
func (p *Process) Running() bool {
	if p == nil {
		return false
	}
	if p.f != nil {
		return !pidfdExited(p.f)
	}
	st, err := ReadStat(p.pid)
	return err == nil && st.Alive() && st.Start == p.start
}

// Stopped reports whether the process is alive and stopped (SIGSTOP, or
// left stopped by a tracer: CRIU's --leave-stopped).
func (p *Process) Stopped() bool {
	if !p.Running() {
		return false
	}
	st, err := ReadStat(p.pid)
	return err == nil && st.Start == p.start && (st.State == 'T' || st.State == 't')
}

// Check is nil while the process runs, else a *GoneError.
func (p *Process) Check() error {
	if p == nil {
		return &GoneError{Why: "never identified"}
	}
	if !p.Running() {
		return &GoneError{Pid: p.pid}
	}
	return nil
}

// RunsOn is Running, and the process is not exiting either: no SIGKILL
// pending, not past the start of its exit (see the package's RunsOn).
func (p *Process) RunsOn() bool {
	return p.Running() && RunsOn(p.pid, p.start) && p.Running()
}

// zombie says whether the process has exited but its parent has not reaped
// it yet, so its pid is still taken. Through the pidfd the kernel answers
// for this very process: a signal 0 reaches a zombie and fails with ESRCH
// once it is reaped. By pid, /proc's state must say zombie as well as the
// start time match: a process that took the pid may have started within
// the same clock tick (10 ms) as the one that died.
func (p *Process) zombie() bool {
	if p == nil || p.Running() {
		return false
	}
	if p.f != nil {
		rc, err := p.f.SyscallConn()
		if err != nil {
			return false // closed: nothing is known of it any more
		}
		var serr error
		if cerr := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), 0, nil, 0) }); cerr != nil {
			return false
		}
		return serr != unix.ESRCH
	}
	st, err := ReadStat(p.pid)
	return err == nil && !st.Alive() && st.Start == p.start
}

// pidfdExited: the pidfd polls readable once its process has exited.
func pidfdExited(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return true // closed: nothing is known of it any more
	}
	exited := false
	if cerr := rc.Control(func(fd uintptr) { exited = fdExited(int(fd)) }); cerr != nil {
		return true
	}
	return exited
}

func fdExited(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || (n > 0 && pfd[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0)
	}
}

// pollInterval is how often Exited looks at a process held without a pidfd.
const pollInterval = time.Second

// Exited is closed once the process has exited; it is never closed if Close
// comes first. With a pidfd the wait costs no thread (the runtime's poller
// waits on it); without one the process is looked at every second.
func (p *Process) Exited() <-chan struct{} {
	p.once.Do(func() {
		p.exited = make(chan struct{})
		go p.watch()
	})
	return p.exited
}

func (p *Process) watch() {
	if p.f != nil {
		rc, err := p.f.SyscallConn()
		if err != nil {
			return
		}
		// Read waits in the poller until the pidfd is readable, calling
		// the function each time it may be; the error is the file's close.
		if rc.Read(func(fd uintptr) bool { return fdExited(int(fd)) }) == nil {
			close(p.exited)
		}
		return
	}
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		select {
		case <-p.closed:
			return
		case <-t.C:
			if !p.Running() {
				close(p.exited)
				return
			}
		}
	}
}

// Close lets the process go (its pidfd is closed); Running is false from
// then on.
func (p *Process) Close() error {
	if p == nil {
		return nil
	}
	var err error
	p.close.Do(func() {
		close(p.closed)
		if p.f != nil {
			err = p.f.Close()
		}
	})
	return err
}

// Same reports whether a and b are one process: both run, with the same
// pid, at one moment. (a runs at the first and the last look, so it ran all
// along and had its pid when b was seen running with it; two live processes
// never share a pid.)
func Same(a, b *Process) bool {
	if a == nil || b == nil || a.pid != b.pid || a.start != b.start {
		return false
	}
	return a.Running() && b.Running() && a.Running()
}

// newProcess identifies the process behind pidfd (-1: none) that had pid:
// its start time and, unless the caller knows it (uid not nil: a socket's
// peer, as the kernel recorded it), its uid are read, then the pidfd must
// still show it running, so that what was read is its and not a
// successor's.
func newProcess(pidfd int, pid Pid, uid *uint32) (*Process, error) {
	p := &Process{pid: pid, closed: make(chan struct{}), how: "pid and start time"}
	if pidfd >= 0 {
		p.how = "pidfd_open"
		if err := unix.SetNonblock(pidfd, true); err != nil {
			unix.Close(pidfd)
			return nil, fmt.Errorf("pidfd of %d: %w", pid, err)
		}
		// Non-blocking, so the runtime's poller takes it (Exited).
		p.f = os.NewFile(uintptr(pidfd), fmt.Sprintf("pidfd:%d", pid))
	}
	fail := func(err error) (*Process, error) {
		p.Close()
		if errors.Is(err, os.ErrNotExist) {
			err = &GoneError{Pid: pid}
		}
		return nil, err
	}
	st, err := ReadStat(pid)
	if err == nil && !st.Alive() {
		err = &GoneError{Pid: pid, Why: "a zombie"}
	}
	if err != nil {
		return fail(err)
	}
	p.start = st.Start
	if uid != nil {
		p.uid = *uid
	} else if p.uid, err = EffectiveUID(pid); err != nil {
		return fail(err)
	}
	if p.f != nil && pidfdExited(p.f) {
		return fail(&GoneError{Pid: pid})
	}
	return p, nil
}

// pidfdOpen is pidfd_open(2); -1 and no error where the kernel has none.
func pidfdOpen(pid Pid) (int, error) {
	fd, err := unix.PidfdOpen(int(pid), unix.PIDFD_NONBLOCK)
	switch {
	case err == nil:
		unix.CloseOnExec(fd)
		return fd, nil
	case err == unix.ENOSYS:
		return -1, nil
	case err == unix.ESRCH:
		return -1, &GoneError{Pid: pid}
	}
	return -1, fmt.Errorf("pidfd_open %d: %w", pid, err)
}

// Open holds the process that has pid now.
func Open(pid Pid) (*Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("no process %d", pid)
	}
	fd, err := pidfdOpen(pid)
	if err != nil {
		return nil, err
	}
	return newProcess(fd, pid, nil)
}

// OpenStarted holds the process that has pid now, if it is the one that
// started at start ticks after boot; else a *GoneError.
func OpenStarted(pid Pid, start uint64) (*Process, error) {
	p, err := Open(pid)
	if err != nil {
		return nil, err
	}
	if p.start != start {
		p.Close()
		return nil, &GoneError{Pid: pid, Why: "the pid names another process now"}
	}
	return p, nil
}

// Peer holds the process at the other end of the unix socket rc, which
// connected as cred (its SO_PEERCRED). SO_PEERPIDFD (Linux 6.5 and newer)
// names the very process that connected, whatever happened since; a peer
// that is gone already is a *GoneError. On older kernels the pid is opened
// (pidfd_open) and must still be a process of cred's uid: a process that
// took the pid since (another user's) is refused, but one of the same uid in
// that short window cannot be told apart.
func Peer(rc syscall.RawConn, cred *unix.Ucred) (*Process, error) {
	fd, gerr := -1, error(nil)
	if err := rc.Control(func(s uintptr) {
		fd, gerr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return nil, err
	}
	switch {
	case gerr == nil:
		unix.CloseOnExec(fd)
		// Its uid at connect time, as the kernel recorded it.
		p, err := newProcess(fd, Pid(cred.Pid), &cred.Uid)
		if err != nil {
			return nil, err
		}
		p.how = "SO_PEERPIDFD"
		return p, nil
	case gerr == unix.EINVAL || gerr == unix.ESRCH:
		return nil, &GoneError{Pid: Pid(cred.Pid), Why: "it exited before the helper saw its connection"}
	case gerr != unix.ENOPROTOOPT:
		return nil, fmt.Errorf("SO_PEERPIDFD: %w", gerr)
	}
	p, err := Open(Pid(cred.Pid))
	if err != nil {
		return nil, err
	}
	if p.uid != cred.Uid {
		p.Close()
		return nil, &GoneError{Pid: Pid(cred.Pid), Why: fmt.Sprintf("the pid names a process of uid %d now, not the connecting uid %d", p.uid, cred.Uid)}
	}
	return p, nil
}

// Creds is what a process runs as: its uids and gids (real, effective,
// saved, file system, as /proc/PID/status lists them) and the owner of that
// file, which the kernel makes root while the process is not dumpable (it
// exec'd a set-user-ID or set-group-ID program, or made itself so): its
// memory is then no longer its user's to read. (Not /proc/PID itself: that
// directory shows the effective uid whatever, for procps.)
type Creds struct {
	UIDs, GIDs [4]uint32
	ProcOwner  uint32
}

// RunsOnlyAs says whether the process runs as uid and gid alone, and its
// user may reach its memory (ptrace's rule: every uid and gid the same,
// and dumpable).
func (c Creds) RunsOnlyAs(uid, gid uint32) bool {
	for i := range c.UIDs {
		if c.UIDs[i] != uid || c.GIDs[i] != gid {
			return false
		}
	}
	return c.ProcOwner == uid
}

func (c Creds) String() string {
	return fmt.Sprintf("uids %d/%d/%d/%d, gids %d/%d/%d/%d, /proc/PID/status owned by uid %d", c.UIDs[0], c.UIDs[1], c.UIDs[2], c.UIDs[3],
		c.GIDs[0], c.GIDs[1], c.GIDs[2], c.GIDs[3], c.ProcOwner)
}

// Creds reads what the process runs as now; a *GoneError once it has
// exited (what was read may be its successor's then). One read of
// /proc/PID/status and one stat of it: some 20 us (Status asks it of every
// client).
func (p *Process) Creds() (Creds, error) {
	var c Creds
	if p == nil {
		return c, &GoneError{Why: "never identified"}
	}
	path := fmt.Sprintf("/proc/%d/status", p.pid)
	var buf [4096]byte
	n, err := readSome(path, buf[:])
	if err != nil {
		return c, p.goneOr(err)
	}
	text := buf[:n]
	for _, f := range []struct {
		name string
		ids  *[4]uint32
	}{{"\nUid:", &c.UIDs}, {"\nGid:", &c.GIDs}} {
		i := bytes.Index(text, []byte(f.name))
		if i < 0 {
			return c, p.goneOr(fmt.Errorf("%s: no %s line", path, f.name[1:]))
		}
		line := text[i+len(f.name):]
		if e := bytes.IndexByte(line, '\n'); e >= 0 {
			line = line[:e]
		}
		words := bytes.Fields(line)
		if len(words) != 4 {
			return c, p.goneOr(fmt.Errorf("%s: %s %q", path, f.name[1:], line))
		}
		for k, w := range words {
			v, err := strconv.ParseUint(string(w), 10, 32)
			if err != nil {
				return c, p.goneOr(fmt.Errorf("%s: %s %q", path, f.name[1:], line))
			}
			f.ids[k] = uint32(v)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return c, p.goneOr(err)
	}
	c.ProcOwner = st.Uid
	// Still this process: what was read is its, not a successor's.
	if err := p.Check(); err != nil {
		return c, err
	}
	return c, nil
}

// readSome reads up to len(buf) bytes of path (a /proc file, read whole
// in one go if it fits).
func readSome(path string, buf []byte) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}

// goneOr is a *GoneError if the process has exited, else err.
func (p *Process) goneOr(err error) error {
	if gerr := p.Check(); gerr != nil {
		return gerr
	}
	return err
}
