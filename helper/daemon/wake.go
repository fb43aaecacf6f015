package daemon

// Wake files: a process that waits for its GPU memory without a connection
// to the helper (detached for a dump, restored by CRIU, dropped by a helper
// that died) polls for the file named after the pid it detached as, in the
// wake directory next to the helper's socket; the helper creates it when
// the process is to come back (or, "lost: why", to give up), and removes it
// once the process has.
//
// The helper runs as root. It listens only in a socket directory of its
// own that no one else can write (ownSocketDir); the wake directory is
// guarded all the same: opened once, without following a link, it must be
// the helper's own and writable by no one else, and every file in it is
// made and removed through that descriptor, so that nothing planted under
// the socket's directory turns the helper's writes elsewhere.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
)

// wakeDirName is the wake directory's name beside the socket.
const wakeDirName = "wake"

// wakeFiles is the wake directory of a helper whose socket is in sockDir.
type wakeFiles struct {
	sockDir string
	mu      sync.Mutex
	dir     *os.File // opened on first use
}

// path is the file whose existence tells a detached client of pid to
// reconnect: next to the socket, so a container that can reach the socket
// can reach it too.
func (w *wakeFiles) path(pid proc.Pid) string { return filepath.Join(w.sockDir, w.name(pid)) }

// name is path relative to the socket's directory (what Detach sends).
func (w *wakeFiles) name(pid proc.Pid) string {
	return filepath.Join(wakeDirName, strconv.Itoa(int(pid)))
}

// open returns the wake directory, made (0755) and checked on first use:
// no link, a directory, the helper's own, writable by it alone.
func (w *wakeFiles) open() (*os.File, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dir != nil {
		return w.dir, nil
	}
	parent, err := unix.Open(w.sockDir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket directory %s: %w", w.sockDir, err)
	}
	defer unix.Close(parent)
	where := filepath.Join(w.sockDir, wakeDirName)
	made := true
	if err := unix.Mkdirat(parent, wakeDirName, 0o755); err == unix.EEXIST {
		made = false
	} else if err != nil {
		return nil, fmt.Errorf("wake directory %s: %w", where, err)
	}
	fd, err := unix.Openat(parent, wakeDirName, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("wake directory %s: %w (a link, or no directory, is not followed)", where, err)
	}
	if made {
		// every client, whatever its user, looks for its file there,
		// whatever the helper's umask
		_ = unix.Fchmod(fd, 0o755)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("wake directory %s: %w", where, err)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("wake directory %s belongs to uid %d with mode %04o: the helper writes only in a directory of its own (uid %d) that no one else can write; remove it",
			where, st.Uid, st.Mode&0o7777, os.Geteuid())
	}
	w.dir = os.NewFile(uintptr(fd), where)
	return w.dir, nil
}

// create makes pid's wake file with content msg: empty means "come back",
// "lost: why" that its GPU state is gone (adopt.go). Written under another
// name and renamed: the client reads it as soon as it exists.
func (w *wakeFiles) create(pid proc.Pid, msg string) error {
	d, err := w.open()
	if err != nil {
		return err
	}
	name := strconv.Itoa(int(pid))
	tmp := "." + name + ".tmp"
	dfd := int(d.Fd())
	_ = unix.Unlinkat(dfd, tmp, 0) // a leftover of a helper that died here
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("wake file %s: %w", w.path(pid), err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.WriteString(msg)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, name)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("wake file %s: %w", w.path(pid), werr)
	}
	return nil
}

// remove removes pid's wake file, if there is one.
func (w *wakeFiles) remove(pid proc.Pid) {
	d, err := w.open()
	if err != nil {
		return // nothing was made there
	}
	_ = unix.Unlinkat(int(d.Fd()), strconv.Itoa(int(pid)), 0)
}

// close lets the directory go (the helper stops).
func (w *wakeFiles) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dir != nil {
		_ = w.dir.Close()
		w.dir = nil
	}
}

func (s *Server) wake(pid proc.Pid) error { return s.wakes.create(pid, "") }

// removeWakeLocked removes the wake file named after pid unless a client
// other than the one now waiting as self still waits for it (two restores
// of one image wait for the same file). Called with s.mu held.
func (s *Server) removeWakeLocked(pid, self proc.Pid) {
	for p, w := range s.reg.waiting {
		if p == self {
			continue
		}
		w.mu.Lock()
		shared := w.waitsForWakeLocked(p, pid)
		w.mu.Unlock()
		if shared {
			return
		}
	}
	s.wakes.remove(pid)
}
