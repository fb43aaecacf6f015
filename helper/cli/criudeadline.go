package cli

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
)

// A CRIU run through go-criu under a deadline.
//
// go-criu starts `criu swrk FD` (Prepare) as a child of this process and
// keeps its *exec.Cmd unexported, and its request blocks in a read on the
// RPC socket with no timeout. So the deadline finds the swrk process itself:
// the one child of this process that appeared during Prepare, read from
// /proc/PID/task/*/children of all its threads (Go forks on any of them).
// Nothing else in gpucr starts a process meanwhile; the command line is not
// checked, as a launcher script may exec CRIU under another one. Its pid
// cannot be reused before go-criu's Cleanup reaps it, and Cleanup runs only
// after the deadline's kill, so the kill never reaches another process.

// criuOutcome is how one CRIU request ended.
type criuOutcome struct {
	err      error // go-criu's error; nil: CRIU answered success
	timedOut bool  // the deadline passed and CRIU was killed
	swrk     int   // criu swrk's pid (0: not found; a timeout then only gives up waiting)
	killed   []int // after a timeout: processes killed besides swrk (a restore's half-made tree)
	hung     bool  // after the kill, go-criu still did not return
}

// criuReturnGrace is how long go-criu gets to return once CRIU was killed
// (its RPC read ends when the socket closes, unless a child of CRIU holds
// the socket open).
const criuReturnGrace = 5 * time.Second

// runCRIU runs req (one go-criu request) on a `criu swrk` at criuPath. When
// deadline passes first, CRIU is killed with SIGKILL; with killNew, so are
// children of this process that appeared while CRIU ran (a restore with
// RstSibling makes the restored tree's root one: half-restored, it must not
// stay).
func runCRIU(criuPath string, deadline time.Duration, killNew bool, req func(*criu.Criu) error) criuOutcome {
	var o criuOutcome
	cr := criu.MakeCriu()
	cr.SetCriuPath(criuPath)
	self := os.Getpid()
	before, _ := procChildren(self)
	if err := cr.Prepare(); err != nil {
		o.err = fmt.Errorf("start %s swrk: %w", criuPath, err)
		return o
	}
	after, _ := procChildren(self)
	var started []int
	for _, p := range after {
		if !slices.Contains(before, p) {
			started = append(started, p)
		}
	}
	if len(started) == 1 { // else unsure which: kill none
		o.swrk = started[0]
	}
	done := make(chan error, 1)
	go func() { done <- req(cr) }()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case o.err = <-done:
		return o.cleanup(cr)
	case <-timer.C:
	}
	select { // finished at the same moment: not a timeout
	case o.err = <-done:
		return o.cleanup(cr)
	default:
	}
	o.timedOut = true
	if o.swrk > 0 {
		_ = syscall.Kill(o.swrk, syscall.SIGKILL)
	}
	if killNew {
		now, _ := procChildren(self)
		for _, p := range now {
			if p != o.swrk && !slices.Contains(after, p) && syscall.Kill(p, syscall.SIGKILL) == nil {
				o.killed = append(o.killed, p)
			}
		}
	}
	select {
	case o.err = <-done:
		return o.cleanup(cr)
	case <-time.After(criuReturnGrace):
		o.hung = true // the goroutine stays blocked; this command ends soon
		return o
	}
}

// cleanup reaps criu swrk (go-criu's Cleanup); CRIU's exit status after a
// kill is no news.
func (o criuOutcome) cleanup(cr *criu.Criu) criuOutcome {
	if err := cr.Cleanup(); err != nil && !o.timedOut {
		var ee interface{ ExitCode() int }
		if o.err == nil || !errors.As(err, &ee) {
			o.err = errors.Join(o.err, err)
		}
	}
	return o
}
