package proc

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// A held tree is the shell and its two sleeps; a signal reaches a held
// process, and once one has died (and its pid taken by another process)
// it goes nowhere: the process with the pid now is left alone.
func TestHoldTreeSignal(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & sleep 60 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
	root := Pid(cmd.Process.Pid)
	var held []*Process
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var err error
		if held, err = HoldTree(root); err != nil {
			t.Fatal(err)
		}
		if len(held) == 3 {
			break
		}
		CloseAll(held)
	}
	defer func() { CloseAll(held) }()
	if pids := Pids(held); len(pids) != 3 || pids[0] != root || !slices.Equal(pids, Tree(root)) {
		t.Fatalf("held tree %v, want the shell and its two sleeps (%v)", pids, Tree(root))
	}
	if again := AddDescendants(held); len(again) != 3 {
		t.Errorf("AddDescendants of the whole tree added %v", Pids(again[3:]))
	}
	// The first sleep dies (its parent, the shell, reaps it in its wait)
	// and the test's sleeper takes its pid.
	kid := held[1]
	if err := kid.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL to a held process: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if left := WaitGone(ctx, []*Process{kid}); len(left) > 0 {
		t.Fatalf("pid %d still shows the killed process", kid.Pid())
	}
	var taker *exec.Cmd
	for try := 0; try < 20 && taker == nil; try++ {
		if !forcePid(kid.Pid()) {
			t.Skip("cannot choose the next pid (not root?)")
		}
		c := sleeper(t)
		if Pid(c.Process.Pid) == kid.Pid() {
			taker = c
		}
	}
	if taker == nil {
		t.Skip("another process took the pid each time")
	}
	if err := kid.Signal(syscall.SIGKILL); !errors.Is(err, ErrGone) {
		t.Errorf("SIGKILL to the dead held process: %v, want ErrGone", err)
	}
	if st, err := ReadStat(kid.Pid()); err != nil || !st.Alive() {
		t.Errorf("the process that took pid %d was signalled: %+v, %v", kid.Pid(), st, err)
	}
	if left := WaitGone(ctx, []*Process{kid}); len(left) > 0 {
		t.Error("WaitGone waits for the process that took the pid")
	}
	// Nor is it taken for a child of the shell.
	if again := AddDescendants(held); len(again) != 3 {
		t.Errorf("AddDescendants after the pid was taken: %v", Pids(again))
	}
}

// WaitGone waits while the process is a zombie (its pid still taken) and
// returns once it is reaped, held by a pidfd or by pid and start time.
func TestWaitGoneWaitsForTheZombie(t *testing.T) {
	for _, byPid := range []bool{false, true} {
		cmd := sleeper(t)
		pid := Pid(cmd.Process.Pid)
		var p *Process
		var err error
		if byPid {
			p, err = newProcess(-1, pid, nil)
		} else {
			p, err = Open(pid)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, p.Exited(), "a killed child")
		short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if left := WaitGone(short, []*Process{p}); len(left) != 1 {
			t.Errorf("by pid %v: WaitGone returned while the child is a zombie", byPid)
		}
		cancel()
		_, _ = cmd.Process.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if left := WaitGone(ctx, []*Process{p}); len(left) != 0 {
			t.Errorf("by pid %v: WaitGone waits for a reaped child", byPid)
		}
		cancel()
		p.Close()
	}
}
