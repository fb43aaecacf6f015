package e2e

// Checkpoint and restore of served-mode processes: CRIU dumps the process
// alone (it holds no driver state), and the restore gives it a worker from
// the pool, in which the served library makes its context again.

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServedCheckpointRestore: a served process checkpointed (stopped)
// lets its worker go; restored, it gets another one and continues exactly
// from its stop, for plain buffers on two streams, a CUDA graph replayed
// every iteration, the driver state the CUDA runtime sets (stream
// priorities, a function attribute its launches need, a context limit, a
// module global's contents: heartbeat --attrs checks them every
// iteration), device pointers stored in device memory, and cuBLAS's and
// cuBLASLt's handles, descriptors and settings (made again in the new
// worker), with their products captured in CUDA graphs too (PyTorch's
// descriptors, made and destroyed around each captured product), and a
// module global the new worker places elsewhere (heartbeat --moved-global:
// its count must come back at its new address). A leave-running
// checkpoint of it continues at once (in a new worker), and its image
// restores exactly too.
func TestServedCheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	env := gpucrEnv(t)
	for i, c := range []appCase{
		{"heartbeat", []string{"--mib", "16", "--buffers", "5"}},
		{"heartbeat", []string{"--graph", "--mib", "8", "--buffers", "3"}},
		{"heartbeat", []string{"--attrs", "--mib", "8", "--buffers", "3"}},
		{"heartbeat", []string{"--attrs", "--moved-global", "--mib", "8", "--buffers", "3"}},
		{"ptrchase", []string{"--mib", "8"}},
		{"blasbeat", []string{"--lt-per-call"}},
		{"blasbeat", []string{"--device-scalars"}},
		{"blasbeat", []string{"--graph", "--lt-per-call"}},
	} {
		t.Run(fmt.Sprintf("%s-%d", c.name, i), func(t *testing.T) {
			dir := t.TempDir()
			h := startHelper(t, dir, env, "--served-pool", "1")
			waitIdle(t, h, 1)
			args := append(append([]string{}, c.args...), "--interval-ms", "20", "--hb-every", "1")
			a := startServed(t, dir, h, env, c.name, nil, args...)
			a.waitIter(10, time.Minute)
			w := workerOf(t, h, a.pid)

			img := dir + "/img"
			out := cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running")
			before := a.lastIter()
			a.waitIter(before+10, time.Minute)
			if w2 := workerOf(t, h, a.pid); w2 == w {
				t.Errorf("after a leave-running checkpoint pid %d is served by the same worker %d", a.pid, w)
			}
			waitDead(t, w, 10*time.Second)
			if bad := unexpectedWarnings(a.output(), movedGlobal(c.args)); len(bad) > 0 {
				t.Errorf("warnings after a leave-running checkpoint: %q\n%s\n%s", bad, a.output(), out)
			}

			img2 := dir + "/img2"
			cliOK(t, h, env, img2, "checkpoint", strconv.Itoa(a.pid), "-D", img2)
			w = workerOfGone(t, h, a.pid)
			a.reap(30 * time.Second)
			waitPidFree(a.pid, 10*time.Second)
			before = a.lastIter()
			cliOK(t, h, env, img2, "restore", "-D", img2)
			a.waitIter(before+10, time.Minute)
			if w2 := workerOf(t, h, a.pid); w2 == w {
				t.Errorf("the restored pid %d is served by worker %d, which served it before", a.pid, w)
			}
			cliOK(t, h, env, img, "image", "inspect", img)
			a.kill()
			compareWithReference(t, a.heartbeats(), reference(t, env, c.name, args, maxIter(a.heartbeats())))
			if t.Failed() {
				t.Logf("%s:\n%s", c.name, tail(a.output(), 30))
				t.Logf("helper:\n%s", tail(h.logText(), 40))
			}
		})
	}
}

// movedGlobal: whether args run heartbeat with a global that a new worker
// places elsewhere (--moved-global), so that the first move says so.
func movedGlobal(args []string) bool {
	for _, a := range args {
		if a == "--moved-global" {
			return true
		}
	}
	return false
}

// movedLine is how served mode says that a new worker placed globals
// elsewhere.
const movedLine = "module globals elsewhere"

// unexpectedWarnings are gpucr's lines in out other than the one that says
// globals moved, which must be there (once) where moved says one moved.
func unexpectedWarnings(out string, moved bool) []string {
	var bad []string
	said := 0
	for _, l := range strings.Split(out, "\n") {
		switch {
		case !strings.Contains(l, "gpucr: "):
		case moved && strings.Contains(l, movedLine):
			said++
		default:
			bad = append(bad, l)
		}
	}
	if moved && said != 1 {
		bad = append(bad, fmt.Sprintf("(%d lines that say a global moved, not 1)", said))
	}
	return bad
}

