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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpucr/gpucr/helper/internal/uffd"
	"github.com/gpucr/gpucr/image"
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

// A lazy restore of a GPU process pays a userfaultfd round trip for every
// page of the driver state NVIDIA parked in it (about 620 MiB: 159k pages)
// that its restore reads before CRIU's lazy-pages daemon has sent it. Where
// that round trip is slow, the driver's restore waits seconds instead of a
// plain restore's 0.3 s: on one H100 host 10.5 s (about 66 us a page, if
// every page faulted); on another, whose round trip measured 14-17 us, the
// daemon's background transfer kept ahead and the driver's restore took
// 0.63-0.68 s (tests/gpu/README.md).

// DefaultLazyFaultLimit is the round trip above which a lazy restore of GPU
// processes is refused; GPUCR_LAZY_FAULT_LIMIT_US sets another.
const DefaultLazyFaultLimit = 40 * time.Microsecond

// lazyProbePages is how many faults the probe takes (about 30-40 ms).
const lazyProbePages = 2000

// parkedPages is the driver state NVIDIA's checkpoint parks in a GPU
// process, in 4 KiB pages (DESIGN: about 620 MiB).
const parkedPages = 620 << 20 >> 12

// lazyFaultLimit is GPUCR_LAZY_FAULT_LIMIT_US, or the default.
func lazyFaultLimit() time.Duration {
	if v, err := strconv.ParseFloat(os.Getenv("GPUCR_LAZY_FAULT_LIMIT_US"), 64); err == nil && v > 0 {
		return time.Duration(v * float64(time.Microsecond))
	}
	return DefaultLazyFaultLimit
}

// LazyFaultCost measures this host's userfaultfd round trip (about 30-40
// ms), and says the limit above which a lazy restore of GPU processes is
// refused.
func LazyFaultCost() (cost, limit time.Duration, err error) {
	cost, err = uffd.FaultCost(lazyProbePages)
	return cost, lazyFaultLimit(), err
}

// servedOnly: every process of the image in dir ran in served mode, so no
// NVIDIA restore waits on parked driver state after CRIU's: a lazy restore
// pays whatever a fault costs. An image that cannot be read says no (and the
// restore reports it further on).
func servedOnly(dir string) bool {
	im, err := image.Open(dir)
	if err != nil {
		return false
	}
	defer im.Close()
	ps := im.Processes()
	for _, p := range ps {
		if !p.Served {
			return false
		}
	}
	return len(ps) > 0
}

// lazyPagesPay refuses a lazy restore of GPU processes where this host's
// userfaultfd round trip is over the limit: the restore would lose, not win.
func lazyPagesPay() error {
	cost, limit, err := LazyFaultCost()
	if err != nil {
		return fmt.Errorf("restore --lazy-pages refused: this host's userfaultfd could not be measured (%v): restore without --lazy-pages", err)
	}
	if cost <= limit {
		return nil
	}
	return fmt.Errorf("restore --lazy-pages refused: a page fault served through userfaultfd takes %.1f us on this host (over %.0f us, "+
		"GPUCR_LAZY_FAULT_LIMIT_US); NVIDIA's restore of each GPU process reads the driver state it parked (about 620 MiB) right after CRIU, "+
		"and would wait up to %.1f s for its pages instead of about 0.3 s: restore without --lazy-pages",
		float64(cost)/float64(time.Microsecond), float64(limit)/float64(time.Microsecond), (time.Duration(parkedPages) * cost).Seconds())
}
