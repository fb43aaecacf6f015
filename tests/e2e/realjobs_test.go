package e2e

// Real jobs through the CLI: forked CPU workers of a GPU process (as PyTorch's
// DataLoader forks them), a dump that fails anywhere after the GPU state was
// paused, and a restored process checkpointed again and again.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cli runs gpucr with the helper's socket and returns its output and error.
func cli(t testing.TB, h *helperProc, env []string, args ...string) (string, error) {
	t.Helper()
	e := append(append([]string{}, env...), "GPUCR_SOCKET="+h.socket)
	return runErr(2*time.Minute, e, binPath(t, "gpucr"), args...)
}

// cliOK is cli that fails the test, with the end of CRIU's log, on failure.
func cliOK(t testing.TB, h *helperProc, env []string, img string, args ...string) string {
	t.Helper()
	out, err := cli(t, h, env, args...)
	if err != nil {
		var logs string
		for _, l := range []string{"dump.log", "restore.log"} {
			if b, rerr := os.ReadFile(filepath.Join(img, l)); rerr == nil {
				logs += "\n" + l + ":\n" + tail(string(b), 25)
			}
		}
		hl, _ := os.ReadFile(h.log)
		// The helper's log and CRIU's first, gpucr's own report (which
		// names CRIU's errors) last: CI shows a failure's last lines.
		t.Fatalf("helper log:\n%s%s\ngpucr %s: %v\n%s", tail(string(hl), 20), logs, strings.Join(args, " "), err, out)
	}
	return out
}

// children lists pid's child processes.
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// runsAgainWithin fails the test unless a runs on after a failed dump: a
// heartbeat after since, within d (from the moment CRIU and the CLI have
// exited: since).
func runsAgainWithin(t testing.TB, a *app, since time.Time, last int, d time.Duration) {
	t.Helper()
	deadline := since.Add(d)
	for a.lastIter() <= last {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d, state %s) ran no iteration past %d within %v of the failed dump; output:\n%s",
				a.name, a.pid, procState(a.pid), last, d, tail(a.output(), 10))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stopAndCompare ends a restored application and the processes of its tree
// named in others (its workers: after the restore they are no children of
// this test), then checks every heartbeat against an uninterrupted run of
// the application with args, and that none is missing from iteration from on.
func stopAndCompare(t testing.TB, a *app, env, args []string, from int, others ...int) {
	t.Helper()
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	for _, p := range others {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, a.name, args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, from)
}

var workerArgs = []string{"--mib", "16", "--workers", "2", "--hb-every", "5"}

// TestForkedWorkersCheckpointRestore: a GPU process with two CPU workers it
// forked after CUDA was initialised (as PyTorch's DataLoader does) is
// checkpointed as a tree with `gpucr checkpoint` and restored with `gpucr
// restore`; the workers come back with their state (the checksums depend on
// it) and every heartbeat equals an uninterrupted run's.
func TestForkedWorkersCheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, workerArgs...), "--interval-ms", "20")...)
	a.waitIter(15, time.Minute)
	workers := children(a.pid)
	if len(workers) != 2 {
		t.Fatalf("heartbeat has children %v, want its 2 workers", workers)
	}
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	before := a.lastIter()
	for _, w := range workers {
		waitPidFree(w, 10*time.Second)
	}
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+20, time.Minute)
	if got := children(a.pid); len(got) != 2 {
		t.Errorf("after the restore heartbeat has children %v, want its 2 workers", got)
	}
	stopAndCompare(t, a, env, workerArgs, before, workers...)
}

