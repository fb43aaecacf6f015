package e2e

import (
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRestoredProcessDiesWhileReattaching: a restored process that goes
// after it reattached but before it has its GPU memory back (on the GPU
// machine JAX's process crashed inside the driver there) fails the restore
// at once, saying so, instead of leaving `gpucr restore` waiting for its
// deadline. The helper stalls its reply to the reattaching process
// (GPUCR_FAULT=stall-reattach) so that the test can kill it in that window.
func TestRestoredProcessDiesWhileReattaching(t *testing.T) {
	rig := newCriuRig(t, "GPUCR_FAULT=stall-reattach")
	a := startUnder(t, rig.dir, rig.h, rig.env, "heartbeat", "--mib", "8", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	if out, code := gpucrRun(t, rig.criuEnv, "checkpoint", strconv.Itoa(a.pid), "-D", rig.img); code != 0 {
		t.Fatalf("gpucr checkpoint: exit %d:\n%s", code, out)
	}
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)

	type result struct {
		out  string
		code int
		took time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		out, code := gpucrRun(t, rig.criuEnv, "restore", "-D", rig.img)
		done <- result{out, code, time.Since(start)}
	}()
	const stalled = "injected fault: stalling the reattach"
	for deadline := time.Now().Add(time.Minute); !strings.Contains(helperLog(rig.h), stalled); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the restored process never reattached:\n%s", tail(helperLog(rig.h), 20))
		}
	}
	killed := time.Now()
	if err := syscall.Kill(a.pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the restored process %d: %v", a.pid, err)
	}
	r := <-done
	t.Logf("gpucr restore said:\n%s", r.out)
	if r.code == 0 {
		t.Fatalf("gpucr restore of a process that died while reattaching: exit 0:\n%s", r.out)
	}
	want := "exited or was killed before it got its GPU memory back"
	if !strings.Contains(r.out, want) {
		t.Errorf("gpucr restore does not say what happened (want %q):\n%s", want, r.out)
	}
	if d := time.Since(killed); d > 15*time.Second {
		t.Errorf("gpucr restore took %v after the process died to say so (its deadline is a minute)", d)
	}
	if !strings.Contains(helperLog(rig.h), "restored process went before it got its GPU memory back") {
		t.Errorf("the helper log does not say the restored process went:\n%s", tail(helperLog(rig.h), 20))
	}
}
