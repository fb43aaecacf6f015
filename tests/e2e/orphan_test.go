package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// A helper that dies while a process is detached for a dump (here: the test
// plays the CRIU plugin, then SIGKILLs the helper before DumpDone) must not
// leave that process waiting for its wake file forever.

// detachForDump does what the plugin's PAUSE_DEVICES and exit(DUMP) do up to
// DumpDone: Checkpoint{detach, defer_commit}, then CommitImage if commit.
// The connection stays open (closing it would make the helper give the
// process its GPU back); the caller kills the helper.
func detachForDump(t *testing.T, socket string, pid int, img string, commit bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := client.Dial(ctx, socket, helperpb.Role_ROLE_PLUGIN, "orphan-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, _, err := conn.Call(ctx, &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: &helperpb.Checkpoint{
		Pid: int64(pid), ImageDir: img, Detach: true, DeferCommit: true}}}); err != nil {
		t.Fatalf("Checkpoint{detach}: %v", err)
	}
	if commit {
		if _, _, err := conn.Call(ctx, &helperpb.Request{Body: &helperpb.Request_CommitImage{CommitImage: &helperpb.CommitImage{
			ImageDir: img}}}); err != nil {
			t.Fatalf("CommitImage: %v", err)
		}
	}
}

// killHelper SIGKILLs h and waits until it is gone.
func killHelper(h *helperProc) {
	_ = h.cmd.Process.Kill()
	_, _ = h.cmd.Process.Wait()
}

// waitAborted waits for a to die and checks it died of SIGABRT saying why.
func waitAborted(t *testing.T, a *app, timeout time.Duration, want string) {
	t.Helper()
	a.reap(timeout)
	ws, ok := a.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGABRT {
		t.Errorf("%s ended with %v, want SIGABRT", a.name, a.cmd.ProcessState)
	}
	if out := a.output(); !strings.Contains(out, "GPU state is lost") || !strings.Contains(out, want) {
		t.Errorf("%s's output does not say why (want %q):\n%s", a.name, want, tail(out, 10))
	}
}

// The checkpoint's image was committed when the helper died: a CRIU dump
// (the process detached, waiting for DumpDone), or `gpucr checkpoint
// --gpu-only` (the process stopped, waiting for `gpucr resume`). A new
// helper adopts the process, loads its memory from the image, and it
// computes on exactly.
func TestHelperDiesAfterCommit(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, h *helperProc, pid int, img string)
	}{
		{"dump", func(t *testing.T, h *helperProc, pid int, img string) { detachForDump(t, h.socket, pid, img, true) }},
		{"gpu-only", func(t *testing.T, h *helperProc, pid int, img string) {
			if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(pid), "-D", img, "--gpu-only"); err != nil {
				t.Fatalf("gpucr checkpoint --gpu-only: %v\n%s", err, out)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := gpucrEnv(t)
			h := startHelper(t, dir, env)
			a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
			a.waitIter(15, time.Minute)
			tc.stop(t, h, a.pid, filepath.Join(dir, "img"))
			before := a.lastIter()
			killHelper(h)
			time.Sleep(300 * time.Millisecond)
			if a.lastIter() > before {
				t.Fatalf("heartbeat ran on while checkpointed (iteration %d after %d)", a.lastIter(), before)
			}
			h2 := startHelper(t, dir, env)
			a.waitIter(before+30, time.Minute)
			_ = syscall.Kill(a.pid, syscall.SIGKILL)
			hbs := a.heartbeats()
			compareWithReference(t, hbs, reference(t, env, "heartbeat", []string{"--mib", "16"}, hbs[len(hbs)-1].Iter))
			checkContinuous(t, hbs, before)
			if log := helperLog(h2); !strings.Contains(log, "adopted a process") {
				t.Errorf("the new helper does not say it adopted the process:\n%s", tail(log, 15))
			}
		})
	}
}

