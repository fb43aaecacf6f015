package e2e

// The interposer (libgpucr.so) and the helper (`gpucr helper`) together, on
// the simulated driver: real processes, real sockets, real fd passing.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperProc is a `gpucr helper` running for one test.
type helperProc struct {
	t      testing.TB
	socket string
	log    string
	cmd    *exec.Cmd
}

// gpucrEnv is the environment of everything that loads the driver under the
// test: the simulated driver, for the helper and the interposer alike.
func gpucrEnv(t testing.TB, extra ...string) []string {
	t.Helper()
	lib := filepath.Join(buildDir(t), "sim", "libcuda.so.1")
	abs, err := filepath.Abs(lib)
	if err != nil {
		t.Fatal(err)
	}
	return simEnv(t, append([]string{"GPUCR_LIBCUDA=" + abs}, extra...)...)
}

// startHelper starts `gpucr helper` on DIR/helper.sock, with extra flags.
func startHelper(t testing.TB, dir string, env []string, extra ...string) *helperProc {
	t.Helper()
	return startHelperWith(t, dir, env, extra...)
}

// startHelperWith is startHelper with more flags for `gpucr helper`.
func startHelperWith(t testing.TB, dir string, env []string, flags ...string) *helperProc {
	t.Helper()
	h := &helperProc{t: t, socket: filepath.Join(dir, "helper.sock"), log: filepath.Join(dir, "helper.log")}
	f, err := os.Create(h.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h.cmd = exec.Command(binPath(t, "gpucr"), append([]string{"helper", "--socket", h.socket, "--log-level", "debug"}, flags...)...)
	h.cmd.Env = env
	h.cmd.Stdout, h.cmd.Stderr = f, f
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("start gpucr helper: %v", err)
	}
	t.Cleanup(h.stop)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(h.socket); err == nil {
			if _, err := h.statusErr(); err == nil {
				return h
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(h.log)
			t.Fatalf("gpucr helper did not answer on %s within 20s; log:\n%s", h.socket, tail(string(b), 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *helperProc) stop() {
	if h.cmd != nil && h.cmd.ProcessState == nil {
		_ = h.cmd.Process.Kill()
		_, _ = h.cmd.Process.Wait()
	}
}

// status is `gpucr status --json`, decoded loosely: what the tests read.
type status struct {
	Clients []struct {
		Pid               json.Number `json:"pid"`
		Allocations       json.Number `json:"allocations"`
		Bytes             json.Number `json:"bytes"`
		ControlConnected  bool        `json:"control_connected"`
		Checkpointable    bool        `json:"checkpointable"`
		NotCheckpointable []string    `json:"not_checkpointable"`
	} `json:"clients"`
	Devices []struct {
		UUID        string      `json:"uuid"`
		FreeMemory  json.Number `json:"free_memory"`
		TotalMemory json.Number `json:"total_memory"`
	} `json:"devices"`
}

func (h *helperProc) statusErr() (*status, error) {
	out, err := runErr(10*time.Second, nil, binPath(h.t, "gpucr"), "status", "--json", "--socket", h.socket)
	if err != nil {
		return nil, fmt.Errorf("gpucr status: %v\n%s", err, out)
	}
	var st status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, fmt.Errorf("gpucr status --json: %v\n%s", err, out)
	}
	return &st, nil
}

func (h *helperProc) status() *status {
	h.t.Helper()
	st, err := h.statusErr()
	if err != nil {
		h.t.Fatal(err)
	}
	return st
}

func (h *helperProc) client(pid int) (allocs, bytes int64, ok bool) {
	for _, c := range h.status().Clients {
		if p, _ := c.Pid.Int64(); int(p) == pid {
			a, _ := c.Allocations.Int64()
			b, _ := c.Bytes.Int64()
			return a, b, true
		}
	}
	return 0, 0, false
}

// op runs `gpucr client PID OP` and returns its output.
func (h *helperProc) op(pid int, op string) string {
	h.t.Helper()
	return run(h.t, 30*time.Second, nil, binPath(h.t, "gpucr"), "client", strconv.Itoa(pid), op, "--json", "--socket", h.socket)
}

// startUnder starts a test application under `gpucr run` (helper h, or no
// helper at all when h is nil: then the socket named does not exist).
func startUnder(t testing.TB, dir string, h *helperProc, env []string, name string, args ...string) *app {
	t.Helper()
	return startUnderArgv(t, dir, h, env, name, append([]string{binPath(t, name)}, args...))
}

// startUnderArgv is startUnder for any command line (its log is NAME.log).
func startUnderArgv(t testing.TB, dir string, h *helperProc, env []string, name string, argv []string) *app {
	t.Helper()
	return startUnderCmd(t, dir, h, env, name, argv, nil)
}

// startUnderCmd is startUnderArgv with mod, if set, applied to the command
// before it starts (asUser, say).
func startUnderCmd(t testing.TB, dir string, h *helperProc, env []string, name string, argv []string, mod func(*exec.Cmd)) *app {
	t.Helper()
	return startUnderRun(t, dir, h, env, name, nil, argv, mod)
}

// startUnderRun is startUnderCmd with flags for `gpucr run` (--served, say).
func startUnderRun(t testing.TB, dir string, h *helperProc, env []string, name string, runFlags, argv []string, mod func(*exec.Cmd)) *app {
	t.Helper()
	socket := filepath.Join(dir, "no-helper.sock")
	if h != nil {
		socket = h.socket
	}
	a := &app{t: t, name: name, args: argv[1:], log: filepath.Join(dir, name+".log")}
	f, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	full := append(append(append([]string{"run", "--socket", socket}, runFlags...), "--"), argv...)
	a.cmd = exec.Command(binPath(t, "gpucr"), full...)
	a.cmd.Env = env
	a.cmd.Stdout, a.cmd.Stderr = f, f
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if mod != nil {
		mod(a.cmd)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("gpucr run %s: %v", name, err)
	}
	a.started() // gpucr run execs the command: same pid
	t.Cleanup(a.kill)
	// Registered after kill, so it runs first: a failed test shows what
	// the application printed (a restored process's errors go there).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s (pid %d) printed:\n%s", name, a.pid, tail(a.output(), 20))
		}
	})
	a.waitFor(30*time.Second, "ready", func(out string, _ []heartbeat) bool {
		return strings.Contains(out, "ready pid="+strconv.Itoa(a.pid))
	})
	return a
}