// workerOfGone is the worker that served pid before a checkpoint that
// stopped it, once status lists none for it (it was let go).
func workerOfGone(t testing.TB, h *helperProc, pid int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := servedStatusAs(t, h, nil)
		found := 0
		if st.Served != nil {
			for _, w := range st.Served.Workers {
				if c, _ := w.ClientPid.Int64(); int(c) == pid {
					p, _ := w.Pid.Int64()
					found = int(p)
				}
			}
		}
		if found == 0 {
			return -1
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %d still serves pid %d after a checkpoint that stopped it", found, pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestServedRestoreOntoAnotherGPU: a served process checkpointed on one
// simulated GPU restores onto the other (--device-map 0=1): its new worker
// runs there, and it continues exactly.
func TestServedRestoreOntoAnotherGPU(t *testing.T) {
	needTool(t, "criu")
	env := append(gpucrEnv(t), "GPUCR_SIM_DEVICES=2")
	dir := t.TempDir()
	h := startHelper(t, dir, env, "--served-pool", "1")
	args := []string{"--mib", "16", "--interval-ms", "20", "--hb-every", "1"}
	a := startServed(t, dir, h, env, "heartbeat", nil, append(args, "--show-device")...)
	a.waitIter(10, time.Minute)
	st := h.status()
	if len(st.Devices) != 2 {
		t.Fatalf("the helper sees %d GPUs, want 2", len(st.Devices))
	}
	img := dir + "/img"
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img, "--device-map", "0=1")
	a.waitIter(before+10, time.Minute)
	ss := servedStatusAs(t, h, nil)
	onDevice := -1
	for _, w := range ss.Served.Workers {
		if c, _ := w.ClientPid.Int64(); int(c) == a.pid {
			d, _ := w.Device.Int64()
			onDevice = int(d)
		}
	}
	if onDevice != 1 {
		t.Errorf("after --device-map 0=1 the restored process's worker is on device %d, want 1", onDevice)
	}
	if g := gpuOfLastHeartbeat(a); !strings.HasPrefix(g, st.Devices[1].UUID) {
		t.Errorf("after --device-map 0=1 heartbeat runs on %q, want %s", g, st.Devices[1].UUID)
	}
	a.kill()
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, maxIter(a.heartbeats())))
}

// TestServedTreeCheckpointRestore: a shell running two served programs,
// each with a worker of its own, is checkpointed as one tree and restored:
// each program gets a new worker and continues exactly.
func TestServedTreeCheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	env := gpucrEnv(t)
	dir := t.TempDir()
	h := startHelper(t, dir, env, "--served-pool", "2")
	waitIdle(t, h, 2)
	args := [][]string{{"--mib", "8", "--interval-ms", "20", "--hb-every", "1", "--seed", "3"},
		{"--mib", "4", "--buffers", "3", "--interval-ms", "20", "--hb-every", "1", "--seed", "9"}}
	apps := make([]*app, len(args))
	script := ""
	for i, a := range args {
		apps[i] = &app{t: t, name: "heartbeat", log: fmt.Sprintf("%s/hb%d.log", dir, i)}
		script += binPath(t, "heartbeat") + " " + strings.Join(a, " ") + " >>" + apps[i].log + " 2>&1 & "
	}
	root := exec.Command(binPath(t, "gpucr"), "run", "--served", "--socket", h.socket, "--", "/bin/sh", "-c", script+"wait")
	root.Env = env
	root.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := root.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-root.Process.Pid, syscall.SIGKILL)
		for _, a := range apps {
			if a.pid > 0 {
				_ = syscall.Kill(a.pid, syscall.SIGKILL)
			}
		}
		_, _ = root.Process.Wait()
	})
	workers := map[int]bool{}
	for _, a := range apps {
		a.waitFor(30*time.Second, "ready", func(out string, _ []heartbeat) bool {
			a.pid, _ = parseHeartbeats(out)
			return a.pid > 0
		})
		a.waitIter(10, time.Minute)
		workers[workerOf(t, h, a.pid)] = true
	}
	if len(workers) != 2 {
		t.Fatalf("two served programs share a worker: %v", workers)
	}
	img := dir + "/img"
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(root.Process.Pid), "-D", img)
	_, _ = root.Process.Wait()
	befores := make([]int, len(apps))
	for i, a := range apps {
		waitDead(t, a.pid, 30*time.Second)
		befores[i] = a.lastIter()
	}
	cliOK(t, h, env, img, "restore", "-D", img)
	for i, a := range apps {
		a.waitIter(befores[i]+10, time.Minute)
		if w := workerOf(t, h, a.pid); workers[w] {
			t.Errorf("restored pid %d is served by worker %d, which served a program before the checkpoint", a.pid, w)
		}
	}
	for i, a := range apps {
		_ = syscall.Kill(a.pid, syscall.SIGKILL)
		compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args[i], maxIter(a.heartbeats())))
	}
}
