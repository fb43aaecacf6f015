package e2e

// The partial GPU image a checkpoint keeps when its helper dies: kept only
// for a process that may wait for its memory in it, said so truly, and
// removable with gc once none does.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// checkpointWhileHelperDies runs `gpucr checkpoint --leave-running` of a
// (whole process; concurrent: --concurrent=true or false) into img and
// SIGKILLs the helper once its log shows stall; it returns the
// checkpoint's output.
func checkpointWhileHelperDies(t *testing.T, h *helperProc, env []string, a *app, img, stall, concurrent string) string {
	t.Helper()
	done := make(chan string, 1)
	go func() {
		out, _ := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", concurrent)
		done <- out
	}()
	for deadline := time.Now().Add(time.Minute); !strings.Contains(helperLog(h), stall); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the checkpoint never reached %q:\n%s", stall, tail(helperLog(h), 20))
		}
	}
	killHelper(h)
	return <-done
}

// TestPartialImageOnlyForWaitingProcesses: the helper dies during a
// concurrent checkpoint's stop, after the process gave its memory up to
// the helper's snapshot but before any part of the image was sealed (that
// comes after the background copy). Nothing can give that memory back
// from the partial image, so the failed checkpoint neither keeps it nor
// says the process waits for it (before, it kept it, claiming so); and
// while the helper dies before the copy, the process runs on by itself and
// nothing is kept either.
func TestPartialImageOnlyForWaitingProcesses(t *testing.T) {
	needTool(t, "criu")
	for _, tc := range []struct {
		name, fault, stall, concurrent string
		runsOn                         bool
	}{
		{"concurrent-after-the-drop", "stall-dropped", "stalling after the drop", "--concurrent=true", false},
		{"before-the-copy", "stall-copy", "stalling before the copy", "--concurrent=false", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := gpucrEnv(t)
			h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT="+tc.fault))
			args := []string{"--mib", "16", "--hb-every", "5"}
			a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--iters", "200", "--interval-ms", "5")...)
			a.waitIter(20, time.Minute)
			img := filepath.Join(dir, "img")
			out := checkpointWhileHelperDies(t, h, env, a, img, tc.stall, tc.concurrent)
			t.Logf("the failed checkpoint said:\n%s", out)
			if strings.Contains(out, "wait for their GPU memory") || strings.Contains(out, "kept the partial GPU image") {
				t.Errorf("the failed checkpoint claims a process waits for its partial image:\n%s", out)
			}
			if _, err := os.Stat(filepath.Join(img, "gpucr")); err == nil {
				t.Errorf("the partial GPU image nobody waits for stays in %s", img)
			}
			if !tc.runsOn {
				a.kill()
				return
			}
			if code := a.wait(2 * time.Minute); code != 0 {
				t.Fatalf("the application ended with %d:\n%s", code, tail(a.output(), 10))
			}
			compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, 200))
		})
	}
}

// TestGCRemovesPartialImageNobodyWaitsFor: the helper dies after the
// process gave its memory up to the image's sealed part. The partial image
// is kept, and gc refuses to remove it while the process may wait for it;
// once the next helper gave the process its memory back from it, gc
// removes it (before: "holds no committed manifest", for good).
func TestGCRemovesPartialImageNobodyWaitsFor(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=stall-dropped"))
	args := []string{"--mib", "16", "--hb-every", "5"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--iters", "200", "--interval-ms", "5")...)
	a.waitIter(20, time.Minute)
	img := filepath.Join(dir, "img")
	out := checkpointWhileHelperDies(t, h, env, a, img, "stalling after the drop", "--concurrent=false")
	if !strings.Contains(out, "kept the partial GPU image") || !strings.Contains(out, fmt.Sprintf("pid %d of the tree may wait", a.pid)) {
		t.Errorf("the failed checkpoint does not keep the partial image for the process that may wait:\n%s", out)
	}
	gc := func() (string, error) { return cli(t, h, env, "image", "gc", img) }
	if out, err := gc(); err == nil || !strings.Contains(out, fmt.Sprintf("pid %d may still wait", a.pid)) {
		t.Errorf("gc of a partial image a process may wait for: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(img, "gpucr", "parts")); err != nil {
		t.Fatalf("gc removed the partial image a process may wait for: %v", err)
	}
	h2 := startHelper(t, dir, env)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(helperLog(h2), "adopted"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the next helper did not adopt the process:\n%s", tail(helperLog(h2), 15))
		}
	}
	out, err := cli(t, h2, env, "image", "gc", img)
	if err != nil || !strings.Contains(out, "unfinished") {
		t.Errorf("gc of the partial image once the process has its memory back: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(img, "gpucr")); err == nil {
		t.Errorf("gc left the partial image %s", filepath.Join(img, "gpucr"))
	}
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("the application ended with %d:\n%s", code, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, 200))
	_ = syscall.Kill(a.pid, 0)
}
