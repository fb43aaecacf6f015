package e2e

// Served mode on the simulated driver: `gpucr run --served` runs a program
// whose driver calls a worker of the helper's makes (helper/served and the
// served library, intercept/served). Real helper, real workers, real sockets.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// servedStatus is the served part of `gpucr status --json`.
type servedStatus struct {
	Served *struct {
		Idle     []json.Number `json:"idle"`
		Assigned json.Number   `json:"assigned"`
		Workers  []struct {
			Pid       json.Number `json:"pid"`
			Device    json.Number `json:"device"`
			UID       json.Number `json:"uid"`
			ClientPid json.Number `json:"client_pid"`
		} `json:"workers"`
		Templates []struct {
			Pid       json.Number `json:"pid"`
			Device    json.Number `json:"device"`
			UID       json.Number `json:"uid"`
			ImagesDir string      `json:"images_dir"`
		} `json:"templates"`
	} `json:"served"`
}

func servedStatusAs(t testing.TB, h *helperProc, u *otherUser) servedStatus {
	t.Helper()
	cmd := exec.Command(binPath(t, "gpucr"), "status", "--json", "--socket", h.socket)
	if u != nil {
		asUser(cmd, *u)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpucr status: %v\n%s", err, out)
	}
	var st servedStatus
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("gpucr status --json: %v\n%s", err, out)
	}
	return st
}