// The dump never committed its image (the helper died between the process's
// checkpoint and the end of the whole dump), and DIR holds an older image of
// the same process: the new helper must not load that one, but the part of
// the image the checkpoint sealed before the process gave its memory up; the
// process computes on exactly. Only without that part (here removed) is the
// process told its GPU state is lost.
func TestHelperDiesBeforeCommit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		removePart bool
	}{{"part", false}, {"no part", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := gpucrEnv(t)
			h := startHelper(t, dir, env)
			a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
			a.waitIter(10, time.Minute)
			img := filepath.Join(dir, "img")
			if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running"); err != nil {
				t.Fatalf("earlier checkpoint: %v\n%s", err, out)
			}
			a.waitIter(a.lastIter()+10, time.Minute)
			detachForDump(t, h.socket, a.pid, img, false)
			before := a.lastIter()
			killHelper(h)
			if tc.removePart {
				if err := os.RemoveAll(filepath.Join(img, "gpucr", "parts")); err != nil {
					t.Fatal(err)
				}
				h2 := startHelper(t, dir, env)
				waitAborted(t, a, 30*time.Second, "nor its part of one")
				if log := helperLog(h2); !strings.Contains(log, "has lost its GPU state") {
					t.Errorf("the new helper does not report the lost process:\n%s", tail(log, 15))
				}
				return
			}
			h2 := startHelper(t, dir, env)
			a.waitIter(before+30, time.Minute)
			_ = syscall.Kill(a.pid, syscall.SIGKILL)
			hbs := a.heartbeats()
			compareWithReference(t, hbs, reference(t, env, "heartbeat", []string{"--mib", "16"}, hbs[len(hbs)-1].Iter))
			checkContinuous(t, hbs, before)
			if log := helperLog(h2); !strings.Contains(log, "adopted a process") {
				t.Errorf("the new helper does not say it adopted the process:\n%s", tail(log, 15))
			}
		})
	}
}

// No helper comes back: the detached process gives up after
// GPUCR_ORPHAN_TIMEOUT_S instead of waiting forever.
func TestHelperNeverComesBack(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_ORPHAN_TIMEOUT_S=2")
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "8", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	detachForDump(t, h.socket, a.pid, filepath.Join(dir, "img"), true)
	killHelper(h)
	start := time.Now()
	waitAborted(t, a, 30*time.Second, "has been gone for 2 s")
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("gave up after %v, before the 2 s timeout", took)
	}
}

func helperLog(h *helperProc) string {
	b, _ := os.ReadFile(h.log)
	return string(b)
}