// TestDumpFailureGivesBack: whatever fails after the plugin paused a
// process's GPU state, every process of the tree runs again within a second
// of CRIU exiting, its checksums going on exactly.
func TestDumpFailureGivesBack(t *testing.T) {
	needTool(t, "criu")
	t.Run("a forked child keeps the driver's files", func(t *testing.T) {
		// Without gpucr's fork handling, a forked worker keeps the driver's
		// device file, which CRIU cannot dump: the checkpoint is refused
		// before anything is paused, naming the worker and its file.
		dir := t.TempDir()
		env := gpucrEnv(t)
		h := startHelper(t, dir, env)
		img := filepath.Join(dir, "img")
		a := startUnder(t, dir, h, append(append([]string{}, env...), "GPUCR_FORK_SCRUB=0"), "heartbeat",
			append(append([]string{}, workerArgs...), "--interval-ms", "10", "--iters", "300")...)
		a.waitIter(15, time.Minute)
		workers := children(a.pid)
		out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
		exited := time.Now()
		last := a.lastIter()
		if err == nil {
			t.Fatalf("a dump of a worker holding the driver's file succeeded:\n%s", out)
		}
		if len(workers) == 0 || !strings.Contains(out, fmt.Sprintf("%d (heartbeat) holds anon_inode:[perf_event]", workers[0])) ||
			!strings.Contains(out, "not gpucr clients") {
			t.Errorf("the refusal does not name the worker (%v) and its device file:\n%s", workers, out)
		}
		if _, err := os.Stat(filepath.Join(img, "dump.log")); err == nil {
			t.Errorf("CRIU ran although the tree could not be dumped")
		}
		runsAgainWithin(t, a, exited, last, time.Second)
		if code := a.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d after the failed dump:\n%s", code, tail(a.output(), 10))
		}
		compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", workerArgs, 300))
	})
	t.Run("plugin error in the second process", func(t *testing.T) {
		// Two GPU processes in one tree: the first is paused and detached,
		// the second's checkpoint fails in the helper, CRIU aborts.
		dir := t.TempDir()
		env := gpucrEnv(t)
		h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=driver-lock@2"))
		img := filepath.Join(dir, "img")
		root, hb, pc := startTree(t, dir, h, env, "--interval-ms 10 --iters 300")
		out, err := cli(t, h, env, "checkpoint", strconv.Itoa(root.Process.Pid), "-D", img)
		exited := time.Now()
		if err == nil {
			hl, _ := os.ReadFile(h.log)
			t.Fatalf("a dump whose second GPU checkpoint fails succeeded:\n%s\nhelper log:\n%s", out, tail(string(hl), 30))
		}
		for _, a := range []*app{hb, pc} {
			runsAgainWithin(t, a, exited, a.lastIter(), time.Second)
		}
		if err := root.Wait(); err != nil {
			t.Fatalf("the tree after the failed dump: %v\n%s\n%s", err, tail(hb.output(), 5), tail(pc.output(), 5))
		}
		for _, a := range []*app{hb, pc} {
			compareWithReference(t, a.heartbeats(), reference(t, env, a.name, []string{"--mib", "8"}, 300))
		}
	})
	t.Run("image directory full", func(t *testing.T) {
		dir := t.TempDir()
		env := gpucrEnv(t)
		h := startHelper(t, dir, env)
		img := filepath.Join(dir, "img")
		if err := os.Mkdir(img, 0o700); err != nil {
			t.Fatal(err)
		}
		mountTmpfsOn(t, img, "size=6m")
		a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "10", "--iters", "300")
		a.waitIter(15, time.Minute)
		out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
		exited := time.Now()
		last := a.lastIter()
		if err == nil {
			t.Fatalf("a dump of 16 MiB into a 6 MiB file system succeeded:\n%s", out)
		}
		// refused before the pause: no GPU data was copied
		if !strings.Contains(out, "checkpoint refused") || !strings.Contains(out, "free") || strings.Contains(out, "GPU data") {
			t.Errorf("a dump that cannot fit was not refused before the copy:\n%s", out)
		}
		runsAgainWithin(t, a, exited, last, time.Second)
		if code := a.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d after the failed dump:\n%s", code, tail(a.output(), 10))
		}
		compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", []string{"--mib", "16"}, 300))
	})
}

// TestRestoredCheckpointedAgain: a restored process is a client like any
// other: it is checkpointed again with --leave-running (it runs on), then
// dumped and restored again, three rounds, and computes exactly throughout.
func TestRestoredCheckpointedAgain(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	args := []string{"--mib", "8", "--hb-every", "5"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "10")...)
	a.waitIter(15, time.Minute)
	for round := 1; round <= 3; round++ {
		img := filepath.Join(dir, "img"+strconv.Itoa(round))
		keep := img + "-kept"
		// --leave-running: the process goes on; a restored one too.
		cliOK(t, h, env, keep, "checkpoint", strconv.Itoa(a.pid), "-D", keep, "--leave-running")
		at := a.lastIter()
		a.waitIter(at+10, 30*time.Second)
		// Then a dump (the process ends) and a restore.
		cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
		if round == 1 {
			a.reap(30 * time.Second)
		} else {
			waitDead(t, a.pid, 30*time.Second)
		}
		waitPidFree(a.pid, 10*time.Second)
		before := a.lastIter()
		cliOK(t, h, env, img, "restore", "-D", img)
		a.waitIter(before+10, 30*time.Second)
		st := h.status()
		if len(st.Clients) != 1 || st.Clients[0].Pid.String() != strconv.Itoa(a.pid) || !st.Clients[0].Checkpointable {
			t.Fatalf("round %d: after the restore the helper lists %+v, want pid %d checkpointable", round, st.Clients, a.pid)
		}
	}
	stopAndCompare(t, a, env, args, 0)
}

