package daemon

// Wake files: a process that waits for its GPU memory without a connection
// to the helper (detached for a dump, restored by CRIU, dropped by a helper
// that died) polls for the file named after the pid it detached as, in the
// wake directory next to the helper's socket (an ownDir: the helper's own,
// written through its descriptor); the helper creates it when the process
// is to come back (or, "lost: why", to give up), and removes it once the
// process has.

import (
	"path/filepath"

	"github.com/gpucr/gpucr/helper/proc"
)

// wakeDirName is the wake directory's name beside the socket.
const wakeDirName = "wake"

// wakeFiles is the wake directory of a helper whose socket is in sockDir.
type wakeFiles struct{ d ownDir }

// newWakeFiles: every client, whatever its user, looks for its file there
// (0755).
func newWakeFiles(sockDir string) *wakeFiles {
	return &wakeFiles{d: ownDir{sockDir: sockDir, name: wakeDirName, mode: 0o755}}
}

// path is the file whose existence tells a detached client of pid to
// reconnect: next to the socket, so a container that can reach the socket
// can reach it too.
func (w *wakeFiles) path(pid proc.Pid) string { return filepath.Join(w.d.sockDir, w.name(pid)) }

// name is path relative to the socket's directory (what Detach sends).
func (w *wakeFiles) name(pid proc.Pid) string {
	return filepath.Join(wakeDirName, pid.String())
}

// create makes pid's wake file with content msg: empty means "come back",
// "lost: why" that its GPU state is gone (adopt.go). The client reads it as
// soon as it exists, whole.
func (w *wakeFiles) create(pid proc.Pid, msg string) error {
	return w.d.write(pid.String(), []byte(msg), 0o644)
}

// remove removes pid's wake file, if there is one.
func (w *wakeFiles) remove(pid proc.Pid) { w.d.remove(pid.String()) }

// close lets the directory go (the helper stops).
func (w *wakeFiles) close() { w.d.close() }