// The helper is SIGKILLed in the middle of `criu dump` (quiesced and drained,
// before the copy; its memory still mapped by the process): the dump fails
// naming the helper, and the application keeps running on its own, computing
// on exactly (the interposer's fallback after a helper death).
func TestHelperKilledMidDump(t *testing.T) {
	rig := newCriuRig(t, "GPUCR_FAULT=stall-copy")
	criu, dir, env, h, img := rig.criu, rig.dir, rig.env, rig.h, rig.img
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(15, time.Minute)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runErr(2*time.Minute, rig.criuEnv, criu, "dump", "-t", strconv.Itoa(a.pid), "-D", img, "--libdir", rig.libdir, "-o", "dump.log")
		done <- result{out, err}
	}()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(helperLog(h), "stalling before the copy") {
		if time.Now().After(deadline) {
			t.Fatalf("the checkpoint never reached the copy:\n%s", tail(helperLog(h), 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	killHelper(h)
	r := <-done
	log, _ := os.ReadFile(filepath.Join(img, "dump.log"))
	if r.err == nil {
		t.Fatalf("criu dump succeeded although the helper died mid-dump:\n%s", r.out)
	}
	if all := r.out + string(log); !strings.Contains(all, "gpucr_plugin") {
		t.Errorf("the failed dump does not name the plugin:\n%s\n%s", r.out, tail(string(log), 20))
	}
	at := a.lastIter()
	a.waitIter(at+30, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", []string{"--mib", "16"}, hbs[len(hbs)-1].Iter))
	if out := a.output(); !strings.Contains(out, "resuming") {
		t.Errorf("the interposer does not say it resumed on its own:\n%s", tail(out, 10))
	}
}

// A helper SIGKILLed at any moment of a checkpoint never costs the
// application its life: whether it dies before the copy, during it, between
// the drop and the commit or after, the application runs on by itself or is
// adopted by the next helper, and computes exactly. Ten kills at points
// spread over the checkpoint, of a GPU-only and of a CRIU checkpoint, both
// --leave-running.
func TestHelperKilledAnywhereInCheckpoint(t *testing.T) {
	needTool(t, "criu")
	args := []string{"--mib", "48", "--buffers", "6", "--hb-every", "5"}
	const iters = 150
	env := gpucrEnv(t)
	ref := reference(t, env, "heartbeat", args, iters)
	adopted := 0
	for i := 0; i < 10; i++ {
		kind := []string{"--gpu-only"}
		if i%2 == 1 {
			kind = nil // CRIU, with the plugin next to the gpucr binary
		}
		delay := time.Duration(i*12) * time.Millisecond
		t.Run(fmt.Sprintf("%d-%v-after-%v", i, map[bool]string{true: "gpu-only", false: "criu"}[kind != nil], delay), func(t *testing.T) {
			dir := t.TempDir()
			h := startHelper(t, dir, env)
			a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--iters", strconv.Itoa(iters), "--interval-ms", "5")...)
			a.waitIter(20, time.Minute)
			ck := exec.Command(binPath(t, "gpucr"), append([]string{"checkpoint", strconv.Itoa(a.pid), "-D",
				filepath.Join(dir, "img"), "--leave-running", "--socket", h.socket}, kind...)...)
			ck.Env = env
			if err := ck.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(delay)
			killHelper(h)
			_ = ck.Wait()
			h2 := startHelper(t, dir, env)
			if code := a.wait(2 * time.Minute); code != 0 {
				t.Fatalf("the application ended with %d after its helper died %v into a checkpoint:\n%s", code, delay, tail(a.output(), 10))
			}
			compareWithReference(t, a.heartbeats(), ref)
			if strings.Contains(helperLog(h2), "adopted a process") {
				adopted++
			}
		})
	}
	t.Logf("%d of 10 applications were adopted by the next helper (their helper died after they gave their memory up); the others ran on by themselves", adopted)
}

// TestHelperKilledAfterDropKeepsImage: the helper dies during `gpucr
// checkpoint` after the process gave up its GPU memory (its part of the
// image sealed, the image not committed). The failed checkpoint keeps that
// partial image, says why, and the next helper gives the process its
// memory back from it: it computes on exactly.
func TestHelperKilledAfterDropKeepsImage(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=stall-dropped"))
	args := []string{"--mib", "16", "--hb-every", "5"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--iters", "200", "--interval-ms", "5")...)
	a.waitIter(20, time.Minute)
	img := filepath.Join(dir, "img")
	done := make(chan string, 1)
	go func() {
		// Copied while the process waits: a concurrent checkpoint seals
		// the part after its background copy, and a helper that dies
		// before leaves the process lost (docs/architecture.md).
		out, _ := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", "--concurrent=false")
		done <- out
	}()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(helperLog(h), "stalling after the drop") {
		if time.Now().After(deadline) {
			t.Fatalf("the checkpoint never reached the drop:\n%s", tail(helperLog(h), 20))
		}
		time.Sleep(10 * time.Millisecond)
	}
	killHelper(h)
	out := <-done
	if !strings.Contains(out, "kept the partial GPU image") || !strings.Contains(out, fmt.Sprintf("pid %d of the tree may wait", a.pid)) {
		t.Errorf("the failed checkpoint does not keep the partial image for the waiting process:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(img, "gpucr")); err != nil {
		t.Fatalf("the partial GPU image is gone: %v\n%s", err, out)
	}
	h2 := startHelper(t, dir, env)
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("the application ended with %d after its helper died after the drop:\n%s\nnext helper:\n%s", code, tail(a.output(), 10), tail(helperLog(h2), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, 200))
	if !strings.Contains(helperLog(h2), "adopted") {
		t.Errorf("the next helper did not adopt the process:\n%s", tail(helperLog(h2), 15))
	}
}
