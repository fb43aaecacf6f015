package e2e

// The GPU half of a checkpoint through the helper (`gpucr checkpoint
// --gpu-only`), without CRIU: quiesce, drain, copy into the image, drop,
// driver lock + checkpoint of the residual, and back.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func gpucrCLI(t testing.TB, h *helperProc, args ...string) (string, error) {
	t.Helper()
	return runErr(2*time.Minute, nil, binPath(t, "gpucr"), append(args, "--socket", h.socket)...)
}

// TestGPUCheckpointLeaveRunning: a checkpoint with --leave-running writes a
// complete, verifiable image of all the process's GPU memory, and the
// process goes on computing exactly what an uninterrupted run computes.
func TestGPUCheckpointLeaveRunning(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "24", "--buffers", "7", "--interval-ms", "20", "--iters", "150")
	a.waitIter(20, 30*time.Second)
	img := filepath.Join(dir, "img")
	for i := 0; i < 3; i++ {
		// each replaces the one before (--force)
		out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running", "--force")
		if err != nil || !strings.Contains(out, "state running") {
			t.Fatalf("checkpoint %d: %v\n%s", i, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "verify", img)
	if !strings.Contains(out, "ok:") {
		t.Fatalf("image verify: %s", out)
	}
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", []string{"--mib", "24", "--buffers", "7"}, 150))
}

// TestGPUCheckpointThenResume: without --leave-running the process stays
// checkpointed (no progress, its GPU memory dropped, the driver state
// checkpointed) until `gpucr resume`; then it carries on exactly.
func TestGPUCheckpointThenResume(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "vmmapp", "--mib", "16", "--interval-ms", "20", "--iters", "120")
	a.waitIter(20, 30*time.Second)
	img := filepath.Join(dir, "img")
	out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only")
	if err != nil || !strings.Contains(out, "state dropped") {
		t.Fatalf("checkpoint: %v\n%s", err, out)
	}
	// what to do next is said: the checkpoint, and a restore of the image
	if want := fmt.Sprintf("`gpucr resume %d` gives it back", a.pid); !strings.Contains(out, want) {
		t.Errorf("the checkpoint does not say %q:\n%s", want, out)
	}
	if out, err := gpucrCLI(t, h, "restore", "-D", img); err == nil || !strings.Contains(out, "holds a GPU-only image") ||
		!strings.Contains(out, "gpucr resume PID") {
		t.Errorf("gpucr restore of a GPU-only image: %v, want a refusal that says what the image is for:\n%s", err, out)
	}
	if s := driverState(t, env, a.pid); s != "checkpointed" {
		t.Errorf("driver state %q after the checkpoint, want checkpointed", s)
	}
	stalled := a.lastIter()
	time.Sleep(500 * time.Millisecond)
	if it := a.lastIter(); it > stalled+10 {
		t.Errorf("the process went on from iteration %d to %d while checkpointed", stalled, it)
	}
	if out, err := gpucrCLI(t, h, "resume", strconv.Itoa(a.pid)); err != nil || !strings.Contains(out, "state running") {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	if out, err := gpucrCLI(t, h, "resume", strconv.Itoa(a.pid)); err == nil || !strings.Contains(out, "nothing to resume") ||
		strings.Contains(out, "ERROR_STATE") {
		t.Errorf("a second resume: %v, want a refusal in words:\n%s", err, out)
	}
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "vmmapp", []string{"--mib", "16"}, 120))
}

// TestGPUCheckpointFailureKeepsRunning: a checkpoint that cannot write its
// image fails with an error naming the cause, the previous image in the
// directory stays intact, and the process runs on with all its memory; a
// pid that is no gpucr client is refused.
func TestGPUCheckpointFailureKeepsRunning(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "ptrchase", "--mib", "8", "--interval-ms", "20", "--iters", "120")
	a.waitIter(10, 30*time.Second)
	// A small file system: the first image fits, a second one (the memory
	// has changed since) does not, and the copy fails midway on ENOSPC.
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o755); err != nil {
		t.Fatal(err)
	}
	mountTmpfsOn(t, img, "size=14m")
	if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running"); err != nil {
		t.Fatalf("first checkpoint: %v\n%s", err, out)
	}
	before, err := os.ReadFile(filepath.Join(img, "gpucr", "manifest.pb"))
	if err != nil {
		t.Fatal(err)
	}
	a.waitIter(a.lastIter()+5, 30*time.Second)
	out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running", "--force")
	if err == nil || !strings.Contains(out, "no space left") {
		t.Fatalf("a checkpoint onto a full file system: %v\n%s", err, out)
	}
	if out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "verify", img); !strings.Contains(out, "ok:") {
		t.Errorf("the previous image does not verify after the failed checkpoint:\n%s", out)
	}
	after, err := os.ReadFile(filepath.Join(img, "gpucr", "manifest.pb"))
	if err != nil || string(after) != string(before) {
		t.Errorf("the previous image changed (%v)", err)
	}
	if out, err := gpucrCLI(t, h, "checkpoint", "1", "-D", filepath.Join(dir, "x"), "--gpu-only"); err == nil || !strings.Contains(out, "no client with pid 1") {
		t.Errorf("checkpoint of a pid that is no client: %v\n%s", err, out)
	}
	st := h.status()
	for _, c := range st.Clients {
		if p, _ := c.Pid.Int64(); int(p) == a.pid && !c.Checkpointable {
			t.Errorf("after the failed checkpoint the client is not checkpointable: %v", c.NotCheckpointable)
		}
	}
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d:\n%s", code, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "ptrchase", []string{"--mib", "8"}, 120))
}
