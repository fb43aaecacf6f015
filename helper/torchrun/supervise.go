package torchrun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Proc is a rank ready to start: the program's path, its argv and
// environment (the interposer's included).
type Proc struct {
	Rank
	Path string
	Argv []string
	Env  []string
}

// Outcome is how the job ended.
type Outcome struct {
	// Code is the launcher's exit status: 0 when every rank exited 0; the
	// first failing rank's code (128+N for one killed by signal N); 128+N
	// for a signal N the launcher was sent and passed on.
	Code   int
	Failed *Rank          // the first rank that failed, if one did
	Signal syscall.Signal // the signal the launcher passed on, if any
}

// forwarded are the signals passed on to every rank, as torchrun's agent
// passes them on (it stops its workers on each).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// Supervise starts the ranks as children of this process and waits for
// them: a signal of forwarded is passed on to every rank still running;
// once one rank fails, the others are sent SIGTERM. Ranks that have not
// exited grace after that are killed. The ranks stay in the launcher's
// session and process group, so that the launcher is the root of the tree
// `gpucr checkpoint` dumps.
//
// It holds nothing CRIU cannot dump: the children are waited for with
// wait4, not through pidfds (os.StartProcess keeps one per child), and
// signals come through the Go runtime's handlers, not a signalfd.
func Supervise(procs []Proc, stderr io.Writer, grace time.Duration) (Outcome, error) {
	sigs := make(chan os.Signal, 4)
	// Before the first rank starts: a signal from then on is passed on.
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	running := make(map[int]Proc, len(procs))
	for _, p := range procs {
		pid, err := syscall.ForkExec(p.Path, p.Argv, &syscall.ProcAttr{
			Env:   p.Env,
			Files: []uintptr{0, 1, 2},
		})
		if err != nil {
			for pid := range running {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			reapAll()
			return Outcome{}, fmt.Errorf("rank %d: start %s: %w", p.Rank.Rank, p.Path, err)
		}
		running[pid] = p
		fmt.Fprintf(stderr, "gpucr torchrun: rank %d (local rank %d) pid %d\n", p.Rank.Rank, p.LocalRank, pid)
	}

	exits := make(chan exit, len(procs))
	go waitChildren(exits)

	var out Outcome
	var kill <-chan time.Time // after grace, once the ranks were asked to stop
	stopAll := func(sig syscall.Signal) {
		for pid := range running {
			_ = syscall.Kill(pid, sig)
		}
		if kill == nil {
			kill = time.After(grace)
		}
	}
	for len(running) > 0 {
		select {
		case e := <-exits:
			p, ok := running[e.pid]
			if !ok {
				continue // no rank of ours
			}
			delete(running, e.pid)
			code := exitCode(e.status)
			if code == 0 {
				continue
			}
			if out.Failed != nil || out.Signal != 0 {
				continue // stopped by us
			}
			out.Failed, out.Code = &p.Rank, code
			fmt.Fprintf(stderr, "gpucr torchrun: rank %d (local rank %d, pid %d) %s; stopping the other ranks\n",
				p.Rank.Rank, p.LocalRank, e.pid, describe(e.status))
			stopAll(syscall.SIGTERM)
		case s := <-sigs:
			sig := s.(syscall.Signal)
			if out.Signal == 0 && out.Failed == nil {
				out.Signal, out.Code = sig, 128+int(sig)
			}
			fmt.Fprintf(stderr, "gpucr torchrun: %v: passed on to the %d running ranks\n", sig, len(running))
			stopAll(sig)
		case <-kill:
			fmt.Fprintf(stderr, "gpucr torchrun: %d ranks still running %v after they were asked to stop: killing them\n", len(running), grace)
			for pid := range running {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if out.Code == 0 {
		fmt.Fprintf(stderr, "gpucr torchrun: all %d ranks exited 0\n", len(procs))
	}
	return out, nil
}

// exit is a child's end as wait4 reports it.
type exit struct {
	pid    int
	status syscall.WaitStatus
}

// waitChildren reports every child's exit until none is left. wait4 is
// restarted where a signal, or a checkpoint and its restore, interrupts it.
func waitChildren(exits chan<- exit) {
	for {
		var st syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &st, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return // ECHILD: none left
		}
		exits <- exit{pid, st}
	}
}

// reapAll collects every child that is left (after a failed start).
func reapAll() {
	for {
		var st syscall.WaitStatus
		if _, err := syscall.Wait4(-1, &st, 0, nil); err != nil && !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}

// exitCode is a shell's view of a child's end: its exit status, or 128+N
// if signal N killed it.
func exitCode(st syscall.WaitStatus) int {
	if st.Signaled() {
		return 128 + int(st.Signal())
	}
	return st.ExitStatus()
}

func describe(st syscall.WaitStatus) string {
	if st.Signaled() {
		return fmt.Sprintf("was killed by %v", st.Signal())
	}
	return fmt.Sprintf("exited with code %d", st.ExitStatus())
}
