package e2e

// `gpucr checkpoint`, `gpucr restore` and `gpucr check` telling the truth:
// CRIU's real failure and the plugin's messages, checks before CRIU starts,
// the deadline on CRIU, the plugin found from the real binary, the host
// check.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gpucrRun runs build/bin/gpucr ARGS with env and returns its combined
// output and exit code (-1: it did not run or was killed).
// checkJSON is what `gpucr check --json` prints.
type checkJSON struct {
	OK    bool `json:"ok"`
	Items []struct {
		Name   string         `json:"name"`
		Status string         `json:"status"`
		Reason string         `json:"reason"`
		Info   map[string]any `json:"info"`
	} `json:"items"`
}

func gpucrRun(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	return exitCode(runErr(2*time.Minute, env, binPath(t, "gpucr"), args...))
}

func exitCode(out string, err error) (string, int) {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out, 0
	case errors.As(err, &ee) && ee.Exited():
		return out, ee.ExitCode()
	}
	return out + "\n" + err.Error(), -1
}

// lastJSON decodes the last line of out that starts a JSON object (the
// notifier's phase lines come before it in text mode only).
func lastJSON(t *testing.T, out string, v any) {
	t.Helper()
	if i := strings.LastIndex(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("not JSON (%v):\n%s", err, out)
	}
}

