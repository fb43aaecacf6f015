package e2e

// criu dump / criu restore of processes under `gpucr run`, with gpucr's CRIU
// plugin: the GPU memory goes through the helper into the image, only the
// residual context through the driver checkpoint API.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/checkpoint"
)

// pluginDir is a directory holding only gpucr's CRIU plugin (CRIU loads
// every library in its --libdir).
func pluginDir(t testing.TB) string {
	t.Helper()
	so := filepath.Join(buildDir(t), "lib", "criu", "gpucr_plugin.so")
	if _, err := os.Stat(so); err != nil {
		t.Fatalf("%s is not built (run `make`): %v", so, err)
	}
	d := t.TempDir()
	abs, _ := filepath.Abs(so)
	if err := os.Symlink(abs, filepath.Join(d, "gpucr_plugin.so")); err != nil {
		t.Fatal(err)
	}
	return d
}

// criuOK runs `criu ARGS -D img -o log` and fails the test, with the end of
// CRIU's log, if it fails.
func criuOK(t testing.TB, criu string, env []string, img, log string, args ...string) {
	t.Helper()
	full := append(append([]string{}, args...), "-D", img, "-o", log)
	if out, err := runErr(2*time.Minute, env, criu, full...); err != nil {
		b, _ := os.ReadFile(filepath.Join(img, log))
		t.Fatalf("criu %s: %v\n%s\n%s", strings.Join(args, " "), err, out, tail(string(b), 40))
	}
}

// TestPluginDumpRestore: criu dump (the process dies) and criu restore with
// the plugin; the application goes on with exactly the checksums of an
// uninterrupted run, and the GPU image in CRIU's directory verifies.
func TestPluginDumpRestore(t *testing.T) {
	for _, tc := range appCases {
		t.Run(tc.name, func(t *testing.T) {
			rig := newCriuRig(t)
			criu, dir, env, h, criuEnv, libdir, img := rig.criu, rig.dir, rig.env, rig.h, rig.criuEnv, rig.libdir, rig.img
			a := startUnder(t, dir, h, env, tc.name, append(append([]string{}, tc.args...), "--interval-ms", "20")...)
			a.waitIter(15, time.Minute)
			criuOK(t, criu, criuEnv, img, "dump.log", "dump", "-t", strconv.Itoa(a.pid), "--libdir", libdir, "-v4")
			a.reap(30 * time.Second)
			before := a.lastIter()
			if out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "verify", img); !strings.Contains(out, "ok:") {
				t.Fatalf("GPU image: %s", out)
			}
			waitNoClients(t, h, 10*time.Second) // the dead process's memory was released

			criuOK(t, criu, criuEnv, img, "restore.log", "restore", "-d", "--libdir", libdir, "-v4")
			a.waitIter(before+20, time.Minute)
			_ = syscall.Kill(a.pid, syscall.SIGKILL)
			hbs := a.heartbeats()
			compareWithReference(t, hbs, reference(t, env, tc.name, tc.args, hbs[len(hbs)-1].Iter))
			checkContinuous(t, hbs, before)
		})
	}
}

// TestPluginLeaveRunning: criu dump --leave-running with the plugin: the
// process gets its GPU back at once and computes on exactly; the image
// restores into a second process after the first is killed.
func TestPluginLeaveRunning(t *testing.T) {
	rig := newCriuRig(t)
	criu, dir, env, h, criuEnv, libdir, img := rig.criu, rig.dir, rig.env, rig.h, rig.criuEnv, rig.libdir, rig.img
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(15, time.Minute)
	criuOK(t, criu, criuEnv, img, "dump.log", "dump", "-t", strconv.Itoa(a.pid), "--leave-running", "--libdir", libdir, "-v4")
	at := a.lastIter()
	a.waitIter(at+20, time.Minute)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", []string{"--mib", "16"}, hbs[len(hbs)-1].Iter))
}

// criuRig is what the CRIU tests share: a helper, the environment CRIU runs
// in (its plugin reaches that helper), the plugin directory and an empty
// image directory.
type criuRig struct {
	criu, dir, libdir, img string
	env, criuEnv           []string
	h                      *helperProc
}

