package e2e

// Served mode's cuBLAS and cuBLASLt: gpucr's libcublas.so.13 and
// libcublasLt.so.13 in the program forward to the worker, which runs the
// cuBLAS the program would have loaded (here the simulated driver's,
// build/sim/libcublas.so.13).

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testroot"
)

// TestServedBlasAttack: a second user's served program that writes cuBLAS
// records into its ring by hand (blasattack, past gpucr's libcublas.so.13,
// which checks its callers first) gets each refused as it must be: a
// library it cannot read is not loaded by its worker (which runs as that
// user), paths without their end, ids out of range or taken, and records on
// objects that do not exist are refused, and the worker serves on.
func TestServedBlasAttack(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--socket-mode", "0666", "--served-pool", "1")
	waitIdle(t, h, 1)
	lib, err := filepath.Abs(filepath.Join(buildDir(t), "sim", "libcublas.so.13"))
	if err != nil {
		t.Fatal(err)
	}
	// A real library, readable by root alone: a worker that ran as root would load it.
	secret := filepath.Join(dir, "secret-libcublas.so.13")
	data, err := os.ReadFile(lib)
	if err != nil {
		t.Fatalf("the simulated cuBLAS is not built (run `make`): %v", err)
	}
	if err := os.WriteFile(secret, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath(t, "gpucr"), "run", "--served", "--socket", h.socket, "--",
		binPath(t, "blasattack"), lib, secret)
	cmd.Env = env
	asUser(cmd, u)
	done := make(chan struct{})
	var out []byte
	go func() {
		out, err = cmd.CombinedOutput()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("blasattack still running after a minute:\n%s", out)
	}
	if err != nil || !strings.Contains(string(out), "blasattack: ok") {
		t.Fatalf("blasattack as uid %d: %v\n%s\nhelper:\n%s", u.UID, err, out, tail(h.logText(), 20))
	}
	if !strings.Contains(string(out), "probe load-secret says:") || !strings.Contains(string(out), "ermission denied") {
		t.Errorf("the worker's refusal of a library its user cannot read does not say why:\n%s", out)
	}
	if !strings.Contains(string(out), "blasattack asked for the driver's private export tables") {
		t.Errorf("the refusal of the export tables does not name the program that asked:\n%s", out)
	}
}

// TestServedWorkersLaidOutAlike: two workers of the pool have the same
// mappings below the top-down area of libraries and thread stacks (the Go
// heap, the driver's memory, the address window that device addresses come
// from): a process that moves to a new worker finds its device addresses
// free there only if every worker is laid out alike. Go 1.26 places its
// heap at random in every process: with gpucr's own served-worker (Go), one
// restore in about fifty lost a module global's address here; the pool runs
// gpucr-worker (C, no Go runtime).
func TestServedWorkersLaidOutAlike(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "2")
	waitIdle(t, h, 2)
	workers := children(h.cmd.Process.Pid) // the idle workers: status lists the assigned ones
	if len(workers) < 2 {
		t.Fatalf("the helper has child processes %v, want its 2 workers", workers)
	}
	var layouts []string
	for _, pid := range workers[:2] {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			t.Fatal(err)
		}
		var low []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			start, _, _ := strings.Cut(f[0], "-")
			if a, err := strconv.ParseUint(start, 16, 64); err == nil && a < 0x7f0000000000 {
				low = append(low, f[0]+" "+f[1])
			}
		}
		layouts = append(layouts, strings.Join(low, "\n"))
	}
	if layouts[0] != layouts[1] {
		t.Errorf("two workers are laid out differently:\n%s\n--- and ---\n%s", layouts[0], layouts[1])
	}
}

