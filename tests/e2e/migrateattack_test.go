package e2e

// What the owner of a job can do to root's `gpucr migrate` of it: plant
// files in the image directory while the dump runs, swap a symlink in for
// a file or a directory at the right moment, let a process of the tree die
// so that another process takes its pid. The owner is the tests' second
// user: it may write the image directory -D and the target's directory, as
// the owner of a job may where they are its own. (The job itself is
// root's here: CRIU run as root reads the rlimits of each process it
// dumps, which takes CAP_SYS_RESOURCE for another user's process, and the
// tests may run without it.) Root migrates the job to a "target" on this
// machine (the ssh stand-in runs the command line here through /bin/sh,
// as root, as sshd would at the target), whose gpucr is this one except
// for `restore`, which each test scripts.

import (
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

// fakeTarget writes the ssh stand-in and the target's gpucr into dir: the
// gpucr runs restoreScript (sh, "$@" being restore's arguments) for
// `restore`, and the real gpucr for everything else. It returns the
// --ssh and --target-gpucr words.
func fakeTarget(t *testing.T, dir, restoreScript string) (ssh, gpucr string) {
	t.Helper()
	ssh = filepath.Join(dir, "fake-ssh")
	copyText(t, ssh, "#!/bin/sh\nshift\nexec /bin/sh -c \"$1\"\n")
	gpucr = filepath.Join(dir, "fake-gpucr")
	copyText(t, gpucr, fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = restore ]; then\n%s\nfi\nexec %s \"$@\"\n", restoreScript, binPath(t, "gpucr")))
	for _, f := range []string{ssh, gpucr} {
		if err := os.Chmod(f, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return ssh, gpucr
}

// restoreOK is a target restore that reports pid as restored.
func restoreOK(pid int) string { return fmt.Sprintf(`echo '{"pid": %d}'; exit 0`, pid) }

// restoreFails is a target restore that fails.
const restoreFails = `echo '{"error": "restore refused by the test"}'; exit 1`

// waitMarker is shell text that waits (up to 60 s) until the file go exists,
// having created the file ready.
func waitMarker(ready, goFile string) string {
	return fmt.Sprintf("touch %s; i=0; while [ ! -e %s ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done", ready, goFile)
}

// startJob starts the job, detached in its own session, its output
// discarded; its exit is collected (as a shell does for its jobs).
func startJob(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return cmd
}

// migrateTo runs root's `gpucr migrate` of pid to the fake target.
func migrateTo(t *testing.T, h *helperProc, env []string, pid int, ssh, gpucr, img, remote string) (string, error) {
	t.Helper()
	return cli(t, h, env, "migrate", strconv.Itoa(pid), "--to", "target", "--ssh", ssh, "--target-gpucr", gpucr,
		"-D", img, "--target-dir", remote)
}

// TestMigrateSignalsOnlyItsTree: the job is a parent (SIGCHLD ignored: its
// children are reaped as they exit) and a child. While the target
// restores, the child is killed (its owner may), and the second user's
// process takes its pid (forced here through ns_last_pid: on a busy
// machine, 30,000 forks do it). That process is not SIGKILLed when the
// target runs, nor continued (SIGCONT) when the migration fails.
func TestMigrateSignalsOnlyItsTree(t *testing.T) {
	needTool(t, "criu")
	py := needTool(t, "python3")
	u := secondUser(t)
	for _, tc := range []struct {
		name    string
		restore func(pid int) string
	}{{"restored", restoreOK}, {"failed", func(int) string { return restoreFails }}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := gpucrEnv(t)
			h := startHelper(t, dir, env)
			kidFile := filepath.Join(dir, "kid")
			prog := "import os, signal, sys, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\nk = os.fork()\n" +
				"if k == 0:\n    time.sleep(100000)\n    os._exit(0)\nopen(sys.argv[1], 'w').write(str(k))\ntime.sleep(100000)\n"
			job := startJob(t, py, "-c", prog, kidFile)
			var kid int
			deadline := time.Now().Add(20 * time.Second)
			for kid == 0 && time.Now().Before(deadline) {
				b, _ := os.ReadFile(kidFile)
				kid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				time.Sleep(20 * time.Millisecond)
			}
			if kid == 0 {
				t.Fatal("the job's child did not start")
			}
			ready, goFile := filepath.Join(dir, "restoring"), filepath.Join(dir, "go")
			ssh, gpucr := fakeTarget(t, dir, waitMarker(ready, goFile)+"\n"+tc.restore(job.Process.Pid))
			type result struct {
				out string
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := migrateTo(t, h, env, job.Process.Pid, ssh, gpucr, filepath.Join(dir, "img"), filepath.Join(dir, "remote"))
				done <- result{out, err}
			}()
			deadline = time.Now().Add(90 * time.Second)
			for {
				if _, err := os.Stat(ready); err == nil {
					break
				}
				select {
				case r := <-done:
					t.Fatalf("gpucr migrate ended before the target's restore: %v\n%s", r.err, r.out)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("the target's restore did not start")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if st := procState(kid); st != "T" {
				t.Fatalf("the job's child %d is in state %q during the restore, not stopped", kid, st)
			}
			// Its parent ignores SIGCHLD: its pid is free at once.
			_ = syscall.Kill(kid, syscall.SIGKILL)
			waitPidFree(kid, 10*time.Second)
			victim := takePid(t, kid, u)
			if err := victim.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			waitState(t, kid, "T")
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			r := <-done
			t.Logf("gpucr migrate: %v\n%s", r.err, r.out)
			if tc.name == "restored" && r.err != nil {
				t.Errorf("gpucr migrate: %v\n%s", r.err, r.out)
			}
			if tc.name == "failed" && r.err == nil {
				t.Errorf("gpucr migrate did not fail:\n%s", r.out)
			}
			time.Sleep(200 * time.Millisecond)
			if st := procState(kid); st != "T" {
				t.Errorf("the process that took the pid %d of the job's dead child is in state %q after the migration, not stopped as it was (killed or continued)", kid, st)
			}
		})
	}
}

// takePid starts a process of u's (sleep) with pid pid: the kernel's next
// pid is set to it through ns_last_pid, a few times over if another fork
// took it first.
func takePid(t *testing.T, pid int, u otherUser) *exec.Cmd {
	t.Helper()
	sleep := needTool(t, "sleep")
	for range 200 {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0o644); err != nil {
			t.Skipf("cannot choose the next pid here: %v", err)
		}
		cmd := asUser(exec.Command(sleep, "100000"), u)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		if cmd.Process.Pid == pid {
			t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
			return cmd
		}
		_ = cmd.Process.Kill()
		<-done
	}
	t.Fatalf("no process could take pid %d", pid)
	return nil
}

// waitState waits until pid is in state st.
func waitState(t *testing.T, pid int, st string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for procState(pid) != st {
		if time.Now().After(deadline) {
			t.Fatalf("process %d is in state %q, not %q", pid, procState(pid), st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