// TestStaleRestoredEntryReaped: a restored process that never comes back for
// its GPU memory (CRIU left it stopped, as a frozen container) keeps it while
// it exists; once it is killed the helper releases that memory by itself, and
// the same image restores again into a process that runs.
func TestStaleRestoredEntryReaped(t *testing.T) {
	rig := newCriuRig(t)
	criu, dir, env, h, criuEnv, libdir, img := rig.criu, rig.dir, rig.env, rig.h, rig.criuEnv, rig.libdir, rig.img
	args := []string{"--mib", "8", "--hb-every", "5"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "10")...)
	a.waitIter(15, time.Minute)
	criuOK(t, criu, criuEnv, img, "dump.log", "dump", "-t", strconv.Itoa(a.pid), "--libdir", libdir)
	a.reap(30 * time.Second)
	before := a.lastIter()
	waitPidFree(a.pid, 10*time.Second)
	criuOK(t, criu, criuEnv, img, "restore.log", "restore", "-d", "--leave-stopped", "--libdir", libdir)
	time.Sleep(300 * time.Millisecond)
	if a.lastIter() != before {
		t.Fatalf("the process restored stopped ran on (%d -> %d)", before, a.lastIter())
	}
	st := h.status()
	if len(st.Clients) != 1 || len(st.Clients[0].NotCheckpointable) == 0 ||
		!strings.Contains(st.Clients[0].NotCheckpointable[0], "restored") {
		t.Fatalf("the helper lists %+v, want the stopped restored process waiting", st.Clients)
	}
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	waitNoClients(t, h, 5*time.Second)
	waitPidFree(a.pid, 10*time.Second)
	criuOK(t, criu, criuEnv, img, "restore2.log", "restore", "-d", "--libdir", libdir)
	a.waitIter(before+10, 30*time.Second)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, hbs[len(hbs)-1].Iter))
}