// wait waits for the application to exit and returns its exit code.
func (a *app) wait(timeout time.Duration) int {
	a.t.Helper()
	select {
	case <-a.exited:
	case <-time.After(timeout):
		a.t.Fatalf("%s (pid %d) still running after %v; output:\n%s", a.name, a.pid, timeout, tail(a.output(), 30))
	}
	return a.cmd.ProcessState.ExitCode()
}

var doneLine = regexp.MustCompile(`(?m)^done (\d+) ([0-9a-f]{16})$`)

// TestInterposedChecksums: each test application under `gpucr run` computes
// exactly what it computes without the interposer, and its memory came from
// the helper while it ran.
func TestInterposedChecksums(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	for _, c := range appCases {
		t.Run(c.name, func(t *testing.T) {
			args := append(append([]string{}, c.args...), "--iters", "40", "--interval-ms", "0")
			plain := run(t, time.Minute, env, binPath(t, c.name), args...)
			want := doneLine.FindStringSubmatch(plain)
			if want == nil {
				t.Fatalf("plain run printed no done line:\n%s", tail(plain, 10))
			}
			// Slow enough to be seen by status while it runs.
			a := startUnder(t, t.TempDir(), h, env, c.name, append(append([]string{}, c.args...), "--iters", "40", "--interval-ms", "20")...)
			allocs, bytes, ok := h.client(a.pid)
			if !ok || allocs == 0 || bytes == 0 {
				t.Errorf("gpucr status does not show pid %d with helper memory (listed %v, %d allocations, %d bytes)", a.pid, ok, allocs, bytes)
			}
			if code := a.wait(time.Minute); code != 0 {
				t.Fatalf("exit %d under gpucr run:\n%s", code, tail(a.output(), 20))
			}
			got := doneLine.FindStringSubmatch(a.output())
			if got == nil || got[2] != want[2] {
				t.Fatalf("under gpucr run: %v, without: %s\n%s", got, want[0], tail(a.output(), 10))
			}
			if strings.Contains(a.output(), "gpucr: ") {
				t.Errorf("warnings with a helper present:\n%s", a.output())
			}
		})
	}
}

