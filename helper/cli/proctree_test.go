package cli

import (
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

func TestProcessTree(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & sleep 60 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
	var tree []int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if tree = processTree(cmd.Process.Pid); len(tree) == 3 {
			break
		}
	}
	if len(tree) != 3 || tree[0] != cmd.Process.Pid {
		t.Fatalf("tree of %d: %v, want it and its two sleeps", cmd.Process.Pid, tree)
	}
	kids, err := procChildren(cmd.Process.Pid)
	if err != nil || !slices.Equal(kids, tree[1:]) {
		t.Fatalf("children %v (%v), tree %v", kids, err, tree)
	}
	if byParent, err := childrenByParent(cmd.Process.Pid); err != nil || !slices.Equal(byParent, kids) {
		t.Fatalf("children by parent %v (%v), want %v", byParent, err, kids)
	}
	if _, err := procChildren(4194304); err == nil {
		t.Error("children of a missing pid")
	}
}