// TestCheckpointThenRestoreAtOnce: a checkpoint returns only once the dumped
// tree's pids are free, so that a restore on the next line of a script
// works. The tree's forked workers, orphaned when CRIU kills the tree, become
// zombies of this test (a subreaper, as a slow pid 1 is on the GPU machine)
// that hold the root's pid as their session; they are reaped a second after
// they appear. The checkpoint must not return before that, and the restore
// right after it must succeed.
func TestCheckpointThenRestoreAtOnce(t *testing.T) {
	needTool(t, "criu")
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("become a subreaper: %v", err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, workerArgs...), "--interval-ms", "20")...)
	a.waitIter(15, time.Minute)
	workers := children(a.pid)
	if len(workers) != 2 {
		t.Fatalf("heartbeat has children %v, want its 2 workers", workers)
	}
	const hold = time.Second
	reaped := make(chan time.Time, 1)
	go func() {
		// once both are zombies (ours: their parent died), hold them, then reap
		deadline := time.Now().Add(time.Minute)
		for _, w := range workers {
			for procState(w) != "Z" && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
		}
		time.Sleep(hold)
		for _, w := range workers {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(w, &ws, 0, nil)
		}
		reaped <- time.Now()
	}()
	started := time.Now()
	out := cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--json")
	returned := time.Now()
	var when time.Time
	select {
	case when = <-reaped:
	case <-time.After(time.Minute):
		t.Fatalf("the workers %v never became zombies of this test (states %s %s)", workers, procState(workers[0]), procState(workers[1]))
	}
	if returned.Before(when) {
		t.Fatalf("gpucr checkpoint returned %v before the tree's zombies were reaped:\n%s", when.Sub(returned), out)
	}
	var res struct {
		Released float64 `json:"pids_released_after_seconds"`
		Held     string  `json:"pids_held"`
		Seconds  float64 `json:"seconds"`
		Dump     float64 `json:"dump_seconds"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Released < hold.Seconds()/2 || res.Held != "" {
		t.Errorf("checkpoint's JSON: released after %.3f s, held %q (%v), want about %v and none:\n%s", res.Released, res.Held, err, hold, out)
	}
	// The time reported is the whole, the wait for the pids included
	// (a second here), and its parts add up to it.
	if took := returned.Sub(started).Seconds(); res.Seconds < res.Released || res.Dump <= 0 || res.Seconds > took ||
		res.Seconds < took-0.5 || res.Dump+res.Released > res.Seconds+0.01 || res.Dump+res.Released < res.Seconds-0.1 {
		t.Errorf("checkpoint's JSON: seconds %.3f (dump %.3f, pids released after %.3f) for a command that took %.3f s:\n%s",
			res.Seconds, res.Dump, res.Released, took, out)
	}
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+20, time.Minute)
	stopAndCompare(t, a, env, workerArgs, before, workers...)
}

// TestRestoreRefusedWhilePidsHeld: a restore whose pids are taken (here by
// the process itself, checkpointed with --leave-running and still running)
// is refused before CRIU starts and before any GPU memory is loaded, naming
// the process that holds them and what to do; the process runs on.
func TestRestoreRefusedWhilePidsHeld(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running")
	start := time.Now()
	out, err := cli(t, h, env, "restore", "-D", img)
	took := time.Since(start)
	if err == nil {
		t.Fatalf("a restore whose pid %d is running succeeded:\n%s", a.pid, out)
	}
	for _, want := range []string{"refused", strconv.Itoa(a.pid) + " heartbeat (running", "--leave-running"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	// One process holds them: heartbeat, its threads (the simulated
	// driver's streams) named as its threads, not as processes.
	if !regexp.MustCompile(`hold them: ` + strconv.Itoa(a.pid) + ` heartbeat \(running, parent \d+\) with its threads \[\d+( \d+)*\]; `).MatchString(out) {
		t.Errorf("the refusal does not name heartbeat alone, with its threads:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(img, "restore.log")); err == nil {
		t.Errorf("CRIU ran (restore.log exists) although the pids were taken")
	}
	if took > pidsWaitBound {
		t.Errorf("the refusal took %v", took)
	}
	last := a.lastIter()
	a.waitIter(last+5, 30*time.Second)
}

// pidsWaitBound: a restore refused for held pids waits for them 2 s at most,
// plus the CLI's start.
const pidsWaitBound = 10 * time.Second

// TestCheckpointRefusedNotSessionLeader: a process that does not lead its
// own session (started without setsid, in this test's session) is refused
// before anything is paused or copied, saying what to do; CRIU would refuse
// it only after the plugin had copied all its GPU memory. It runs on.
func TestCheckpointRefusedNotSessionLeader(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	a := startUnderCmd(t, dir, h, env, "heartbeat", []string{binPath(t, "heartbeat"), "--mib", "16", "--interval-ms", "20"},
		func(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{} })
	a.waitIter(5, time.Minute)
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	if err == nil {
		t.Fatalf("a checkpoint of a process that leads no session succeeded:\n%s", out)
	}
	for _, want := range []string{"not the leader of its own session", "setsid", "--shell-job"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "GPU data") {
		t.Errorf("GPU memory was copied before the refusal:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(img, "dump.log")); err == nil {
		t.Errorf("CRIU ran (dump.log exists)")
	}
	last := a.lastIter()
	a.waitIter(last+5, 30*time.Second)
}

// TestCheckpointIntoUsedDirectory: a checkpoint into a directory that holds
// another process's image is refused, the directory left as it was; with
// --force the old image is replaced whole (none of its files stay) and the
// new one restores; a --force checkpoint that fails puts the old image back.
func TestCheckpointIntoUsedDirectory(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	first := startUnder(t, filepath.Join(dir), h, env, "ptrchase", "--mib", "8", "--interval-ms", "20")
	first.waitIter(5, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(first.pid), "-D", img)
	oldCore := filepath.Join(img, "core-"+strconv.Itoa(first.pid)+".img")
	inv, err := os.Stat(filepath.Join(img, "inventory.img"))
	if err != nil {
		t.Fatal(err)
	}

	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(5, time.Minute)
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	if err == nil || !strings.Contains(out, "already holds a CRIU image and a GPU image") || !strings.Contains(out, "--force") {
		t.Fatalf("a checkpoint into another's image directory: err %v, want a refusal naming both images and --force:\n%s", err, out)
	}
	if now, err := os.Stat(filepath.Join(img, "inventory.img")); err != nil || !os.SameFile(inv, now) || !now.ModTime().Equal(inv.ModTime()) {
		t.Errorf("the refused checkpoint changed the old image's inventory.img")
	}
	last := a.lastIter()
	a.waitIter(last+3, 30*time.Second)

	// a --force checkpoint that fails leaves the old image
	if err := os.Mkdir(filepath.Join(dir, "faulty"), 0o755); err != nil {
		t.Fatal(err)
	}
	hf := startHelper(t, filepath.Join(dir, "faulty"), append(append([]string{}, env...), "GPUCR_FAULT=driver-lock"))
	b := startUnder(t, filepath.Join(dir, "faulty"), hf, env, "heartbeat", "--mib", "8", "--interval-ms", "20")
	b.waitIter(5, time.Minute)
	if out, err := cli(t, hf, env, "checkpoint", strconv.Itoa(b.pid), "-D", img, "--force"); err == nil {
		t.Fatalf("a checkpoint whose GPU lock fails succeeded:\n%s", out)
	}
	if now, err := os.Stat(filepath.Join(img, "inventory.img")); err != nil || !os.SameFile(inv, now) {
		t.Errorf("after a failed --force checkpoint the old image's inventory.img is gone or replaced (%v)", err)
	}
	if _, err := os.Stat(oldCore); err != nil {
		t.Errorf("after a failed --force checkpoint the old image lost %s: %v", filepath.Base(oldCore), err)
	}

	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--force")
	if _, err := os.Stat(oldCore); err == nil {
		t.Errorf("the old image's %s survived --force", filepath.Base(oldCore))
	}
	if left, _ := filepath.Glob(filepath.Join(img, ".gpucr-old-*")); len(left) > 0 {
		t.Errorf("the old image was put aside and left: %v", left)
	}
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+10, time.Minute)
	stopAndCompare(t, a, env, []string{"--mib", "16"}, before)
}

// TestRestoreRepeatsShellJob: a process started from a shell (not the
// leader of its own session) is checkpointed with --shell-job; its image
// records that (gpucr-dump.json, the caller's, 0600). A restore that cannot
// read the record (it belongs to another user) fails on CRIU's "Can't fork"
// for the shell's session, and says that the image wants --shell-job, not
// that a process holds that pid. Once the record is the caller's, a restore
// without the flag uses it, saying so, and the process computes on exactly.
func TestRestoreRepeatsShellJob(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	a := startUnderCmd(t, dir, h, env, "heartbeat", []string{binPath(t, "heartbeat"), "--mib", "16", "--interval-ms", "20"},
		func(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{} })
	a.waitIter(5, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--shell-job")
	rec := filepath.Join(img, "gpucr-dump.json")
	if fi, err := os.Lstat(rec); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the dump's record %s: %v %v, want a file 0600", rec, fi, err)
	}
	a.reap(30 * time.Second)
	before := a.lastIter()

	if err := os.Chown(rec, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	out, err := cli(t, h, env, "restore", "-D", img)
	if err == nil || !strings.Contains(out, "gpucr-dump.json belongs to uid 65534") ||
		!strings.Contains(out, "dumped with --shell-job: restore it with --shell-job too") || strings.Contains(out, "taken by another process") {
		t.Fatalf("restore without the record and without --shell-job: %v, want a failure that names --shell-job:\n%s", err, out)
	}
	waitPidFree(a.pid, 10*time.Second)

	if err := os.Chown(rec, 0, 0); err != nil {
		t.Fatal(err)
	}
	out = cliOK(t, h, env, img, "restore", "-D", img, "--json")
	var res struct {
		DumpOptions []string `json:"dump_options"`
	}
	lastJSON(t, out, &res)
	if !slices.Equal(res.DumpOptions, []string{"--shell-job"}) {
		t.Errorf("restore --json: dump_options %q, want [--shell-job]:\n%s", res.DumpOptions, out)
	}
	a.waitIter(before+10, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", []string{"--mib", "16"}, hbs[len(hbs)-1].Iter))
}