// TestNoHelperPassThrough: without a helper the application runs unchanged
// (pass-through), with one warning.
func TestNoHelperPassThrough(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	plain := run(t, time.Minute, env, binPath(t, "heartbeat"), "--iters", "20", "--interval-ms", "0")
	a := startUnder(t, dir, nil, env, "heartbeat", "--iters", "20", "--interval-ms", "0")
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d:\n%s", code, a.output())
	}
	if doneLine.FindString(a.output()) != doneLine.FindString(plain) {
		t.Errorf("pass-through changed the result:\n%s\nwant %s", a.output(), doneLine.FindString(plain))
	}
	if n := strings.Count(a.output(), "gpucr: "); n != 1 {
		t.Errorf("want exactly one warning line, got %d:\n%s", n, a.output())
	}
}

// TestStormsAndManyClients: 16 processes at once, each with several threads
// allocating and freeing on their own streams; every buffer's contents are
// checked; afterwards the helper holds nothing.
func TestStormsAndManyClients(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_SIM_MEM_MIB=4096")
	h := startHelper(t, dir, env)
	var apps []*app
	for i := 0; i < 16; i++ {
		d := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		apps = append(apps, startUnder(t, d, h, env, "stormapp", "--threads", "3", "--rounds", "300",
			"--live", "8", "--max-kib", "3072", "--seed", strconv.Itoa(i+1)))
	}
	for _, a := range apps {
		if code := a.wait(3 * time.Minute); code != 0 || !strings.Contains(a.output(), "errors=0") {
			t.Errorf("stormapp pid %d: exit %d:\n%s", a.pid, code, tail(a.output(), 10))
		}
	}
	waitNoClients(t, h, 10*time.Second)
}

func waitNoClients(t testing.TB, h *helperProc, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := h.status()
		held := int64(0)
		for _, c := range st.Clients {
			b, _ := c.Bytes.Int64()
			held += b
		}
		if len(st.Clients) == 0 && held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after every client exited the helper still lists %d clients holding %d bytes", len(st.Clients), held)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestClientKilledMemoryReturns: SIGKILL a client holding memory; the helper
// releases all of it (its device's free memory goes back to where it was).
func TestClientKilledMemoryReturns(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	free0 := deviceFree(t, h)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "64", "--buffers", "6", "--interval-ms", "50")
	a.waitIter(10, 30*time.Second)
	if _, bytes, ok := h.client(a.pid); !ok || bytes < 64<<20 {
		t.Fatalf("status: pid %d listed %v with %d bytes, want >= 64 MiB", a.pid, ok, bytes)
	}
	if f := deviceFree(t, h); f >= free0 {
		t.Fatalf("free memory did not drop while the client held 64 MiB (%d -> %d)", free0, f)
	}
	a.kill()
	waitNoClients(t, h, 10*time.Second)
	if f := deviceFree(t, h); f != free0 {
		t.Errorf("free device memory %d after the client was killed, %d before it started", f, free0)
	}
}

func deviceFree(t testing.TB, h *helperProc) int64 {
	t.Helper()
	st := h.status()
	if len(st.Devices) == 0 {
		t.Fatal("gpucr status lists no device")
	}
	f, _ := st.Devices[0].FreeMemory.Int64()
	return f
}

