// Package e2e holds gpucr's end-to-end tests: real processes, real CRIU, real
// runc, on the simulated CUDA driver (tests/sim) where no GPU is present.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testroot"
)

// buildDir is where `make` put the binaries (GPUCR_BUILD overrides).
func buildDir(t testing.TB) string {
	if d := os.Getenv("GPUCR_BUILD"); d != "" {
		return d
	}
	return filepath.Join(testroot.Dir(t), "build")
}

func binPath(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(buildDir(t), "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not built (run `make`): %v", p, err)
	}
	return p
}

// simEnv is the environment for a program that must run on the simulated driver.
func simEnv(t testing.TB, extra ...string) []string {
	t.Helper()
	lib := filepath.Join(buildDir(t), "sim")
	if _, err := os.Stat(filepath.Join(lib, "libcuda.so.1")); err != nil {
		t.Fatalf("simulated driver is not built (run `make`): %v", err)
	}
	env := []string{"LD_LIBRARY_PATH=" + lib, "PATH=" + os.Getenv("PATH")}
	return append(env, extra...)
}

// needTool finds an external program. Outside CI a missing one skips the test;
// in CI (CI=true) it fails it, so CI can never pass by skipping.
func needTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found on PATH, and CI requires it (make deps installs it)", name)
	}
	t.Skipf("%s not found on PATH (make deps installs it)", name)
	return ""
}

// run runs a command to completion and returns its combined output; it fails
// the test with that output if the command fails.
func run(t testing.TB, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(timeout, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(timeout time.Duration, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if env != nil {
		cmd.Env = env
	}
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", timeout, err)
	}
	return b.String(), err
}

// checkerCases turns a checker's output (blastest, drvtest: a line `ok
// NAME` or `FAIL NAME: WHY` per case) into subtests of t, a failed case
// failing its subtest, and returns how many cases it reported.
func checkerCases(t *testing.T, out string) int {
	t.Helper()
	cases := 0
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "ok "):
			cases++
			t.Run(strings.TrimPrefix(line, "ok "), func(*testing.T) {})
		case strings.HasPrefix(line, "FAIL "):
			cases++
			name, msg, _ := strings.Cut(strings.TrimPrefix(line, "FAIL "), ":")
			t.Run(name, func(t *testing.T) { t.Error(strings.TrimSpace(msg)) })
		}
	}
	return cases
}

// heartbeat is one `hb ITER CHECKSUM TIME` line of a test application.
type heartbeat struct {
	Iter     int
	Checksum string
}

// parseHeartbeats reads every hb line of an application's output, plus the
// pid from its `ready pid=` line.
func parseHeartbeats(out string) (pid int, hbs []heartbeat) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && f[0] == "ready" && strings.HasPrefix(f[1], "pid="):
			pid, _ = strconv.Atoi(strings.TrimPrefix(f[1], "pid="))
		case len(f) >= 3 && f[0] == "hb":
			if it, err := strconv.Atoi(f[1]); err == nil {
				hbs = append(hbs, heartbeat{it, f[2]})
			}
		}
	}
	return pid, hbs
}

// app is a test application running in the background, detached in its own
// session (as a service would be), its output going to a file: that is what
// CRIU can dump and restore without help.
type app struct {
	t      testing.TB
	name   string
	args   []string
	log    string
	cmd    *exec.Cmd
	pid    int
	exited chan struct{} // closed once cmd.Wait has collected its exit (started)
}

// started collects the application's exit as soon as it happens, as a shell
// does for its jobs, so that a dumped process leaves no zombie holding its
// pid (gpucr checkpoint waits for the tree's pids to be free).
func (a *app) started() {
	a.pid = a.cmd.Process.Pid
	a.exited = make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(a.exited) }()
}

func startApp(t testing.TB, dir, name string, env []string, args ...string) *app {
	t.Helper()
	a := &app{t: t, name: name, args: args, log: filepath.Join(dir, name+".log")}
	f, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	a.cmd = exec.Command(binPath(t, name), args...)
	a.cmd.Env = env
	a.cmd.Stdin, a.cmd.Stdout, a.cmd.Stderr = devnull, f, f
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	a.started()
	t.Cleanup(a.kill)
	a.waitFor(30*time.Second, "ready", func(string, []heartbeat) bool {
		p, _ := parseHeartbeats(a.output())
		return p == a.pid
	})
	return a
}

