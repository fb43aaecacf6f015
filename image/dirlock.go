package image

// The lock on an image directory DIR itself, for what must not happen to
// one image twice at once: two restores of it (the second would load the
// GPU memory again and then fail on pids the first has taken, and make the
// first fail too), or its removal while it is restored. It is an flock on a
// descriptor of DIR, so it needs nothing written into DIR (which may be
// read-only, or another user's), goes with the process that holds it (a
// crash releases it by itself), and is independent of DIR/gpucr/.lock,
// which writers and gc take.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// InUseError: the image directory is locked by another process (LockImage).
type InUseError struct {
	Dir   string
	Pid   int    // the holder, 0 if not known (another pid namespace)
	Doing string // what the holder does: "restored by another gpucr restore", "removed by gpucr image rm"
}

func (e *InUseError) Error() string {
	s := fmt.Sprintf("the image in %s is being %s", e.Dir, e.Doing)
	if e.Pid > 0 {
		s += fmt.Sprintf(" (pid %d)", e.Pid)
	}
	return s
}

// Unwrap makes an InUseError an ErrBusy.
func (e *InUseError) Unwrap() error { return ErrBusy }

// LockImage takes the lock of the image directory d is open on, without
// waiting, for as long as d stays open (the caller's: close d to release
// it). d must be a descriptor of its own (an open of its own, not a dup
// of one another lock may be on). Another process that holds it makes an
// *InUseError naming it.
func LockImage(d *os.File, path string) error {
	err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("lock the image directory %s: %w", path, err)
	}
	e := &InUseError{Dir: path, Doing: "restored by another gpucr restore"}
	var st unix.Stat_t
	if unix.Fstat(int(d.Fd()), &st) == nil {
		e.Pid = flockHolder(uint64(st.Dev), st.Ino)
	}
	if e.Pid > 0 && holderRemoves(e.Pid) {
		e.Doing = "removed by gpucr image rm"
	}
	return e
}

// flockHolder finds the process holding an flock on the file dev/ino in
// /proc/locks (whose pids are those of the reader's pid namespace); 0 if
// none is seen.
func flockHolder(dev, ino uint64) int {
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	// "1: FLOCK  ADVISORY  WRITE 1234 08:02:131 0 EOF"; waiters have "->"
	// after the number.
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(dev), unix.Minor(dev), ino)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}

// holderRemoves says whether pid is a `gpucr image rm` (the other command
// that takes the lock), from its command line; only for the message.
func holderRemoves(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "image" && args[i+1] == "rm" {
			return true
		}
	}
	return false
}