// TestHelperKilledMidRun: the helper dies while clients run; their buffers
// keep working, new allocations fall back to local memory with one warning,
// and every buffer's contents stay right.
func TestHelperKilledMidRun(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	hb := startUnder(t, filepath.Join(dir), h, env, "heartbeat", "--mib", "16", "--interval-ms", "10", "--iters", "150")
	stormDir := filepath.Join(dir, "storm")
	if err := os.Mkdir(stormDir, 0o755); err != nil {
		t.Fatal(err)
	}
	storm := startUnder(t, stormDir, h, env, "stormapp", "--threads", "3", "--seconds", "4", "--live", "8")
	hb.waitIter(20, 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	h.stop()
	if code := storm.wait(time.Minute); code != 0 || !strings.Contains(storm.output(), "errors=0") {
		t.Errorf("stormapp after the helper died: exit %d:\n%s", code, tail(storm.output(), 10))
	}
	if n := strings.Count(storm.output(), "gpucr: "); n != 1 {
		t.Errorf("stormapp: want one warning about the helper, got %d:\n%s", n, tail(storm.output(), 10))
	}
	if code := hb.wait(time.Minute); code != 0 {
		t.Fatalf("heartbeat after the helper died: exit %d:\n%s", code, tail(hb.output(), 10))
	}
	ref := reference(t, env, "heartbeat", []string{"--mib", "16"}, 150)
	compareWithReference(t, hb.heartbeats(), ref)
}

// TestQuiesceDropReimportCycle: while stormapp's threads keep allocating,
// freeing, setting and checking memory, the helper quiesces the process,
// drains it, drops all its memory, re-imports it and resumes it, again and
// again; addresses stay the same and not one byte changes.
func TestQuiesceDropReimportCycle(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "stormapp", "--threads", "4", "--seconds", "6", "--live", "12")
	var cycles int
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		h.op(a.pid, "quiesce")
		h.op(a.pid, "drain")
		before := h.op(a.pid, "snapshot")
		h.op(a.pid, "drop")
		h.op(a.pid, "reimport")
		after := h.op(a.pid, "snapshot")
		if addrs(t, before) != addrs(t, after) {
			t.Fatalf("cycle %d: buffer table changed across drop/reimport:\nbefore %s\nafter  %s", cycles, before, after)
		}
		h.op(a.pid, "resume")
		cycles++
		time.Sleep(100 * time.Millisecond)
	}
	if code := a.wait(time.Minute); code != 0 || !strings.Contains(a.output(), "errors=0") {
		t.Fatalf("stormapp across %d cycles: exit %d:\n%s", cycles, code, tail(a.output(), 10))
	}
	if cycles < 3 {
		t.Errorf("only %d quiesce/drop/reimport cycles ran", cycles)
	}
	t.Logf("%d cycles", cycles)
}

// addrs reduces a snapshot's JSON (a BufferTable in protojson: 64-bit
// numbers are strings) to its allocations' address+size list.
func addrs(t testing.TB, snap string) string {
	t.Helper()
	var v struct {
		Allocations []struct {
			Address any `json:"address"`
			Size    any `json:"size"`
		} `json:"allocations"`
	}
	if err := json.Unmarshal([]byte(snap), &v); err != nil {
		t.Fatalf("snapshot JSON: %v\n%s", err, snap)
	}
	var b strings.Builder
	for _, a := range v.Allocations {
		fmt.Fprintf(&b, "%v+%v ", a.Address, a.Size)
	}
	return b.String()
}

// TestQuiesceCycleVMMApp: vmmapp's own VMM memory (cuMemCreate, cuMemMap
// twice into one reservation, cuMemSetAccess over both) comes from the
// helper, so quiesce/drain/drop/reimport/resume cycles cover it: the
// allocations are listed as VMM, addresses stay the same, the process stays
// checkpointable, and every heartbeat equals an uninterrupted run's.
func TestQuiesceCycleVMMApp(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	args := []string{"--mib", "8", "--hb-every", "5"}
	const iters = 300
	a := startUnder(t, dir, h, env, "vmmapp", append(append([]string{}, args...), "--iters", strconv.Itoa(iters), "--interval-ms", "10")...)
	a.waitIter(10, 30*time.Second)
	const cycles = 4
	for cycle := 0; cycle < cycles; cycle++ {
		h.op(a.pid, "quiesce")
		h.op(a.pid, "drain")
		before := h.op(a.pid, "snapshot")
		if n := strings.Count(before, "ALLOC_KIND_VMM"); n < 2 {
			t.Fatalf("cycle %d: snapshot lists %d VMM entries, want vmmapp's two allocations (and their mappings):\n%s", cycle, n, before)
		}
		if strings.Contains(before, "application VMM allocations") {
			t.Fatalf("cycle %d: vmmapp not checkpointable:\n%s", cycle, before)
		}
		h.op(a.pid, "drop")
		h.op(a.pid, "reimport")
		after := h.op(a.pid, "snapshot")
		if addrs(t, before) != addrs(t, after) {
			t.Fatalf("cycle %d: allocations changed across drop/reimport:\nbefore %s\nafter  %s", cycle, before, after)
		}
		h.op(a.pid, "resume")
		a.waitIter(a.lastIter()+5, 30*time.Second)
	}
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("vmmapp across %d cycles: exit %d:\n%s", cycles, code, tail(a.output(), 10))
	}
	if strings.Contains(a.output(), "gpucr: ") {
		t.Errorf("warnings with a helper present:\n%s", tail(a.output(), 10))
	}
	hbs := a.heartbeats()
	if len(hbs) == 0 || hbs[len(hbs)-1].Iter != iters {
		t.Fatalf("vmmapp did not report its last iteration %d:\n%s", iters, tail(a.output(), 10))
	}
	compareWithReference(t, hbs, reference(t, env, "vmmapp", args, iters))
	waitNoClients(t, h, 10*time.Second)
}