// startSetsid starts argv in its own session, stdio on /dev/null, and
// returns it; it is killed when the test ends.
func startSetsid(t *testing.T, setsid bool, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	if setsid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// TestCLICheck: `gpucr check` passes on this host with a helper on the
// simulated driver: CRIU dumped and restored with the plugin loaded, and
// the driver is the one the helper loaded, though the check itself runs
// without the driver in its environment.
func TestCLICheck(t *testing.T) {
	rig := newCriuRig(t)
	bare := []string{"PATH=" + os.Getenv("PATH")}
	out, code := gpucrRun(t, bare, "check", "--json", "--socket", rig.h.socket, "-D", rig.img)
	var r checkJSON
	lastJSON(t, out, &r)
	if code != 0 || !r.OK {
		t.Fatalf("gpucr check: exit %d:\n%s", code, out)
	}
	items := map[string]int{}
	for i, it := range r.Items {
		items[it.Name] = i
		// the image dir, CRIU's optional kernel features and the cost of
		// a page fault served through userfaultfd (which a loaded machine
		// raises past its limit) may warn here
		if it.Status != "ok" && (it.Status != "warn" || (it.Name != "image dir" && !strings.HasPrefix(it.Name, "criu memory") &&
			!strings.HasPrefix(it.Name, "criu lazy") && it.Name != "lazy pages for GPU processes")) {
			t.Errorf("%s: %s: %s", it.Name, it.Status, it.Reason)
		}
	}
	for _, name := range []string{"kernel", "criu", "criu self-test", "plugin", "criu memory tracking", "criu lazy pages", "interposer", "helper", "driver", "image dir"} {
		if _, ok := items[name]; !ok {
			t.Errorf("no %q item:\n%s", name, out)
		}
	}
	plugin := r.Items[items["plugin"]].Info
	want, _ := filepath.Abs(filepath.Join(buildDir(t), "lib", "criu", "gpucr_plugin.so"))
	if plugin["loaded"] != true || plugin["path"] != want {
		t.Errorf("plugin: %v, want %s loaded by CRIU", plugin, want)
	}
	drv := r.Items[items["driver"]].Info
	simLib, _ := filepath.Abs(filepath.Join(buildDir(t), "sim", "libcuda.so.1"))
	if drv["version"] != float64(13000) || drv["checkpoint_api"] != true || drv["simulated"] != true || drv["path"] != simLib {
		t.Errorf("driver as the helper sees it: %v, want %s, 13000, the checkpoint API, simulated", drv, simLib)
	}
	if s := r.Items[items["image dir"]].Info; s["fs_type"] == "" || s["path"] != rig.img {
		t.Errorf("image dir: %v", s)
	}
}

// TestCLILoaderLauncher: gpucr run as the bundle's launcher runs it
// (ld-linux-x86-64.so.2 /x/libexec/gpucr ...) finds the plugin and the
// interposer beside the real binary, not beside the loader.
func TestCLILoaderLauncher(t *testing.T) {
	const loader = "/lib64/ld-linux-x86-64.so.2"
	if _, err := os.Stat(loader); err != nil {
		t.Skipf("no %s here (not x86-64 glibc)", loader)
	}
	rig := newCriuRig(t)
	root := t.TempDir()
	for src, dst := range map[string]string{
		binPath(t, "gpucr"): "libexec/gpucr",
		filepath.Join(buildDir(t), "lib", "criu", "gpucr_plugin.so"): "lib/criu/gpucr_plugin.so",
		filepath.Join(buildDir(t), "lib", "libgpucr.so"):             "lib/libgpucr.so",
	} {
		copyFile(t, src, filepath.Join(root, dst))
	}
	launcher := filepath.Join(root, "bin", "gpucr")
	copyText(t, launcher, "#!/bin/sh\nhere=$(cd \"$(dirname \"$0\")/..\" && pwd)\nexec "+loader+" \"$here/libexec/gpucr\" \"$@\"\n")
	out, code := exitCode(runErr(2*time.Minute, []string{"PATH=" + os.Getenv("PATH")}, launcher,
		"check", "--json", "--socket", rig.h.socket))
	var r checkJSON
	lastJSON(t, out, &r)
	found := 0
	for _, it := range r.Items {
		switch it.Name {
		case "plugin":
			found++
			if it.Status != "ok" || it.Info["path"] != filepath.Join(root, "lib", "criu", "gpucr_plugin.so") || it.Info["loaded"] != true {
				t.Errorf("plugin under the loader launcher: %s %s %v", it.Status, it.Reason, it.Info)
			}
		case "interposer":
			found++
			if it.Status != "ok" || it.Info["path"] != filepath.Join(root, "lib", "libgpucr.so") {
				t.Errorf("interposer under the loader launcher: %s %s", it.Status, it.Reason)
			}
		}
	}
	if found != 2 || code != 0 {
		t.Fatalf("gpucr check under the loader launcher: exit %d:\n%s", code, out)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func copyText(t *testing.T, dst, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestCLICRIUTimeout: CRIU hangs in the plugin's PAUSE_DEVICES (the helper
// stalls before its copy, GPUCR_FAULT=stall-copy). gpucr checkpoint kills
// CRIU at its deadline, says so, and reports that the helper gave the
// process its GPU back; the process computes on exactly. Twice: in text,
// then in --json.
func TestCLICRIUTimeout(t *testing.T) {
	rig := newCriuRig(t, "GPUCR_FAULT=stall-copy")
	a := startUnder(t, rig.dir, rig.h, rig.env, "heartbeat", "--mib", "16", "--interval-ms", "20", "--iters", "500")
	a.waitIter(15, time.Minute)
	log := filepath.Join(rig.img, "dump.log")

	start := time.Now()
	out, code := gpucrRun(t, rig.criuEnv, "checkpoint", strconv.Itoa(a.pid), "-D", rig.img, "--criu-timeout", "2s")
	took := time.Since(start)
	if code != 1 {
		t.Fatalf("gpucr checkpoint with a hanging CRIU: exit %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{
		fmt.Sprintf("gpucr: criu dump of pid %d did not finish within 2s; killed it; see %s", a.pid, log),
		fmt.Sprintf("pid %d runs again: the helper gave it its GPU back", a.pid),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if took > 45*time.Second { // the stall lasts a minute unless CRIU's death ends it
		t.Errorf("gpucr checkpoint took %v: the deadline did not end it", took)
	}
	runsAgainWithin(t, a, time.Now(), a.lastIter(), time.Second)
	at := a.lastIter()
	a.waitIter(at+10, time.Minute)

	out, code = gpucrRun(t, rig.criuEnv, "checkpoint", strconv.Itoa(a.pid), "-D", rig.img, "--criu-timeout", "2s", "--json")
	var j struct {
		Error     string `json:"error"`
		TimedOut  bool   `json:"timed_out"`
		ExitCode  int    `json:"exit_code"`
		Log       string `json:"log"`
		Processes []struct {
			PID     int  `json:"pid"`
			Running bool `json:"running"`
		} `json:"processes"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("gpucr checkpoint --json with a hanging CRIU: not one JSON object (%v):\n%s", err, out)
	}
	if code != 1 || j.ExitCode != 1 || !j.TimedOut || j.Log != log || !strings.Contains(j.Error, "did not finish within 2s; killed it") ||
		len(j.Processes) != 1 || j.Processes[0].PID != a.pid || !j.Processes[0].Running {
		t.Errorf("gpucr checkpoint --json with a hanging CRIU: exit %d, %+v", code, j)
	}

	if c := a.wait(2 * time.Minute); c != 0 {
		t.Fatalf("heartbeat after the killed dumps: exit %d:\n%s", c, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, rig.env, "heartbeat", []string{"--mib", "16"}, 500))
	if !strings.Contains(helperLog(rig.h), "without a report") {
		t.Errorf("the helper log does not show the recovery:\n%s", tail(helperLog(rig.h), 20))
	}
}

// TestCLIInterrupt: Ctrl-C (SIGINT to gpucr checkpoint's process group, as
// a terminal sends it) while the plugin's copy hangs stops CRIU at once,
// says so, gives the process its GPU back and leaves the image directory as
// it was: no log, no partial GPU image, no private directory. The command
// exits 130, as a shell reports a program Ctrl-C ended; after a SIGTERM
// (what systemd or kill sends), 143.
func TestCLIInterrupt(t *testing.T) {
	rig := newCriuRig(t, "GPUCR_FAULT=stall-copy")
	a := startUnder(t, rig.dir, rig.h, rig.env, "heartbeat", "--mib", "16", "--interval-ms", "20", "--iters", "500")
	a.waitIter(15, time.Minute)
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		interruptCheckpoint(t, rig, a, tc.sig, tc.code)
	}
	if c := a.wait(2 * time.Minute); c != 0 {
		t.Fatalf("heartbeat after the interrupted dumps: exit %d:\n%s", c, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, rig.env, "heartbeat", []string{"--mib", "16"}, 500))
}

// interruptCheckpoint sends sig to a gpucr checkpoint of a once the
// helper stalls in its copy, and checks what TestCLIInterrupt says.
func interruptCheckpoint(t *testing.T, rig *criuRig, a *app, sig syscall.Signal, wantCode int) {
	t.Helper()
	stalls := strings.Count(helperLog(rig.h), "stalling before the copy")
	var b bytes.Buffer
	cmd := exec.Command(binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", rig.img)
	cmd.Env = rig.criuEnv
	cmd.Stdout, cmd.Stderr = &b, &b
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// once CRIU has reached the plugin (the helper stalls in the copy)
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(helperLog(rig.h), "stalling before the copy") == stalls && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("gpucr checkpoint still running 30 s after %v:\n%s", sig, b.String())
	}
	out := b.String()
	if _, code := exitCode(out, err); code != wantCode {
		t.Errorf("exit %d after %v, want %d:\n%s", code, sig, wantCode, out)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("gpucr checkpoint took %v to end after %v", took, sig)
	}
	for _, want := range []string{
		fmt.Sprintf("criu dump of pid %d interrupted: stopped CRIU", a.pid),
		fmt.Sprintf("pid %d runs again: the helper gave it its GPU back", a.pid),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	runsAgainWithin(t, a, time.Now(), a.lastIter(), time.Second)
	if ents, _ := os.ReadDir(rig.img); len(ents) > 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("the interrupted checkpoint left %v in %s:\n%s", names, rig.img, out)
	}
}

// TestCLIShowsCRIUFailures: real CRIU failures, each shown with its cause
// (not the rlimit line go-criu reports), and the process left running.
func TestCLIShowsCRIUFailures(t *testing.T) {
	needTool(t, "criu")
	env := []string{"PATH=" + os.Getenv("PATH"), "GPUCR_SOCKET=" + filepath.Join(t.TempDir(), "no-helper.sock")}
	checkpointFails := func(t *testing.T, pid int, dir string, want ...string) string {
		t.Helper()
		out, code := gpucrRun(t, env, "checkpoint", strconv.Itoa(pid), "-D", dir)
		if code != 1 {
			t.Fatalf("gpucr checkpoint: exit %d, want 1:\n%s", code, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q:\n%s", w, out)
			}
		}
		if strings.Contains(out, "RLIMIT_NOFILE") {
			t.Errorf("the rlimit noise is shown:\n%s", out)
		}
		if st := procState(pid); st == "" || st == "Z" {
			t.Errorf("pid %d did not survive the failed dump", pid)
		}
		return out
	}

	t.Run("external unix socket", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "s.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		py := needTool(t, "python3")
		p := startSetsid(t, true, py, "-c", "import socket,sys,time\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ntime.sleep(60)", sock)
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		checkpointFails(t, p.Process.Pid, filepath.Join(t.TempDir(), "img"),
			"unix: External socket is used", "hint: a unix socket of the process is connected to a process outside")
	})

	t.Run("not a session leader", func(t *testing.T) {
		p := startSetsid(t, false, "sleep", "60")
		// refused before CRIU runs (it would refuse only after the plugin's
		// copy), with both ways out
		img := filepath.Join(t.TempDir(), "img")
		out := checkpointFails(t, p.Process.Pid, img, "not the leader of its own session", "start it with setsid", "--shell-job")
		if _, err := os.Stat(filepath.Join(img, "dump.log")); err == nil {
			t.Errorf("CRIU ran although the process leads no session:\n%s", out)
		}
	})

	t.Run("session led outside its pid namespace", func(t *testing.T) {
		// pid 1 of a new pid namespace, in this test's session: getsid
		// gives 0 inside, which CRIU refuses even with --shell-job
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		img := filepath.Join(t.TempDir(), "img")
		out, code := gpucrRun(t, env, "checkpoint", strconv.Itoa(cmd.Process.Pid), "-D", img, "--shell-job")
		if code != 1 {
			t.Fatalf("gpucr checkpoint --shell-job: exit %d, want 1:\n%s", code, out)
		}
		for _, w := range []string{"session whose leader is outside its pid namespace", "with --shell-job or without", "start the program with setsid"} {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q:\n%s", w, out)
			}
		}
		if _, err := os.Stat(filepath.Join(img, "dump.log")); err == nil {
			t.Errorf("CRIU ran although it cannot dump the process:\n%s", out)
		}
		if st := procState(cmd.Process.Pid); st == "" || st == "Z" {
			t.Errorf("pid %d did not survive the refused dump", cmd.Process.Pid)
		}
	})

	t.Run("full image directory", func(t *testing.T) {
		dir := mountTmpfs(t, "size=64k")
		p := startSetsid(t, true, "sleep", "60")
		checkpointFails(t, p.Process.Pid, dir, "No space left on device", "hint: the image directory's file system is full")
	})

	t.Run("read-only image directory", func(t *testing.T) {
		dir := mountTmpfs(t, "ro,size=1m")
		p := startSetsid(t, true, "sleep", "60")
		out := checkpointFails(t, p.Process.Pid, dir, "image directory "+dir+" cannot take CRIU's images: read-only file system")
		if strings.Contains(out, "dumping") {
			t.Errorf("CRIU ran:\n%s", out)
		}
	})

	t.Run("no such process", func(t *testing.T) {
		p := exec.Command("true")
		if err := p.Run(); err != nil {
			t.Fatal(err)
		}
		out, code := gpucrRun(t, env, "checkpoint", strconv.Itoa(p.Process.Pid), "-D", filepath.Join(t.TempDir(), "img"))
		if code != 1 || !strings.Contains(out, fmt.Sprintf("gpucr: no process %d", p.Process.Pid)) {
			t.Errorf("checkpoint of an exited pid: exit %d:\n%s", code, out)
		}
	})

	t.Run("restore of no images", func(t *testing.T) {
		empty := t.TempDir()
		for dir, want := range map[string]string{
			empty:                        "image directory " + empty + " holds no CRIU images (no inventory.img)",
			filepath.Join(empty, "none"): "image directory " + filepath.Join(empty, "none") + " does not exist",
			binPath(t, "gpucr"):          "is not a directory",
		} {
			out, code := gpucrRun(t, env, "restore", "-D", dir)
			if code != 1 || !strings.Contains(out, want) {
				t.Errorf("restore -D %s: exit %d, want 1 and %q:\n%s", dir, code, want, out)
			}
		}
		if _, err := os.Stat(filepath.Join(empty, "none")); err == nil {
			t.Error("restore created the missing image directory")
		}
		out, code := gpucrRun(t, env, "restore", "-D", empty, "--json")
		var j map[string]any
		if err := json.Unmarshal([]byte(out), &j); err != nil || code != 1 || j["exit_code"] != float64(1) {
			t.Errorf("restore --json of an empty directory: exit %d, %v:\n%s", code, err, out)
		}
	})
}

// mountTmpfs mounts a tmpfs with opts on a new directory, for the test.
func mountTmpfs(t *testing.T, opts string) string {
	t.Helper()
	dir := t.TempDir()
	mountTmpfsOn(t, dir, opts)
	return dir
}

// mountTmpfsOn mounts a tmpfs with opts on dir until the test ends; where
// that is not allowed the test is skipped, but in CI it fails (CI must not
// pass by skipping).
func mountTmpfsOn(t *testing.T, dir, opts string) {
	t.Helper()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("mount a tmpfs (%s) on %s: %v", opts, dir, err)
		}
		t.Skipf("cannot mount a tmpfs here (%v)", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
}

// TestCLIPluginMessages: the plugin's own messages (lost on criu swrk's
// discarded stderr) reach gpucr checkpoint's error through
// GPUCR_PLUGIN_LOG; the process runs on exactly.
func TestCLIPluginMessages(t *testing.T) {
	rig := newCriuRig(t, "GPUCR_FAULT=driver-lock")
	a := startUnder(t, rig.dir, rig.h, rig.env, "heartbeat", "--mib", "16", "--interval-ms", "20", "--iters", "200")
	a.waitIter(15, time.Minute)
	out, code := gpucrRun(t, rig.criuEnv, "checkpoint", strconv.Itoa(a.pid), "-D", rig.img)
	want := fmt.Sprintf("gpucr_plugin: checkpoint of the GPU state of pid %d failed", a.pid)
	if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "injected fault") {
		t.Fatalf("gpucr checkpoint with a failing driver lock: exit %d, want 1 and %q:\n%s", code, want, out)
	}
	if c := a.wait(time.Minute); c != 0 {
		t.Fatalf("exit %d after the failed dump:\n%s", c, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, rig.env, "heartbeat", []string{"--mib", "16"}, 200))
}

// TestCLIRefusesClientWithoutPlugin: a process tree with a gpucr client
// below its root, and no plugin anywhere gpucr looks (a copy of gpucr alone
// in a directory): the checkpoint is refused, naming every place searched,
// and CRIU does not run.
func TestCLIRefusesClientWithoutPlugin(t *testing.T) {
	if _, err := os.Stat("/usr/lib/criu/gpucr_plugin.so"); err == nil {
		t.Skip("the plugin is installed in CRIU's default directory")
	}
	rig := newCriuRig(t)
	lone := filepath.Join(t.TempDir(), "bin", "gpucr")
	copyFile(t, binPath(t, "gpucr"), lone)
	hb := &app{t: t, name: "heartbeat", log: filepath.Join(rig.dir, "heartbeat.log")}
	root := exec.Command(binPath(t, "gpucr"), "run", "--socket", rig.h.socket, "--", "/bin/sh", "-c",
		binPath(t, "heartbeat")+" --mib 8 --interval-ms 20 >>"+hb.log+" 2>&1 & wait")
	root.Env = rig.env
	root.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := root.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-root.Process.Pid, syscall.SIGKILL)
		_, _ = root.Process.Wait()
	})
	hb.waitFor(30*time.Second, "ready", func(out string, _ []heartbeat) bool {
		hb.pid, _ = parseHeartbeats(out)
		return hb.pid > 0
	})
	hb.waitIter(10, time.Minute)
	env := append([]string{"GPUCR_PLUGIN_DIR="}, rig.criuEnv...)
	out, code := exitCode(runErr(time.Minute, env, lone, "checkpoint", strconv.Itoa(root.Process.Pid), "-D", rig.img))
	for _, want := range []string{
		fmt.Sprintf("checkpoint %d refused: its tree holds GPU processes of the helper (pid %d)", root.Process.Pid, hb.pid),
		filepath.Join(filepath.Dir(filepath.Dir(lone)), "lib", "criu", "gpucr_plugin.so"),
		"/usr/lib/criu/gpucr_plugin.so",
	} {
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("exit %d, want 1 and %q:\n%s", code, want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(rig.img, "dump.log")); err == nil {
		t.Error("CRIU ran although the checkpoint was refused")
	}
	at := hb.lastIter()
	hb.waitIter(at+5, time.Minute)
}

// TestCLINoGPUState: a checkpoint of a process that is no gpucr client says
// that it saved no GPU state, in text and in --json.
func TestCLINoGPUState(t *testing.T) {
	rig := newCriuRig(t)
	p := startSetsid(t, true, "sleep", "60")
	out, code := gpucrRun(t, rig.criuEnv, "checkpoint", strconv.Itoa(p.Process.Pid), "-D", rig.img, "--leave-running")
	if code != 0 || !strings.Contains(out, "no GPU state saved: no process of the tree is a gpucr client") {
		t.Errorf("text: exit %d:\n%s", code, out)
	}
	out, code = gpucrRun(t, rig.criuEnv, "checkpoint", strconv.Itoa(p.Process.Pid), "-D", filepath.Join(rig.dir, "img2"), "--leave-running", "--json")
	var j struct {
		GPUState   *bool  `json:"gpu_state"`
		NoGPUState string `json:"no_gpu_state"`
		PluginDir  string `json:"plugin_dir"`
	}
	lastJSON(t, out, &j)
	wantDir, _ := filepath.Abs(filepath.Join(buildDir(t), "lib", "criu"))
	if code != 0 || j.GPUState == nil || *j.GPUState || j.NoGPUState != "no process of the tree is a gpucr client" || j.PluginDir != wantDir {
		t.Errorf("--json: exit %d: %+v:\n%s", code, j, out)
	}
}

// TestCLICheckpointWhileAnotherRuns: a second checkpoint of a pid whose
// first one is still running is refused at once, saying so (it said
// "control connection is not connected" once the first had detached the
// process for its dump); the first goes on, and the process runs on.
func TestCLICheckpointWhileAnotherRuns(t *testing.T) {
	rig := newCriuRig(t, "GPUCR_FAULT=stall-copy")
	a := startUnder(t, rig.dir, rig.h, rig.env, "heartbeat", "--mib", "16", "--interval-ms", "20", "--iters", "500")
	a.waitIter(15, time.Minute)
	var b bytes.Buffer
	first := exec.Command(binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", rig.img, "--leave-running")
	first.Env = rig.criuEnv
	first.Stdout, first.Stderr = &b, &b
	first.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Process.Kill(); _ = first.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(helperLog(rig.h), "stalling before the copy") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	out, code := gpucrRun(t, rig.criuEnv, "checkpoint", strconv.Itoa(a.pid), "-D", filepath.Join(rig.dir, "img2"), "--leave-running")
	want := fmt.Sprintf("another checkpoint of pid %d is running", a.pid)
	if code != 1 || !strings.Contains(out, want) || strings.Contains(out, "not connected") {
		t.Errorf("the second checkpoint: exit %d, want 1 and %q:\n%s", code, want, out)
	}
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("the second checkpoint took %v to be refused", took)
	}
	t.Logf("the second checkpoint:\n%s", out)
	// the first ends (interrupted: its copy stalls a minute) and gives the
	// process its GPU back
	_ = syscall.Kill(-first.Process.Pid, syscall.SIGINT)
	_ = first.Wait()
	runsAgainWithin(t, a, time.Now(), a.lastIter(), time.Second)
	if c := a.wait(2 * time.Minute); c != 0 {
		t.Fatalf("heartbeat after the two checkpoints: exit %d:\n%s\nfirst checkpoint:\n%s", c, tail(a.output(), 10), b.String())
	}
	compareWithReference(t, a.heartbeats(), reference(t, rig.env, "heartbeat", []string{"--mib", "16"}, 500))
}