// newCriuRig starts a helper with helperEnv added to the simulated driver's
// environment.
func newCriuRig(t *testing.T, helperEnv ...string) *criuRig {
	t.Helper()
	r := &criuRig{criu: needTool(t, "criu"), dir: t.TempDir(), env: gpucrEnv(t), libdir: pluginDir(t)}
	r.h = startHelper(t, r.dir, append(append([]string{}, r.env...), helperEnv...))
	r.criuEnv = append(append([]string{}, r.env...), "GPUCR_SOCKET="+r.h.socket)
	r.img = filepath.Join(r.dir, "img")
	if err := os.Mkdir(r.img, 0o700); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCLICheckpointRestore: `gpucr checkpoint` and `gpucr restore` drive
// CRIU (go-criu) with the plugin found next to the gpucr binary.
func TestCLICheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	a := startUnder(t, dir, h, env, "ptrchase", "--mib", "8", "--interval-ms", "20")
	a.waitIter(15, time.Minute)
	cliEnv := append(append([]string{}, env...), "GPUCR_SOCKET="+h.socket)
	out, err := runErr(2*time.Minute, cliEnv, binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", img, "--json")
	if err != nil || !strings.Contains(out, `"image_bytes"`) {
		b, _ := os.ReadFile(filepath.Join(img, "dump.log"))
		hl, _ := os.ReadFile(h.log)
		t.Fatalf("gpucr checkpoint: %v\n%s\ndump.log:\n%s\nhelper log:\n%s", err, out, tail(string(b), 30), tail(string(hl), 15))
	}
	// The report carries the helper's GPU copy: every byte of ptrchase's
	// device memory (8 MiB of data plus its pointer table), finished.
	var rep struct {
		GPU struct {
			Bytes    uint64  `json:"bytes"`
			Total    uint64  `json:"total_bytes"`
			Finished bool    `json:"finished"`
			GBPerS   float64 `json:"gb_per_s"`
			Moved    uint64  `json:"bytes_moved"`
		} `json:"gpu"`
		GPUState     bool `json:"gpu_state"`
		GPUProcesses []struct {
			Pid   int    `json:"pid"`
			State string `json:"state"`
		} `json:"gpu_processes"`
		CRIU *checkpoint.CRIUDumpStats `json:"criu"`
	}
	if i := strings.LastIndex(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.GPU.Bytes < 8<<20 || rep.GPU.Bytes != rep.GPU.Total ||
		!rep.GPU.Finished || rep.GPU.GBPerS <= 0 || rep.GPU.Moved == 0 || rep.GPU.Moved > rep.GPU.Bytes {
		t.Errorf("gpucr checkpoint --json: GPU copy %+v (%v) in\n%s", rep.GPU, err, out)
	}
	if !rep.GPUState || len(rep.GPUProcesses) != 1 || rep.GPUProcesses[0].Pid != a.pid || rep.GPUProcesses[0].State != "checkpointed" {
		t.Errorf("gpucr checkpoint --json: gpu_state %v, gpu_processes %v; want true, [%d]", rep.GPUState, rep.GPUProcesses, a.pid)
	}
	// CRIU's own account: the tree was frozen, its memory written.
	if c := rep.CRIU; c == nil || c.FrozenSeconds <= 0 || c.PagesWritten == 0 || c.MemwriteSeconds > c.FrozenSeconds {
		t.Errorf("gpucr checkpoint --json: CRIU's statistics %+v", rep.CRIU)
	}
	a.reap(30 * time.Second)
	before := a.lastIter()
	out, err = runErr(2*time.Minute, cliEnv, binPath(t, "gpucr"), "restore", "-D", img)
	if err != nil || !strings.Contains(out, "pid "+strconv.Itoa(a.pid)+" running again") {
		t.Fatalf("gpucr restore: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`GPU data: [0-9.]+ MiB in [0-9.]+ s \([0-9.]+ GB/s\)\n`).MatchString(out) {
		t.Errorf("gpucr restore does not report the GPU load:\n%s", out)
	}
	if !regexp.MustCompile(`ready: first instruction [0-9.]+ s, GPU launches [0-9.]+ s, all GPU data resident [0-9.]+ s\n  CRIU: forking [0-9.]+ s, restoring the tasks [0-9.]+ s, [1-9][0-9]* pages restored\n  pid [0-9]+ in the helper: restore-check [0-9.]+ s, driver-restore [0-9.]+ s, reimport [0-9.]+ s, resume [0-9.]+ s`).MatchString(out) {
		t.Errorf("gpucr restore does not say when the tree could run, launch and had its data, CRIU's part, or the helper's:\n%s", out)
	}
	a.waitIter(before+20, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "ptrchase", []string{"--mib", "8"}, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, before)
}

// TestCLILazyRestore: gpucr restore --lazy-pages runs the restored tree
// before its host memory is read back (CRIU's lazy-pages daemon, through
// userfaultfd); the command returns once every page is in, says when, and
// the process computes on exactly as an uninterrupted run, GPU memory
// included.
func TestCLILazyRestore(t *testing.T) {
	criu := needTool(t, "criu")
	// The kernel must let CRIU handle the tree's page faults (userfaultfd);
	// a kernel that does not is a skip, saying so, as gpucr check warns.
	if out, err := runErr(time.Minute, nil, criu, "--no-default-config", "check", "--feature", "uffd-noncoop"); err != nil {
		t.Skipf("this kernel does not let CRIU restore lazily (criu check --feature uffd-noncoop: %v):\n%s", err, out)
	}
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	args := []string{"--mib", "16", "--workers", "2"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "20")...)
	a.waitIter(15, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	before := a.lastIter()
	// Whatever this host's userfaultfd round trip (a loaded CI machine's
	// may be slow), the lazy restore is what is tested here.
	lazyEnv := append(append([]string{}, env...), "GPUCR_LAZY_FAULT_LIMIT_US=1000000")
	if r := lazyRestore(t, h, lazyEnv, img, a.pid); r.GPUResident <= 0 {
		t.Errorf("gpucr restore --lazy-pages: ready %+v; want the GPU memory's time", r)
	}
	a.waitIter(before+20, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, before)
}

// lazyRestore runs gpucr restore --lazy-pages --json of img in env and
// checks what lazy pages promise: the restored pid, the tree running before
// its host memory was all in, and the lazy-pages daemon's log saying it
// transferred pages. It returns the report's times.
func lazyRestore(t *testing.T, h *helperProc, env []string, img string, pid int) checkpoint.RestoreReady {
	t.Helper()
	out := cliOK(t, h, env, img, "restore", "-D", img, "--lazy-pages", "--json")
	var rep struct {
		Pid   int                     `json:"pid"`
		Ready checkpoint.RestoreReady `json:"ready"`
	}
	if i := strings.LastIndex(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Pid != pid {
		t.Fatalf("gpucr restore --lazy-pages --json: %v\n%s", err, out)
	}
	if r := rep.Ready; r.FirstInstruction <= 0 || r.HostResident < r.FirstInstruction {
		t.Errorf("gpucr restore --lazy-pages: ready %+v; want the host memory in after the first instruction", r)
	}
	if b, err := os.ReadFile(filepath.Join(img, "lazy-pages.log")); err != nil || !strings.Contains(string(b), "UFFD transferred pages") {
		t.Errorf("the lazy-pages daemon's log does not say it transferred the pages (%v):\n%s", err, tail(string(b), 10))
	}
	return rep.Ready
}

// TestLazyRestoreRefusedWhereItLoses: where a page fault served through
// userfaultfd is slower than GPUCR_LAZY_FAULT_LIMIT_US (the driver's
// restore would wait seconds for its parked state), gpucr restore
// --lazy-pages of a GPU process is refused before CRIU runs, naming the
// cost it measured; the image stays, and restores without it.
func TestLazyRestoreRefusedWhereItLoses(t *testing.T) {
	criu := needTool(t, "criu")
	if out, err := runErr(time.Minute, nil, criu, "--no-default-config", "check", "--feature", "uffd-noncoop"); err != nil {
		t.Skipf("this kernel does not let CRIU restore lazily (criu check --feature uffd-noncoop: %v):\n%s", err, out)
	}
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	args := []string{"--mib", "8"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "20")...)
	a.waitIter(5, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	out, err := cli(t, h, append(append([]string{}, env...), "GPUCR_LAZY_FAULT_LIMIT_US=0.001"), "restore", "-D", img, "--lazy-pages")
	if err == nil || !regexp.MustCompile(`a page fault served through userfaultfd takes [0-9.]+ us on this host`).MatchString(out) ||
		!strings.Contains(out, "restore without --lazy-pages") {
		t.Fatalf("a lazy restore where faults are slow: %v, want a refusal naming the cost:\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(img, "restore.log")); err == nil {
		t.Error("CRIU ran (restore.log is there)")
	}
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+5, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, maxIter(a.heartbeats())))
}

// damageChunk flips one bit in the middle of a chunk file of the GPU image
// in img; it returns the file and its damaged bytes.
func damageChunk(t *testing.T, img string) (string, []byte) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(img, "gpucr", "chunks", "*", "*"))
	if len(files) == 0 {
		t.Fatal("no chunk files in the GPU image")
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(files[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	return files[0], b
}

// TestCLIRestoreDamagedLeavesNoProcess: gpucr restore of an image with a
// damaged GPU chunk fails naming the damage, and once the command has
// returned the process's pid is free: CRIU killed the tree it had forked
// (before it ran), and gpucr, the tree's parent, reaped it instead of
// leaving a zombie to the init process, which may reap it late.
func TestCLIRestoreDamagedLeavesNoProcess(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	damageChunk(t, img)
	out, err := cli(t, h, env, "restore", "-D", img)
	if err == nil || !strings.Contains(out, "corrupt") || !strings.Contains(out, "before the restored processes run") {
		t.Fatalf("gpucr restore of a damaged image: %v\n%s", err, out)
	}
	if st := procState(a.pid); st != "" {
		t.Errorf("pid %d exists (state %s) when the failed restore has returned", a.pid, st)
	}
	waitNoClients(t, h, 10*time.Second)
}

// TestPluginTwoRestoresAndDamage: one image restores twice (the first
// restored process is killed in between); a damaged GPU chunk, found while
// the image loads alongside CRIU's restore, makes the restore fail naming
// the damage at POST_FORKING, before any restored task runs, and no
// restored process survives; a truncated chunk file is refused before CRIU
// restores anything.
func TestPluginTwoRestoresAndDamage(t *testing.T) {
	rig := newCriuRig(t)
	criu, dir, env, h, criuEnv, libdir, img := rig.criu, rig.dir, rig.env, rig.h, rig.criuEnv, rig.libdir, rig.img
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(15, time.Minute)
	criuOK(t, criu, criuEnv, img, "dump.log", "dump", "-t", strconv.Itoa(a.pid), "--libdir", libdir)
	a.reap(30 * time.Second)
	before := a.lastIter()
	ref := reference(t, env, "heartbeat", []string{"--mib", "16"}, before+60)
	for round := 1; round <= 2; round++ {
		criuOK(t, criu, criuEnv, img, "restore.log", "restore", "-d", "--libdir", libdir)
		a.waitIter(before+20*round, time.Minute)
		_ = syscall.Kill(a.pid, syscall.SIGKILL)
		waitPidFree(a.pid, 10*time.Second)
		waitNoClients(t, h, 10*time.Second)
	}
	compareWithReference(t, a.heartbeats(), ref)

	// Damage one chunk file of the GPU image.
	file, b := damageChunk(t, img)
	out, err := runErr(2*time.Minute, criuEnv, criu, "restore", "-D", img, "-d", "--libdir", libdir, "-o", "restore.log", "-v4")
	if err == nil {
		t.Fatalf("criu restore of a damaged image succeeded:\n%s", out)
	}
	log, _ := os.ReadFile(filepath.Join(img, "restore.log"))
	if !strings.Contains(string(log), "Forking task") { // what the truncated case below must not see
		t.Errorf("CRIU's log of a restore that forked lacks \"Forking task\":\n%s", tail(string(log), 20))
	}
	if all := string(log) + out; !strings.Contains(all, "gpucr_plugin") || !strings.Contains(all, "corrupt") {
		t.Errorf("the restore failure does not name the damage:\n%s\n%s", out, tail(string(log), 20))
	}
	// The damage stops the restore at POST_FORKING, while CRIU can still
	// kill the tasks it forked before any of them runs: it never reaches
	// the late hook, which comes once the tasks are restored.
	if strings.Contains(string(log), "Run late stage hook") || !strings.Contains(string(log)+out, "before the restored processes run") {
		t.Errorf("the damaged GPU image did not stop the restore at POST_FORKING:\n%s\n%s", out, tail(string(log), 30))
	}
	waitPidFree(a.pid, 10*time.Second)
	if st := procState(a.pid); st != "" {
		t.Errorf("pid %d exists (state %s) after a failed restore", a.pid, st)
	}
	waitNoClients(t, h, 10*time.Second)

	// Truncated: refused by the helper's check before CRIU forks anything.
	if err := os.WriteFile(file, b[:len(b)-1], 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = runErr(2*time.Minute, criuEnv, criu, "restore", "-D", img, "-d", "--libdir", libdir, "-o", "restore.log", "-v4")
	log, _ = os.ReadFile(filepath.Join(img, "restore.log"))
	if err == nil || !strings.Contains(out, "restore refused") || !strings.Contains(out, "truncated") {
		t.Fatalf("criu restore with a truncated chunk file: %v\n%s", err, out)
	}
	if strings.Contains(string(log), "Forking task") {
		t.Errorf("CRIU forked tasks although the GPU image was refused at init:\n%s", tail(string(log), 20))
	}
	if st := procState(a.pid); st != "" {
		t.Errorf("pid %d exists (state %s) after a refused restore", a.pid, st)
	}
	waitNoClients(t, h, 10*time.Second)

	// A GPU image whose dump never committed it (no manifest) is refused too.
	if err := os.Remove(filepath.Join(img, "gpucr", "manifest.pb")); err != nil {
		t.Fatal(err)
	}
	out, err = runErr(2*time.Minute, criuEnv, criu, "restore", "-D", img, "-d", "--libdir", libdir, "-o", "restore.log")
	if err == nil || !strings.Contains(out, "incomplete") {
		t.Fatalf("criu restore of an uncommitted GPU image: %v\n%s", err, out)
	}
	if procState(a.pid) != "" {
		t.Errorf("pid %d exists after a refused restore", a.pid)
	}
}

// TestPluginCRIUKilledMidDump: CRIU dies after the plugin saved the GPU
// state and detached the process (here: SIGKILL while a post-dump action
// script holds CRIU). The helper sees the plugin's connection close without
// a report, gives the live process its GPU back, and it computes on exactly.
func TestPluginCRIUKilledMidDump(t *testing.T) {
	rig := newCriuRig(t)
	criu, dir, env, h, criuEnv, libdir, img := rig.criu, rig.dir, rig.env, rig.h, rig.criuEnv, rig.libdir, rig.img
	marker := filepath.Join(dir, "post-dump")
	script := filepath.Join(dir, "hold.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\ntouch "+marker+"\nsleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20", "--iters", "300")
	a.waitIter(15, time.Minute)
	cmd := exec.Command(criu, "dump", "-t", strconv.Itoa(a.pid), "-D", img, "--libdir", libdir,
		"--action-script", script, "-o", "dump.log")
	cmd.Env = criuEnv
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			b, _ := os.ReadFile(filepath.Join(img, "dump.log"))
			t.Fatalf("the dump never reached post-dump:\n%s", tail(string(b), 30))
		}
		time.Sleep(10 * time.Millisecond)
	}
	stalled := a.lastIter()
	listed := false
	for _, c := range h.status().Clients {
		if p, _ := c.Pid.Int64(); int(p) == a.pid && len(c.NotCheckpointable) > 0 && strings.Contains(c.NotCheckpointable[0], "detached") {
			listed = true
		}
	}
	if !listed {
		t.Errorf("gpucr status does not list pid %d as detached while its dump runs", a.pid)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // CRIU and its action script
	_ = cmd.Wait()
	runsAgainWithin(t, a, time.Now(), a.lastIter(), time.Second)
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("heartbeat after CRIU died: exit %d:\n%s", code, tail(a.output(), 10))
	}
	if a.lastIter() <= stalled {
		t.Fatalf("no progress after CRIU died (stuck at %d)", stalled)
	}
	if b, _ := os.ReadFile(h.log); !strings.Contains(string(b), "without a report") {
		t.Errorf("the helper log does not show the recovery of an unfinished dump:\n%s", tail(string(b), 20))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", []string{"--mib", "16"}, 300))
}

// startTree starts a process tree under one gpucr run, in its own session:
// a shell whose two children are GPU processes, heartbeat and ptrchase
// (--mib 8, and args), each writing its own log; it returns once both have
// reached iteration 15.
func startTree(t *testing.T, dir string, h *helperProc, env []string, args string) (root *exec.Cmd, hb, pc *app) {
	t.Helper()
	hb = &app{t: t, name: "heartbeat", log: filepath.Join(dir, "heartbeat.log")}
	pc = &app{t: t, name: "ptrchase", log: filepath.Join(dir, "ptrchase.log")}
	script := binPath(t, "heartbeat") + " --mib 8 " + args + " >>" + hb.log + " 2>&1 & " +
		binPath(t, "ptrchase") + " --mib 8 " + args + " >>" + pc.log + " 2>&1 & wait"
	root = exec.Command(binPath(t, "gpucr"), "run", "--socket", h.socket, "--", "/bin/sh", "-c", script)
	root.Env = env
	root.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	root.Stdin, root.Stdout, root.Stderr = devnull, devnull, devnull
	if err := root.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range []int{hb.pid, pc.pid, root.Process.Pid} {
			if p > 0 {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		_, _ = root.Process.Wait()
	})
	for _, a := range []*app{hb, pc} {
		a.waitFor(30*time.Second, "ready", func(out string, _ []heartbeat) bool {
			p, _ := parseHeartbeats(out)
			a.pid = p
			return p > 0
		})
		a.waitIter(15, time.Minute)
	}
	return root, hb, pc
}

// TestPluginProcessTree: a process tree with two GPU processes (a shell and
// its two children, heartbeat and ptrchase, all under gpucr run) dumps into
// one image holding both processes' GPU memory and restores as a whole.
func TestPluginProcessTree(t *testing.T) {
	rig := newCriuRig(t)
	criu, dir, env, h, criuEnv, libdir, img := rig.criu, rig.dir, rig.env, rig.h, rig.criuEnv, rig.libdir, rig.img
	root, hb, pc := startTree(t, dir, h, env, "--interval-ms 20")
	criuOK(t, criu, criuEnv, img, "dump.log", "dump", "-t", strconv.Itoa(root.Process.Pid), "--libdir", libdir)
	_, _ = root.Process.Wait()
	befores := map[*app]int{hb: hb.lastIter(), pc: pc.lastIter()}
	out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "inspect", img)
	for _, a := range []*app{hb, pc} {
		if !strings.Contains(out, "process "+strconv.Itoa(a.pid)) {
			t.Fatalf("the GPU image lacks process %d (%s):\n%s", a.pid, a.name, out)
		}
		waitPidFree(a.pid, 10*time.Second)
	}
	waitPidFree(root.Process.Pid, 10*time.Second)
	criuOK(t, criu, criuEnv, img, "restore.log", "restore", "-d", "--libdir", libdir)
	for _, a := range []*app{hb, pc} {
		a.waitIter(befores[a]+20, time.Minute)
		_ = syscall.Kill(a.pid, syscall.SIGKILL)
		hbs := a.heartbeats()
		compareWithReference(t, hbs, reference(t, env, a.name, []string{"--mib", "8"}, hbs[len(hbs)-1].Iter))
		checkContinuous(t, hbs, befores[a])
	}
}

// TestPluginFailureAfterDetach: the driver's lock or checkpoint fails after
// the process was already quiesced, copied, dropped and detached (injected
// with GPUCR_FAULT): the dump fails, and the process gets everything back
// and computes on exactly.
func TestPluginFailureAfterDetach(t *testing.T) {
	for _, fault := range []string{"driver-lock", "driver-checkpoint"} {
		t.Run(fault, func(t *testing.T) {
			rig := newCriuRig(t, "GPUCR_FAULT="+fault)
			criu, dir, env, h, criuEnv, img := rig.criu, rig.dir, rig.env, rig.h, rig.criuEnv, rig.img
			a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20", "--iters", "200")
			a.waitIter(15, time.Minute)
			out, err := runErr(2*time.Minute, criuEnv, criu, "dump", "-t", strconv.Itoa(a.pid), "-D", img,
				"--libdir", pluginDir(t), "-o", "dump.log")
			if err == nil || !strings.Contains(out, "injected fault") {
				t.Fatalf("criu dump with a failing %s: %v\n%s", fault, err, out)
			}
			if code := a.wait(time.Minute); code != 0 {
				t.Fatalf("exit %d after the failed dump:\n%s", code, tail(a.output(), 10))
			}
			compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", []string{"--mib", "16"}, 200))
		})
	}
}

// TestRestoreRefusedOnSmallGPU: the image holds more GPU memory than the
// GPU (here: the restarted helper's simulated device) has; the restore is
// refused, naming that, before CRIU forks anything, and the helper holds
// nothing afterwards.
func TestRestoreRefusedOnSmallGPU(t *testing.T) {
	rig := newCriuRig(t)
	criu, dir, env, h, criuEnv, libdir, img := rig.criu, rig.dir, rig.env, rig.h, rig.criuEnv, rig.libdir, rig.img
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "64", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	criuOK(t, criu, criuEnv, img, "dump.log", "dump", "-t", strconv.Itoa(a.pid), "--libdir", libdir)
	a.reap(30 * time.Second)
	h.stop()
	small := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_SIM_MEM_MIB=32"))
	out, err := runErr(2*time.Minute, criuEnv, criu, "restore", "-D", img, "-d", "--libdir", libdir, "-o", "restore.log", "-v4")
	log, _ := os.ReadFile(filepath.Join(img, "restore.log"))
	if err == nil || !strings.Contains(out, "restore refused") || !strings.Contains(out, "ERROR_OUT_OF_MEMORY") {
		t.Fatalf("criu restore onto a GPU too small for the image: %v\n%s", err, out)
	}
	if strings.Contains(string(log), "Forking task") {
		t.Errorf("CRIU forked tasks although the GPU image was refused at init:\n%s", tail(string(log), 20))
	}
	if st := procState(a.pid); st != "" {
		t.Errorf("pid %d exists (state %s) after a refused restore", a.pid, st)
	}
	waitNoClients(t, small, 10*time.Second)
}

// TestPluginClientWithoutMemory: a process that initialized the driver (so a
// gpucr client, with a context the driver checkpoints) but holds no device
// memory is dumped and restored like the others: the image records it
// although it has no buffer, and it comes back and runs on.
func TestPluginClientWithoutMemory(t *testing.T) {
	rig := newCriuRig(t)
	py := needTool(t, "python3")
	script := `import ctypes, os, time
lib = ctypes.CDLL(os.environ["GPUCR_LIBCUDA"])
assert lib.cuInit(0) == 0
print("ready pid=%d" % os.getpid(), flush=True)
i = 0
while True:
    print("hb %d %d" % (i, 7 * i), flush=True)
    i += 1
    time.sleep(0.02)
`
	a := startUnderArgv(t, rig.dir, rig.h, rig.env, "nomem", []string{py, "-c", script})
	a.waitIter(10, time.Minute)
	if _, _, ok := rig.h.client(a.pid); !ok {
		t.Fatalf("pid %d (cuInit only) is no client of the helper", a.pid)
	}
	criuOK(t, rig.criu, rig.criuEnv, rig.img, "dump.log", "dump", "-t", strconv.Itoa(a.pid), "--libdir", rig.libdir)
	a.reap(30 * time.Second)
	before := a.lastIter()
	criuOK(t, rig.criu, rig.criuEnv, rig.img, "restore.log", "restore", "-d", "--libdir", rig.libdir)
	a.waitIter(before+20, 30*time.Second)
	checkContinuous(t, a.heartbeats(), before)
	if _, _, ok := rig.h.client(a.pid); !ok {
		t.Errorf("the restored process is no client of the helper again")
	}
}
