package daemon

// Wake files: a process that waits for its GPU memory without a connection
// to the helper (detached for a dump, restored by CRIU, dropped by a helper
// that died) polls for the file named after the pid it detached as, next to
// the helper's socket; the helper creates it when the process is to come
// back (or, "lost: why", to give up), and removes it once the process has.

import (
	"os"
	"path/filepath"
	"strconv"

	"github.com/gpucr/gpucr/helper/proc"
)

// wakePath is the file whose existence tells a detached client of pid to
// reconnect: next to the socket, so a container that can reach the socket can
// reach it too.
func (s *Server) wakePath(pid proc.Pid) string {
	return filepath.Join(filepath.Dir(s.cfg.Socket), s.wakeName(pid))
}

// wakeName is wakePath relative to the socket's directory (what Detach sends).
func (s *Server) wakeName(pid proc.Pid) string {
	return filepath.Join("wake", strconv.Itoa(int(pid)))
}

func (s *Server) wake(pid proc.Pid) error { return s.wakeWith(pid, "") }

// wakeWith creates pid's wake file with content msg: empty means "come
// back", "lost: why" that its GPU state is gone (adopt.go). Written under
// another name and renamed: the client reads it as soon as it exists.
func (s *Server) wakeWith(pid proc.Pid, msg string) error {
	p := s.wakePath(pid)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(p), "."+filepath.Base(p)+".tmp")
	if err := os.WriteFile(tmp, []byte(msg), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

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
	_ = os.Remove(s.wakePath(pid))
}
