package checkpoint

// Lazy restore of host memory (gpucr restore --lazy-pages): CRIU's
// lazy-pages daemon serves the restored tasks' anonymous memory from the
// image through userfaultfd, so the tree runs before its memory is read back.
// A page the tree touches is served when it faults; the daemon pushes the
// rest in the background and exits once every page is in. Measured on an
// H200 (tests/gpu/cold-start.sh): CRIU spent 0.5-0.6 s of a 0.8-1.1 s
// restore of an inference server reading back its 1 GB of host memory.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// lazySocket is where CRIU's lazy-pages daemon listens: its work directory,
// which the restore shares (CRIU's own name).
const lazySocket = "lazy-pages.socket"

// lazyStartWait bounds how long the daemon gets to listen.
const lazyStartWait = 10 * time.Second

// lazyDoneWait bounds how long a restore waits, once its tree runs, for
// the daemon to have put every page in (it reads them from the image
// directory, which must stay until then).
const lazyDoneWait = 10 * time.Minute

// lazyPages is a running lazy-pages daemon.
type lazyPages struct {
	cmd  *exec.Cmd
	done chan error // its exit
	log  string     // its log, in the session directory
}

// startLazyPages starts CRIU's lazy-pages daemon on the staged images and
// the session's work directory (open here: the daemon reaches them through
// this process's descriptors, as CRIU's RPC does) and returns once it
// listens.
func startLazyPages(criu string, sess *criuSession, env []string, images, work *os.File) (*lazyPages, error) {
	self := os.Getpid()
	fdPath := func(f *os.File) string { return fmt.Sprintf("/proc/%d/fd/%d", self, f.Fd()) }
	args := []string{criu, "--no-default-config", "lazy-pages", "--images-dir", fdPath(images), "--work-dir", fdPath(work),
		"-o", "lazy-pages.log", "-v4"}
	lp := &lazyPages{cmd: &exec.Cmd{Path: criu, Args: args, Env: env,
		// its own process group, as criu swrk: the terminal's Ctrl-C is ours
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true}},
		done: make(chan error, 1), log: filepath.Join(sess.dir, "lazy-pages.log")}
	if err := lp.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start CRIU's lazy-pages daemon: %w", err)
	}
	go func() { lp.done <- lp.cmd.Wait() }()
	sock := filepath.Join(sess.dir, lazySocket)
	deadline := time.Now().Add(lazyStartWait)
	for {
		if _, err := os.Lstat(sock); err == nil {
			return lp, nil
		}
		select {
		case err := <-lp.done:
			lp.done <- err
			return nil, fmt.Errorf("CRIU's lazy-pages daemon exited before it listened (%v): %s", err, lp.tail())
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			lp.stop()
			return nil, fmt.Errorf("CRIU's lazy-pages daemon did not listen within %v: %s", lazyStartWait, lp.tail())
		}
	}
}

// wait waits, at most d, for the daemon to have served every page and
// exited: nil, or why not (then it is killed).
func (lp *lazyPages) wait(d time.Duration) error {
	select {
	case err := <-lp.done:
		lp.done <- err
		if err != nil {
			return fmt.Errorf("CRIU's lazy-pages daemon: %w: %s", err, lp.tail())
		}
		return nil
	case <-time.After(d):
		lp.stop()
		return fmt.Errorf("CRIU's lazy-pages daemon had not put every page in after %v; killed it", d)
	}
}

// stop kills the daemon if it still runs, and reaps it.
func (lp *lazyPages) stop() {
	select {
	case err := <-lp.done:
		lp.done <- err
		return
	default:
	}
	_ = lp.cmd.Process.Kill()
	lp.done <- <-lp.done
}

// tail is what the daemon's log says went wrong, for an error.
func (lp *lazyPages) tail() string {
	lines, err := criuLogFile(lp.log, 5)
	if err != nil || len(lines) == 0 {
		return "its log (" + lp.log + ") says nothing"
	}
	return strings.Join(lines, "; ")
}