// TestForkedChildrenLeaveConnectionAlone: children forked by an interposed
// process exit without touching the driver; the parent's helper connections
// must survive them (the children forget, never use or close, the parent's
// connections), so the parent stays a checkpointable client throughout.
func TestForkedChildrenLeaveConnectionAlone(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "stormapp", "--threads", "2", "--seconds", "3", "--forks", "10")
	time.Sleep(2 * time.Second) // most children have come and gone
	st := h.status()
	found := false
	for _, c := range st.Clients {
		if p, _ := c.Pid.Int64(); int(p) == a.pid {
			found = true
			if !c.ControlConnected || !c.Checkpointable {
				t.Errorf("after forks: control connected %v, checkpointable %v (%v)", c.ControlConnected, c.Checkpointable, c.NotCheckpointable)
			}
		} else {
			t.Errorf("a forked child (pid %s) registered as a client without using the driver", c.Pid)
		}
	}
	if !found {
		t.Errorf("the parent (pid %d) is no longer a client after its children exited", a.pid)
	}
	h.op(a.pid, "quiesce")
	h.op(a.pid, "resume")
	if code := a.wait(time.Minute); code != 0 || !strings.Contains(a.output(), "errors=0") {
		t.Fatalf("stormapp with forks: exit %d:\n%s", code, tail(a.output(), 10))
	}
}

// TestLaunchTracking: every launch of heartbeat (all three launch forms,
// kernelParams and packed `extra`) is counted and, with GPUCR_SCAN=all,
// scanned: each has a parameter layout and points into tracked buffers. By
// default only a sample is scanned.
func TestLaunchTracking(t *testing.T) {
	dir := t.TempDir()
	h := startHelper(t, dir, gpucrEnv(t))
	stats := func(env []string) map[string]int64 {
		t.Helper()
		d := t.TempDir()
		a := startUnder(t, d, h, env, "heartbeat", "--mib", "8", "--interval-ms", "5", "--iters", "400")
		a.waitIter(300, time.Minute)
		out := h.op(a.pid, "stats")
		var raw map[string]any
		if err := json.Unmarshal([]byte(out), &raw); err != nil {
			t.Fatalf("stats JSON: %v\n%s", err, out)
		}
		m := map[string]int64{}
		for k, v := range raw {
			n, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
			m[k] = n
		}
		a.kill()
		return m
	}
	all := stats(gpucrEnv(t, "GPUCR_SCAN=all"))
	if all["launches"] < 600 || all["launches_scanned"] != all["launches"] || all["launches_with_hits"] != all["launches"] ||
		all["pointer_words"] < all["launches"] || all["launches_no_layout"] != 0 || all["param_layouts"] < 2 {
		t.Errorf("GPUCR_SCAN=all: %v", all)
	}
	if all["copies"] == 0 || all["streams_created"] < 2 || all["modules_loaded"] == 0 || all["allocs"] == 0 {
		t.Errorf("copies, streams, modules or allocations not counted: %v", all)
	}
	def := stats(gpucrEnv(t))
	if def["launches"] < 600 || def["launches_scanned"] == 0 || def["launches_scanned"]*8 > def["launches"] {
		t.Errorf("default sampling: %d of %d launches scanned", def["launches_scanned"], def["launches"])
	}
}

// TestGateHoldsOtherWork: work queued by entry points other than launches,
// copies and memsets (here host functions, cuLaunchHostFunc; CUDA graph
// launches, 2D/3D and peer copies, stream memory operations are gated the
// same way) waits while the process is quiesced, and goes on after resume.
func TestGateHoldsOtherWork(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "hostfn", "--hb-every", "1", "--interval-ms", "5", "--iters", "400")
	a.waitIter(10, 30*time.Second)
	h.op(a.pid, "quiesce")
	at := a.lastIter()
	time.Sleep(300 * time.Millisecond)
	// At most the iteration whose host function was queued before the gate
	// closed may still report.
	if got := a.lastIter(); got > at+1 {
		t.Fatalf("host functions ran on while the process was quiesced: iteration %d -> %d", at, got)
	}
	h.op(a.pid, "resume")
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("hostfn: exit %d:\n%s", code, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "hostfn", []string{"--hb-every", "1"}, 400))
}