// TestServedBlasLoadedAhead: with --served-cublas, each idle worker has
// cuBLAS and cuBLASLt loaded and a cuBLAS handle made before any process
// asks (a served process's first product, or a restored one's, then waits
// for neither), and a process that names those files computes what it
// computes on the driver itself, before and after a checkpoint and restore.
func TestServedBlasLoadedAhead(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	sim, err := filepath.Abs(filepath.Join(buildDir(t), "sim"))
	if err != nil {
		t.Fatal(err)
	}
	h := startHelper(t, dir, env, "--served-pool", "1", "--served-cublas", sim)
	waitIdle(t, h, 1)
	workers := children(h.cmd.Process.Pid)
	if len(workers) < 1 {
		t.Fatalf("the helper has no worker")
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", workers[0]))
	if err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{"libcublas.so.13", "libcublasLt.so.13"} {
		if !strings.Contains(string(maps), filepath.Join(sim, lib)) {
			t.Errorf("idle worker %d has not loaded %s ahead", workers[0], lib)
		}
	}
	args := []string{"--lt-per-call", "--iters", "30", "--interval-ms", "0"}
	want := doneLine.FindStringSubmatch(run(t, time.Minute, env, binPath(t, "blasbeat"), args...))
	a := startServed(t, t.TempDir(), h, env, "blasbeat", nil, args...)
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d served:\n%s", code, tail(a.output(), 10))
	}
	got := doneLine.FindStringSubmatch(a.output())
	if want == nil || got == nil || got[2] != want[2] {
		t.Fatalf("served with cuBLAS loaded ahead: %v; on the driver: %v", got, want)
	}
	if strings.Contains(a.output(), "gpucr: ") {
		t.Errorf("warnings:\n%s", a.output())
	}

	// Checkpointed and restored: the new worker's handle is the one it made ahead.
	needTool(t, "criu")
	args = []string{"--lt-per-call", "--interval-ms", "20", "--hb-every", "1"}
	b := startServed(t, t.TempDir(), h, env, "blasbeat", nil, args...)
	b.waitIter(10, time.Minute)
	img := dir + "/img"
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(b.pid), "-D", img)
	b.reap(30 * time.Second)
	waitPidFree(b.pid, 10*time.Second)
	before := b.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	b.waitIter(before+10, time.Minute)
	b.kill()
	compareWithReference(t, b.heartbeats(), reference(t, env, "blasbeat", args, maxIter(b.heartbeats())))
}

// TestServedBlasSettings: cuBLAS reads its settings (CUBLAS*, CUBLASLT*,
// NVIDIA_TF32_OVERRIDE) from its process's environment; served, it runs in
// the worker, which gets the program's settings with the library: the
// simulated cuBLAS's API log, asked for in the program's environment, is
// written by the worker's cuBLAS. Other variables do not travel.
func TestServedBlasSettings(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	log := filepath.Join(dir, "cublas.log")
	a := startServed(t, t.TempDir(), h, env, "blasbeat", func(c *exec.Cmd) {
		c.Env = append(c.Env, "CUBLAS_LOGINFO_DBG=1", "CUBLAS_LOGDEST_DBG="+log)
	}, "--iters", "3", "--interval-ms", "0")
	w := workerOf(t, h, a.pid)
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d served:\n%s", code, tail(a.output(), 10))
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("cuBLAS's log, asked for in the program's environment, was not written: %v", err)
	}
	if want := fmt.Sprintf("cublasCreate_v2() called (pid %d)", w); !strings.Contains(string(b), want) {
		t.Errorf("cuBLAS's log does not say the worker (pid %d) made the handle:\n%s", w, b)
	}
}

// TestServedBlasFindsTheWheels: PyTorch loads the CUDA wheels' libraries by
// path (site-packages/nvidia/.../lib) before its own; the worker loads
// NVIDIA's cuBLAS from beside them, not from elsewhere on the search path.
func TestServedBlasFindsTheWheels(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	wheel := simBlasCopy(t, filepath.Join(dir, "site-packages", "nvidia", "cu13", "lib"))
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	// the wheel's cuBLASLt loaded by path, as PyTorch's __init__ loads the wheels' libraries
	a := startServed(t, t.TempDir(), h, env, "blasbeat", func(c *exec.Cmd) {
		c.Env = append(c.Env, "LD_PRELOAD="+filepath.Join(wheel, "libcublasLt.so.13"))
	}, "--iters", "100000", "--interval-ms", "20")
	workerMaps(t, h, a, filepath.Join(wheel, "libcublas.so.13"))
}

// TestServedBlasFollowsRunpath: where PyTorch's libraries find cuBLAS, by
// their run path ($ORIGIN/../../nvidia/.../lib), the worker loads it from:
// blasbeat linked here with a run path to a directory of its own, which holds
// the cuBLAS the worker must load (not the one on LD_LIBRARY_PATH).
func TestServedBlasFollowsRunpath(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatalf("no C compiler: %v", err)
	}
	dir := t.TempDir()
	env := gpucrEnv(t)
	root := testroot.Dir(t)
	sim := filepath.Join(buildDir(t), "sim")
	wheel := simBlasCopy(t, filepath.Join(dir, "wheel"))
	prog := filepath.Join(dir, "blasbeat")
	build := exec.Command(cc, "-O2", "-D_GNU_SOURCE", "-I"+filepath.Join(root, "include"), "-I"+filepath.Join(root, "tests/apps/common"),
		"-o", prog, filepath.Join(root, "tests/apps/blasbeat.c"), filepath.Join(root, "tests/apps/common/gpuapp.c"),
		filepath.Join(root, "tests/apps/common/hbptx.c"), "-L"+sim, "-l:libcublas.so.13", "-l:libcublasLt.so.13", "-lcuda",
		"-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/wheel", "-pthread")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building blasbeat with a run path: %v\n%s", err, out)
	}
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	a := startUnderRun(t, t.TempDir(), h, env, "blasbeat", []string{"--served"},
		[]string{prog, "--iters", "100000", "--interval-ms", "20"}, nil)
	workerMaps(t, h, a, filepath.Join(wheel, "libcublas.so.13"))
}

