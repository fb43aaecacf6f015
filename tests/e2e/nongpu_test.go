package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPluginHarmlessForNonGPUDumps: `make install` puts the plugin where
// every CRIU run on the host loads it. A process that is no GPU process is
// dumped and restored with the plugin loaded exactly as without it: with no
// helper on the host, and with a helper that does not know the process;
// the restored process runs on, and no GPU image is written. The plugin's
// cost per dump is logged (the median of three dumps with and without it).
func TestPluginHarmlessForNonGPUDumps(t *testing.T) {
	criu := needTool(t, "criu")
	dir := t.TempDir()
	libdir := pluginDir(t)
	env := gpucrEnv(t)
	marks := filepath.Join(dir, "marks")
	// one process, no children: a shell's sleeps would linger as zombies
	// holding its session after each dump
	py := needTool(t, "python3")
	loop := "import sys, time\ni = 0\nwhile True:\n    i += 1\n    open(sys.argv[1], 'a').write('%d\\n' % i)\n    time.sleep(0.02)\n"
	last := func() int {
		b, _ := os.ReadFile(marks)
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0
		}
		n, _ := strconv.Atoi(f[len(f)-1])
		return n
	}
	waitPast := func(n int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for last() <= n {
			if time.Now().After(deadline) {
				t.Fatalf("the loop does not go past %d", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// dumpRestore dumps the loop (with the plugin or not) under env, checks
	// it stopped, restores it and checks it goes on; it returns the dump's
	// time.
	dumpRestore := func(t *testing.T, criuEnv []string, pid int, plugin bool) (int, time.Duration) {
		t.Helper()
		img := t.TempDir()
		args := []string{"dump", "-t", strconv.Itoa(pid)}
		if plugin {
			args = append(args, "--libdir", libdir)
		}
		t0 := time.Now()
		criuOK(t, criu, criuEnv, img, "dump.log", append(args, "-v4")...)
		took := time.Since(t0)
		waitPidFree(pid, 10*time.Second)
		if _, err := os.Stat(filepath.Join(img, "gpucr")); err == nil {
			t.Errorf("a GPU image was written for a process that has no GPU")
		}
		if plugin {
			if b, _ := os.ReadFile(filepath.Join(img, "dump.log")); !strings.Contains(string(b), `Plugin "gpucr"`) {
				t.Errorf("CRIU did not load the plugin:\n%s", tail(string(b), 10))
			}
		}
		at := last()
		rargs := []string{"restore", "-d", "--pidfile", filepath.Join(img, "pid")}
		if plugin {
			rargs = append(rargs, "--libdir", libdir)
		}
		criuOK(t, criu, criuEnv, img, "restore.log", rargs...)
		waitPast(at + 3)
		b, _ := os.ReadFile(filepath.Join(img, "pid"))
		np, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return np, took
	}
	p := startReaped(t, py, "-c", loop, marks)
	waitPast(3)
	pid := p.Process.Pid
	plain := noHelperEnv(dir)
	t.Run("no helper", func(t *testing.T) { pid, _ = dumpRestore(t, plain, pid, true) })
	h := startHelper(t, dir, env)
	withHelper := []string{"PATH=" + os.Getenv("PATH"), "GPUCR_SOCKET=" + h.socket}
	t.Run("helper that does not know it", func(t *testing.T) { pid, _ = dumpRestore(t, withHelper, pid, true) })
	var with, without []time.Duration
	for i := 0; i < 3; i++ {
		var d time.Duration
		pid, d = dumpRestore(t, withHelper, pid, true)
		with = append(with, d)
		pid, d = dumpRestore(t, withHelper, pid, false)
		without = append(without, d)
	}
	slices.Sort(with)
	slices.Sort(without)
	t.Logf("criu dump of a python loop: median of 3 %v with gpucr's plugin loaded (a helper running), %v without", with[1], without[1])
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// TestCheckpointRefusesUnknownGPUProcess: a GPU process gpucr does not know
// (started without `gpucr run`), or any GPU process while no helper runs,
// is refused before anything is paused, with what to do instead of CRIU's
// word on file types; the process runs on.
func TestCheckpointRefusesUnknownGPUProcess(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)

	plain := exec.Command(binPath(t, "heartbeat"), "--mib", "8", "--interval-ms", "20")
	plain.Env = env
	plain.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	log, err := os.Create(filepath.Join(dir, "plain.log"))
	if err != nil {
		t.Fatal(err)
	}
	plain.Stdout, plain.Stderr = log, log
	if err := plain.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Process.Kill(); _ = plain.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for b, _ := os.ReadFile(log.Name()); !strings.Contains(string(b), "hb "); b, _ = os.ReadFile(log.Name()) {
		if time.Now().After(deadline) {
			t.Fatalf("heartbeat on the simulated driver does not start:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(plain.Process.Pid), "-D", filepath.Join(dir, "img1"))
	if err == nil || !strings.Contains(out, "use the GPU without gpucr") || !strings.Contains(out, "gpucr run -- PROGRAM") ||
		strings.Contains(out, "of that type") {
		t.Errorf("checkpoint of a GPU process not under gpucr run: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	if procState(plain.Process.Pid) == "" {
		t.Fatal("the process did not survive the refusal")
	}

	// A client of a helper that has gone away.
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "8", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	h.stop()
	out, err = cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", filepath.Join(dir, "img2"))
	if err == nil || !strings.Contains(out, "no gpucr helper answers") || !strings.Contains(out, "start it") {
		t.Errorf("checkpoint while the helper is down: %v\n%s", err, out)
	}
	at := a.lastIter()
	a.waitIter(at+5, time.Minute)
}

// noHelperEnv is a plain environment whose helper socket (in dir) nothing
// listens on: gpucr runs CRIU for a tree with no GPU client.
func noHelperEnv(dir string) []string {
	return []string{"PATH=" + os.Getenv("PATH"), "GPUCR_SOCKET=" + filepath.Join(dir, "no-helper.sock")}
}

// startPyTree writes src into dir as name and starts it with python3 and
// args (startReaped); its whole session is killed when the test ends. It
// returns the root's pid.
func startPyTree(t *testing.T, dir, name, src string, args ...string) int {
	t.Helper()
	py := needTool(t, "python3")
	script := filepath.Join(dir, name)
	if err := os.WriteFile(script, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	root := startReaped(t, append([]string{py, script}, args...)...).Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-root, syscall.SIGKILL) })
	return root
}

// startReaped starts argv in its own session, stdio on /dev/null, and reaps
// it as soon as it exits (a dump ends it: its pid must be free for the
// restore); it is killed when the test ends.
func startReaped(t *testing.T, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd
}