func (a *app) output() string {
	b, err := os.ReadFile(a.log)
	if errors.Is(err, fs.ErrNotExist) {
		return "" // not started writing yet (a container creates it itself)
	}
	if err != nil {
		a.t.Fatalf("read %s: %v", a.log, err)
	}
	return string(b)
}

func (a *app) heartbeats() []heartbeat {
	_, hbs := parseHeartbeats(a.output())
	return hbs
}

func (a *app) lastIter() int {
	hbs := a.heartbeats()
	if len(hbs) == 0 {
		return -1
	}
	return hbs[len(hbs)-1].Iter
}

// waitFor polls the application's output until cond holds.
func (a *app) waitFor(timeout time.Duration, what string, cond func(string, []heartbeat) bool) {
	a.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out := a.output()
		_, hbs := parseHeartbeats(out)
		if cond(out, hbs) {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s (pid %d): no %s after %v; output:\n%s", a.name, a.pid, what, timeout, tail(out, 30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitIter waits until the application has reported iteration n or later.
func (a *app) waitIter(n int, timeout time.Duration) {
	a.t.Helper()
	a.waitFor(timeout, fmt.Sprintf("heartbeat for iteration %d", n), func(_ string, hbs []heartbeat) bool {
		return len(hbs) > 0 && hbs[len(hbs)-1].Iter >= n
	})
}

// hasExited says whether the application has exited (and been collected).
func (a *app) hasExited() bool {
	select {
	case <-a.exited:
		return true
	default:
		return false
	}
}

// reap collects the exit of the original process once CRIU has killed it, so
// its pid is free for the restore.
func (a *app) reap(timeout time.Duration) {
	a.t.Helper()
	select {
	case <-a.exited:
	case <-time.After(timeout):
		a.t.Fatalf("%s (pid %d) still running %v after the dump", a.name, a.pid, timeout)
	}
}

// kill ends the application whoever its parent is now (after a restore it is
// CRIU's orphan, not our child).
func (a *app) kill() {
	if a.pid > 0 {
		_ = syscall.Kill(a.pid, syscall.SIGKILL)
	}
	if a.exited != nil {
		<-a.exited
	}
}

// reference runs the same application uninterrupted to iteration iters and
// returns its checksum for every reported iteration.
func reference(t testing.TB, env []string, name string, args []string, iters int) map[int]string {
	t.Helper()
	full := append(append([]string{}, args...), "--iters", strconv.Itoa(iters), "--interval-ms", "0")
	out := run(t, 2*time.Minute, env, binPath(t, name), full...)
	_, hbs := parseHeartbeats(out)
	ref := make(map[int]string, len(hbs))
	for _, h := range hbs {
		ref[h.Iter] = h.Checksum
	}
	if len(ref) == 0 {
		t.Fatalf("reference run of %s printed no heartbeat:\n%s", name, tail(out, 20))
	}
	return ref
}

// compareWithReference checks every heartbeat against an uninterrupted run.
func compareWithReference(t testing.TB, hbs []heartbeat, ref map[int]string) {
	t.Helper()
	for _, h := range hbs {
		want, ok := ref[h.Iter]
		if !ok {
			t.Errorf("iteration %d has no reference heartbeat", h.Iter)
			continue
		}
		if h.Checksum != want {
			t.Errorf("iteration %d: checksum %s, uninterrupted run has %s", h.Iter, h.Checksum, want)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// procState is the state letter of a process from /proc (R, S, T, t, Z...).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// waitDead waits until pid has exited (a zombie counts: whoever is its parent
// now, often pid 1, reaps it in its own time).
func waitDead(t testing.TB, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if s := procState(pid); s == "" || s == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running %v after it should have exited (state %s)", pid, timeout, procState(pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitPidFree waits up to timeout until pid has no /proc entry at all (not
// even a zombie), so a restore can use it again: a restored process is an
// orphan that pid 1 here reaps late.
func waitPidFree(pid int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for procState(pid) != "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}