// TestServedGoWorker: with GPUCR_SERVED_WORKER=go the pool runs gpucr's own
// served-worker (the fallback where gpucr-worker is missing), says in its
// log what that costs, and a served program computes exactly on it.
func TestServedGoWorker(t *testing.T) {
	dir := t.TempDir()
	env := append(gpucrEnv(t), "GPUCR_SERVED_WORKER=go")
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	workers := children(h.cmd.Process.Pid)
	if len(workers) < 1 {
		t.Fatal("the helper has no worker")
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", workers[0]))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cmdline), "gpucr-worker") || !strings.Contains(string(cmdline), "served-worker") {
		t.Errorf("worker %d runs %q, want gpucr's served-worker", workers[0], strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	if !strings.Contains(h.logText(), "no gpucr-worker beside gpucr") {
		t.Errorf("the helper's log does not say it runs the Go worker:\n%s", tail(h.logText(), 10))
	}
	args := []string{"--lt-per-call", "--iters", "20", "--interval-ms", "0"}
	want := doneLine.FindStringSubmatch(run(t, time.Minute, env, binPath(t, "blasbeat"), args...))
	a := startServed(t, t.TempDir(), h, env, "blasbeat", nil, args...)
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d served:\n%s", code, tail(a.output(), 10))
	}
	if got := doneLine.FindStringSubmatch(a.output()); want == nil || got == nil || got[2] != want[2] {
		t.Fatalf("served on the Go worker: %v; on the driver: %v", got, want)
	}
}

// simBlasCopy copies the simulated cuBLAS and cuBLASLt into dir (made), as a
// CUDA wheel's directory holds NVIDIA's, and returns dir.
func simBlasCopy(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{"libcublas.so.13", "libcublasLt.so.13"} {
		b, err := os.ReadFile(filepath.Join(buildDir(t), "sim", lib))
		if err != nil {
			t.Fatalf("the simulated cuBLAS is not built (run `make`): %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, lib), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// workerMaps checks that the worker serving a, once it ran a few
// iterations, has lib mapped (the cuBLAS it loaded), and ends a.
func workerMaps(t *testing.T, h *helperProc, a *app, lib string) {
	t.Helper()
	a.waitIter(3, 30*time.Second)
	w := workerOf(t, h, a.pid)
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", w))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(maps), lib) {
		t.Errorf("worker %d did not load %s:\n%s", w, lib, maps)
	}
	a.kill()
}

// TestServedBlasExports: gpucr's libcublas.so.13 defines, under cuBLAS's
// version node, every function of testdata/cublas-torch-linalg.txt: what
// PyTorch's libtorch_cuda_linalg.so imports from cuBLAS beyond what it
// defined before. A library that imports a function its cuBLAS lacks does
// not load (bound now) or ends its process at the first call (bound
// lazily); served mode forwards each of them or refuses it at the call.
func TestServedBlasExports(t *testing.T) {
	names := readNames(t, filepath.Join(testroot.Dir(t), "tests", "e2e", "testdata", "cublas-torch-linalg.txt"))
	if len(names) != 108 {
		t.Fatalf("testdata/cublas-torch-linalg.txt lists %d functions, want the 108 found missing", len(names))
	}
	lib := filepath.Join(buildDir(t), "lib", "served", "libcublas.so.13")
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatalf("served mode's cuBLAS is not built (run `make`): %v", err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	version := map[string]string{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC && elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			version[s.Name] = s.Version
		}
	}
	for _, n := range names {
		v, ok := version[n]
		switch {
		case !ok:
			t.Errorf("%s does not define %s", lib, n)
		case v != "libcublas.so.13":
			t.Errorf("%s defines %s under version %q, want libcublas.so.13 (NVIDIA's node)", lib, n, v)
		}
	}
}

// readNames is a file's lines, without blank ones and # comments.
func readNames(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			names = append(names, line)
		}
	}
	return names
}

// TestServedBlasLevels: cuBLAS's level-1, 2 and 3 functions and its copies,
// served (blaslevels). The worker's cuBLAS is the simulated one with five of
// them added (testdata/blasextra.c, built here: the simulated cuBLAS has
// none of them), so what gpucr's libcublas.so.13 sends for axpy, nrm2,
// amax, rotg and ger must reach a cuBLAS as the program called it, host and
// device scalars alike, and results written to host memory must come back;
// the copies between host and device memory, strided on either side, go
// through served mode's driver; a complex function, which served mode
// refuses, fails with CUBLAS_STATUS_NOT_SUPPORTED and one line that names
// it, once however often it is called; a function the worker's cuBLAS lacks
// (cublasSnrm2) fails at the call with CUBLAS_STATUS_NOT_SUPPORTED; and
// arguments that cuBLAS's documentation calls invalid, which nobody measured
// NVIDIA's refuse, are not refused by gpucr's library but answered at the
// call by the worker's (blasextra's cublasDger computes an increment of 0 as
// a step of 0 and refuses a leading dimension below the rows).
func TestServedBlasLevels(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatalf("no C compiler: %v", err)
	}
	dir := t.TempDir()
	root := testroot.Dir(t)
	sim, err := filepath.Abs(filepath.Join(buildDir(t), "sim"))
	if err != nil {
		t.Fatal(err)
	}
	extra := filepath.Join(dir, "libblasextra.so")
	build := exec.Command(cc, "-O2", "-shared", "-fPIC", "-I"+filepath.Join(root, "include"), "-o", extra,
		filepath.Join(root, "tests", "e2e", "testdata", "blasextra.c"), "-L"+sim, "-l:libcublas.so.13", "-lcuda", "-lm",
		"-Wl,-soname,libblasextra.so", "-Wl,-rpath,"+sim, "-Wl,--no-undefined")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building blasextra: %v\n%s", err, out)
	}
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	checks := []string{"Daxpy", "Dnrm2", "Idamax", "Drotg", "Dger", "copies", "refused", "missing", "probes"}
	out, err := runErr(time.Minute, append(env, "GPUCR_CUBLAS_PATH="+extra), binPath(t, "gpucr"),
		append([]string{"run", "--served", "--socket", h.socket, "--", binPath(t, "blaslevels")}, checks...)...)
	ok := map[string]bool{}
	refusals := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "ok "):
			ok[strings.TrimPrefix(line, "ok ")] = true
		case strings.HasPrefix(line, "FAIL "):
			t.Error(line)
		case strings.HasPrefix(line, "gpucr: "):
			fn, found := strings.CutPrefix(line, "gpucr: served mode: cuBLAS's ")
			fn, _, found2 := strings.Cut(fn, " is not forwarded to the worker yet (CUBLAS_STATUS_NOT_SUPPORTED)")
			if !found || !found2 {
				t.Errorf("a line from gpucr that is no refusal: %s", line)
			}
			refusals[fn]++
		}
	}
	if err != nil {
		t.Fatalf("blaslevels served: %v\n%s\nhelper:\n%s", err, tail(out, 40), tail(h.logText(), 20))
	}
	for _, fn := range []string{"Daxpy", "Dnrm2", "Idamax", "Drotg", "Dger"} {
		for _, mode := range []string{"host", "device"} {
			if !ok[fn+"/"+mode] {
				t.Errorf("blaslevels reported no ok for %s/%s:\n%s", fn, mode, tail(out, 40))
			}
		}
	}
	for _, c := range []string{"setmatrix-5x4-6-8", "getmatrix-3x5-5000-3", "setvector-1x9-1-3000", "getvector-1x9-3000-1",
		"Caxpy-again", "ZgemmBatched", "Snrm2-missing", "Dger-incx-zero/host", "Dger-lda-short", "Dger-lda-short-untouched"} {
		if !ok[c] {
			t.Errorf("blaslevels reported no ok for %s:\n%s", c, tail(out, 40))
		}
	}
	for _, fn := range []string{"cublasCaxpy_v2", "cublasScnrm2_v2", "cublasZgemmBatched"} {
		if refusals[fn] != 1 {
			t.Errorf("%s, called twice, was refused in %d lines, want 1:\n%s", fn, refusals[fn], tail(out, 40))
		}
	}
}

// TestServedBlasConformance runs blastest served: gpucr's libcublas.so.13
// and libcublasLt.so.13 in the program, the simulated cuBLAS (which answers
// as NVIDIA's cuBLAS 13 does, tests/sim/blas) in the worker. Every case must
// pass as it passes on the simulated cuBLAS itself (TestBlasConformance):
// the products bit for bit, and each argument error with the status
// NVIDIA's gives at the call, whether the program's side answers it, checks
// it first or sends it for the worker's library to answer. blastest
// --served leaves out the few calls that served mode sends asynchronously
// and whose refusal therefore comes back at the next synchronizing call (a
// launch that fails, types or an algorithm the simulation does not
// compute). Each case is a subtest.
func TestServedBlasConformance(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	out, err := runErr(5*time.Minute, env, binPath(t, "gpucr"), "run", "--served", "--socket", h.socket, "--",
		binPath(t, "blastest"), "--served")
	cases := checkerCases(t, out)
	if err != nil {
		t.Errorf("blastest served: %v\n%s\nhelper:\n%s", err, tail(out, 60), tail(h.logText(), 20))
	}
	if cases < 30 {
		t.Errorf("blastest served reported only %d cases:\n%s", cases, tail(out, 40))
	}
}
