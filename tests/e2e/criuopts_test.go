package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCLICRIUOptions: CRIU's own options reach CRIU, typed (--file-locks)
// or passed through (--criu-opt file-locks): a process holding a file lock
// cannot be checkpointed without them, and with either it is checkpointed
// and restored with its lock.
func TestCLICRIUOptions(t *testing.T) {
	needTool(t, "criu")
	py := needTool(t, "python3")
	dir := t.TempDir()
	env := noHelperEnv(dir)
	lockFile := filepath.Join(dir, "lock")
	marks := filepath.Join(dir, "marks")
	prog := "import fcntl,sys,time\nf=open(sys.argv[1],'w')\nfcntl.flock(f,fcntl.LOCK_EX)\ni=0\nwhile True:\n" +
		"    i+=1\n    open(sys.argv[2],'a').write('%d\\n'%i)\n    time.sleep(0.02)\n"
	p := startReaped(t, py, "-c", prog, lockFile, marks)
	waitMarks := func(min int) int {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			b, _ := os.ReadFile(marks)
			f := strings.Fields(string(b))
			if len(f) > 0 {
				if n, _ := strconv.Atoi(f[len(f)-1]); n >= min {
					return n
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the locking process did not reach mark %d: %q", min, tail(string(b), 3))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitMarks(3)
	pid := strconv.Itoa(p.Process.Pid)
	out, code := gpucrRun(t, env, "checkpoint", pid, "-D", filepath.Join(dir, "plain"))
	if code != 1 || !strings.Contains(out, "--file-locks") {
		t.Fatalf("checkpoint of a lock holder without --file-locks: exit %d, want 1 naming the option:\n%s", code, out)
	}
	for i, opt := range [][]string{{"--file-locks"}, {"--criu-opt", "file-locks"}} {
		img := filepath.Join(dir, "img"+strconv.Itoa(i))
		out, code := gpucrRun(t, env, append([]string{"checkpoint", pid, "-D", img}, opt...)...)
		if code != 0 {
			t.Fatalf("checkpoint %v: exit %d:\n%s", opt, code, out)
		}
		at := waitMarks(0)
		out, code = gpucrRun(t, env, append([]string{"restore", "-D", img}, opt...)...)
		if code != 0 {
			t.Fatalf("restore %v: exit %d:\n%s", opt, code, out)
		}
		waitMarks(at + 3)
		// The restored process holds the lock again.
		f, err := os.OpenFile(lockFile, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			t.Errorf("the restored process (%v) does not hold its lock", opt)
		}
		f.Close()
	}
	_ = syscall.Kill(p.Process.Pid, syscall.SIGKILL)
	out, code = gpucrRun(t, env, "checkpoint", pid, "-D", filepath.Join(dir, "bad"), "--criu-opt", "images-dir /etc")
	if code == 0 || !strings.Contains(out, "gpucr sets that one itself") {
		t.Errorf("--criu-opt images-dir: exit %d:\n%s", code, out)
	}
}

// TestCLIFileChangedHint: a process checkpointed with --leave-running runs
// on and writes on into its log (opened without O_APPEND: CRIU checks the
// size of every regular file but a write-only appended one); the restore of that image fails on CRIU's
// "has bad size", and gpucr says what it means and what to do.
func TestCLIFileChangedHint(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := noHelperEnv(dir)
	log := filepath.Join(dir, "app.log")
	p := startSetsid(t, true, "/bin/sh", "-c", `exec 3>"$1"; while :; do echo tick >&3; sleep 0.05; done`, "sh", log)
	deadline := time.Now().Add(10 * time.Second)
	for fi, _ := os.Stat(log); fi == nil || fi.Size() < 10; fi, _ = os.Stat(log) {
		if time.Now().After(deadline) {
			t.Fatal("the shell loop writes nothing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	img := filepath.Join(dir, "img")
	if out, code := gpucrRun(t, env, "checkpoint", strconv.Itoa(p.Process.Pid), "-D", img, "--leave-running"); code != 0 {
		t.Fatalf("checkpoint --leave-running: exit %d:\n%s", code, out)
	}
	time.Sleep(300 * time.Millisecond) // it writes on
	_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
	_ = p.Wait()
	waitPidFree(p.Process.Pid, 10*time.Second)
	out, code := gpucrRun(t, env, "restore", "-D", img)
	if code != 1 || !strings.Contains(out, "has bad size") || !strings.Contains(out, "hint: the process had "+log+" open") ||
		!strings.Contains(out, "without --leave-running") {
		t.Fatalf("restore of an image whose log grew: exit %d, want 1 with the hint:\n%s", code, out)
	}
}

// TestCLIUnknownCRIUOption: an option CRIU does not know (--criu-opt
// 'bogus-option 1') fails the checkpoint with what CRIU said on its stderr
// (its log does not exist yet) and a hint naming the --criu-opt; no failure
// points to a log that is not there. The GPU process was never stopped: it
// runs on, its GPU memory untouched, and is checkpointed right after.
func TestCLIUnknownCRIUOption(t *testing.T) {
	rig := newCriuRig(t)
	a := startUnder(t, rig.dir, rig.h, rig.env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	pid := strconv.Itoa(a.pid)
	for _, tc := range []struct{ opt, criu, hint string }{
		{"bogus-option 1", "unrecognized option '--bogus-option'", `CRIU has no option "bogus-option" (--criu-opt "bogus-option 1")`},
		{"ghost-limit", "option '--ghost-limit' requires an argument", `CRIU's option "ghost-limit" needs a value`},
	} {
		for _, json := range []bool{false, true} {
			args := []string{"checkpoint", pid, "-D", rig.img, "--leave-running", "--criu-opt", tc.opt}
			if json {
				args = append(args, "--json")
			}
			out, code := gpucrRun(t, rig.criuEnv, args...)
			out = strings.ReplaceAll(out, `\"`, `"`) // as JSON quotes it
			if code != 1 || !strings.Contains(out, tc.criu) || !strings.Contains(out, tc.hint) ||
				!strings.Contains(out, "before it touched the process") || strings.Contains(out, "dump.log") {
				t.Errorf("checkpoint --criu-opt %q (json %v): exit %d, want 1 with CRIU's complaint, a hint, and no log named:\n%s",
					tc.opt, json, code, out)
			}
		}
		if _, err := os.Stat(filepath.Join(rig.img, "dump.log")); err == nil {
			t.Errorf("--criu-opt %q: a dump.log appeared", tc.opt)
		}
	}
	if strings.Contains(helperLog(rig.h), "quiesce") {
		t.Errorf("the helper quiesced the process for a dump CRIU refused:\n%s", tail(helperLog(rig.h), 20))
	}
	at := a.lastIter()
	a.waitIter(at+5, 30*time.Second)
	cliOK(t, rig.h, rig.env, rig.img, "checkpoint", pid, "-D", rig.img, "--leave-running")
}