// waitIdle waits until device 0 has n idle workers.
func waitIdle(t testing.TB, h *helperProc, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := servedStatusAs(t, h, nil)
		if st.Served != nil && len(st.Served.Idle) > 0 {
			if got, _ := st.Served.Idle[0].Int64(); int(got) == n {
				return
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(h.log)
			t.Fatalf("device 0 has no %d idle served workers after 30s: %+v\n%s", n, st.Served, tail(string(b), 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// workerOf is the pid of the worker serving pid, from status.
func workerOf(t testing.TB, h *helperProc, pid int) int {
	t.Helper()
	st := servedStatusAs(t, h, nil)
	if st.Served != nil {
		for _, w := range st.Served.Workers {
			if c, _ := w.ClientPid.Int64(); int(c) == pid {
				p, _ := w.Pid.Int64()
				return int(p)
			}
		}
	}
	t.Fatalf("gpucr status lists no served worker for pid %d: %+v", pid, st.Served)
	return 0
}

func startServed(t testing.TB, dir string, h *helperProc, env []string, name string, mod func(*exec.Cmd), args ...string) *app {
	t.Helper()
	return startUnderRun(t, dir, h, env, name, []string{"--served"}, append([]string{binPath(t, name)}, args...), mod)
}

// servedCases are the programs served mode runs exactly: plain buffers on
// two streams, the same with a CUDA graph replayed, with the driver state
// the CUDA runtime sets (stream priorities, a function attribute, a limit,
// a module global, pointer attributes), with forked CPU workers (a process
// tree), pointer chasing (device pointers stored in device memory),
// threads that allocate and free on their streams, and cuBLAS and cuBLASLt
// (products on two streams, host and device scalars, descriptors made per
// call on the cuBLAS handle as PyTorch does), which run in the worker.
var servedCases = []appCase{
	{"heartbeat", []string{"--mib", "24", "--buffers", "7", "--hb-every", "5"}},
	{"heartbeat", []string{"--graph", "--mib", "16", "--buffers", "5", "--hb-every", "5"}},
	{"heartbeat", []string{"--attrs", "--mib", "8", "--buffers", "3", "--hb-every", "5"}},
	{"heartbeat", []string{"--workers", "2", "--mib", "8", "--buffers", "3", "--hb-every", "5"}},
	{"ptrchase", []string{"--mib", "8", "--hb-every", "5"}},
	{"blasbeat", []string{"--hb-every", "5"}},
	{"blasbeat", []string{"--device-scalars", "--lt-per-call", "--hb-every", "5"}},
	{"blasbeat", []string{"--graph", "--lt-per-call", "--hb-every", "5"}},
}

// TestServedChecksums: each program computes under `gpucr run --served`
// exactly what it computes on the driver itself, while its process maps no
// driver library: its GPU calls ran in the worker that status shows serving
// it, which runs as the program's user.
func TestServedChecksums(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "2")
	waitIdle(t, h, 2)
	sim, _ := filepath.Abs(filepath.Join(buildDir(t), "sim"))
	for i, c := range servedCases {
		t.Run(fmt.Sprintf("%s-%d", c.name, i), func(t *testing.T) {
			args := append(append([]string{}, c.args...), "--iters", "40", "--interval-ms", "0")
			plain := run(t, time.Minute, env, binPath(t, c.name), args...)
			want := doneLine.FindStringSubmatch(plain)
			if want == nil {
				t.Fatalf("plain run printed no done line:\n%s", tail(plain, 10))
			}
			a := startServed(t, t.TempDir(), h, env, c.name, nil, append(append([]string{}, c.args...), "--iters", "40", "--interval-ms", "20")...)
			maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", a.pid))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(maps), sim) || !strings.Contains(string(maps), "/served/libcuda.so.1") {
				t.Errorf("the served process maps the driver, or not the served library:\n%s", maps)
			}
			w := workerOf(t, h, a.pid)
			if uids := procStatusField(t, w, "Uid"); uids != "0\t0\t0\t0" {
				t.Errorf("worker %d serving a root process runs with uids %q", w, uids)
			}
			if code := a.wait(time.Minute); code != 0 {
				t.Fatalf("exit %d under gpucr run --served:\n%s", code, tail(a.output(), 20))
			}
			got := doneLine.FindStringSubmatch(a.output())
			if got == nil || got[2] != want[2] {
				t.Fatalf("served: %v, on the driver: %s\n%s", got, want[0], tail(a.output(), 10))
			}
			if strings.Contains(a.output(), "gpucr: ") {
				t.Errorf("warnings in served mode:\n%s", a.output())
			}
			waitDead(t, w, 10*time.Second)
		})
	}
	// The pool made new workers for the ones it gave out.
	waitIdle(t, h, 2)
}

func procStatusField(t testing.TB, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("process %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("process %d: no %s in its status", pid, field)
	return ""
}

// TestServedWorkerTakesTheUser: another user's served program gets a worker
// that runs as that user (uids, gids, no supplementary groups of the
// helper's), made ahead of time as root; that user's status shows only
// that user's workers; and past --served-max-per-uid a second program of
// the user is refused, by a message that names the limit, while root's are
// not.
func TestServedWorkerTakesTheUser(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--socket-mode", "0666", "--served-pool", "1", "--served-max-per-uid", "1")
	waitIdle(t, h, 1)
	mine := startServed(t, t.TempDir(), h, env, "heartbeat", nil, "--mib", "4", "--iters", "100000", "--interval-ms", "20")
	theirs := startServed(t, dir, h, env, "heartbeat", func(c *exec.Cmd) { asUser(c, u) },
		"--mib", "4", "--iters", "100000", "--interval-ms", "20")
	w := workerOf(t, h, theirs.pid)
	want := fmt.Sprintf("%d\t%d\t%d\t%d", u.UID, u.UID, u.UID, u.UID)
	if got := procStatusField(t, w, "Uid"); got != want {
		t.Errorf("worker %d of uid %d: Uid %q", w, u.UID, got)
	}
	if got := procStatusField(t, w, "Gid"); got != fmt.Sprintf("%d\t%d\t%d\t%d", u.GID, u.GID, u.GID, u.GID) {
		t.Errorf("worker %d of gid %d: Gid %q", w, u.GID, got)
	}
	if got := procStatusField(t, w, "Groups"); got != "" {
		t.Errorf("worker %d kept groups %q", w, got)
	}
	if got := procStatusField(t, w, "CapEff"); got != "0000000000000000" {
		t.Errorf("worker %d of uid %d has capabilities %s", w, u.UID, got)
	}
	st := servedStatusAs(t, h, &u)
	if st.Served == nil || len(st.Served.Workers) != 1 {
		t.Fatalf("uid %d's status lists served workers %+v, want its own one", u.UID, st.Served)
	}
	if c, _ := st.Served.Workers[0].ClientPid.Int64(); int(c) != theirs.pid {
		t.Errorf("uid %d's status shows the worker of pid %d, not its own %d", u.UID, c, theirs.pid)
	}
	if n, _ := st.Served.Assigned.Int64(); n != 2 {
		t.Errorf("status counts %d assigned workers, want 2", n)
	}

	// The second program of the same user is refused, at its cuInit.
	cmd := exec.Command(binPath(t, "gpucr"), "run", "--served", "--socket", h.socket, "--", binPath(t, "heartbeat"), "--mib", "4", "--iters", "3")
	cmd.Env = env
	asUser(cmd, u)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "served-max-per-uid") {
		t.Errorf("a second served program of uid %d (limit 1): %v\n%s", u.UID, err, out)
	}
	// Root's second one runs.
	if out, err := runErr(time.Minute, env, binPath(t, "gpucr"), "run", "--served", "--socket", h.socket, "--",
		binPath(t, "heartbeat"), "--mib", "4", "--iters", "3", "--interval-ms", "0"); err != nil || !doneLine.MatchString(out) {
		t.Errorf("root's second served program: %v\n%s", err, out)
	}
	mine.kill()
	theirs.kill()
}

// TestServedWorkerGone: a worker killed under its program fails the
// program's next GPU call (the driver's, or cuBLAS's) with a message that
// says so, and the program neither hangs nor crashes.
func TestServedWorkerGone(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	// heartbeat's next call is the driver's; blasbeat's, cuBLAS's
	for _, c := range []appCase{
		{"heartbeat", []string{"--mib", "4"}},
		{"blasbeat", []string{"--lt-per-call"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := startServed(t, t.TempDir(), h, env, c.name, nil, append(c.args, "--iters", "100000", "--interval-ms", "10")...)
			a.waitIter(3, 30*time.Second)
			w := workerOf(t, h, a.pid)
			if err := syscall.Kill(w, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			code := a.wait(30 * time.Second)
			if code == 0 || !strings.Contains(a.output(), "the worker (pid "+strconv.Itoa(w)+") is gone") {
				t.Errorf("program whose worker was killed: exit %d:\n%s", code, tail(a.output(), 10))
			}
			if strings.Contains(a.output(), "Segmentation fault") || a.cmd.ProcessState.Sys().(syscall.WaitStatus).Signaled() {
				t.Errorf("program whose worker was killed died of a signal:\n%s", tail(a.output(), 10))
			}
		})
	}
}

// TestServedRefusals: a helper without served mode, and a device it does
// not have, refuse a served program at its first GPU call with a message
// that says why; the program exits with an error, not a crash.
func TestServedRefusals(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	out, err := runErr(time.Minute, env, binPath(t, "gpucr"), "run", "--served", "--socket", h.socket, "--",
		binPath(t, "heartbeat"), "--mib", "4", "--iters", "3")
	if err == nil || !strings.Contains(out, "served mode is off in this helper") {
		t.Errorf("served program with a helper without --served-pool: %v\n%s", err, out)
	}
	h2 := startHelper(t, t.TempDir(), env, "--served-pool", "1")
	out, err = runErr(time.Minute, env, binPath(t, "gpucr"), "run", "--served", "--device", "7", "--socket", h2.socket, "--",
		binPath(t, "heartbeat"), "--mib", "4", "--iters", "3")
	if err == nil || !strings.Contains(out, "no device 7") {
		t.Errorf("served program on device 7 of a helper with one: %v\n%s", err, out)
	}
	out, err = runErr(time.Minute, env, binPath(t, "gpucr"), "run", "--device", "1", "--socket", h2.socket, "--", binPath(t, "heartbeat"))
	if err == nil || !strings.Contains(out, "--device is for served mode") {
		t.Errorf("gpucr run --device without --served: %v\n%s", err, out)
	}
}

// TestServedHelperGone: a helper killed under a served program takes
// nothing from it: the worker is the program's, and the program computes
// on, exactly, to its end.
func TestServedHelperGone(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	args := []string{"--mib", "8", "--hb-every", "1"}
	a := startServed(t, dir, h, env, "heartbeat", nil, append(args, "--interval-ms", "20", "--iters", "60")...)
	a.waitIter(5, 30*time.Second)
	w := workerOf(t, h, a.pid)
	h.stop() // SIGKILL
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("served program whose helper was killed: exit %d:\n%s", code, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, 60))
	waitDead(t, w, 10*time.Second)
}

// servedDriverCases are drvtest's cases of the driver calls the CUDA runtime
// makes beyond loading and launching, which served mode forwards with the
// driver's answers and errors (function attributes, occupancy, globals, fat
// binaries, stream priorities and flags, capture status and mode, event
// record flags, context limits). Not among them: pointer attributes of
// cuMemAlloc memory (the interposer makes it VMM memory, which belongs to no
// context) and of pinned host memory (not served), and launch errors (a
// served launch is asynchronous: its error comes with the next
// synchronization).
var servedDriverCases = []string{"module_globals", "module_fatbin", "func_attributes", "func_attributes_sim",
	"occupancy", "stream_priority", "stream_capture_status", "event_record_flags", "ctx_limits"}

// TestServedDriverCalls: those drvtest cases pass under `gpucr run --served`
// as they pass on the driver itself.
func TestServedDriverCalls(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "2")
	waitIdle(t, h, 2)
	for _, c := range servedDriverCases {
		out, err := runErr(time.Minute, env, binPath(t, "gpucr"), "run", "--served", "--socket", h.socket, "--",
			binPath(t, "drvtest"), c)
		if err != nil || !strings.Contains(out, "ok "+c) {
			t.Errorf("drvtest %s under gpucr run --served: %v\n%s", c, err, tail(out, 20))
		}
	}
}
