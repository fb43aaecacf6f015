package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/helper/swrk"
)

// SelfTest judges a CRIU by a real dump and restore, as
// scripts/criu-selftest.sh does (`criu check` says "Looks good" for a CRIU
// that then hangs in every dump), and through the same path as `gpucr
// checkpoint`: `criu swrk` in a private world (package swrk), under a
// deadline, with gpucr's plugin loaded through the private CRIU
// configuration. A shell loop in its own session appends a
// counter to a file; the dump kills it, the counter must stop; the restore
// brings it back, the counter must go on; then it is killed.

// selfTestLoop appends a counter to $1 every 0.1 s.
const selfTestLoop = `i=0; while :; do i=$((i+1)); echo $i >> "$1"; sleep 0.1; done`

// closeOnExecAbove2 marks every fd of this process above stderr
// close-on-exec, so that the test loop inherits none: Go opens its own so,
// but not an fd gpucr inherited (a caller's lock file, say, which CRIU
// refuses to dump without --file-locks). The shell cannot do it itself
// (dash's redirections take one-digit fds only).
func closeOnExecAbove2() {
	for _, fd := range proc.OwnFDs() {
		if fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

// SelfTestResult is how the self-test went.
type SelfTestResult struct {
	Err           error
	Dump, Restore time.Duration
	DumpRan       bool     // CRIU ran the dump and wrote its log (whether or not it succeeded)
	PluginLoaded  bool     // the dump log shows CRIU loaded gpucr's plugin
	DumpErrors    []string // CRIU's errors of the dump (for a plugin that did not load)
}

// selfTestWait bounds the waits for the test loop (to start, to stop, to
// go on after the restore).
const selfTestWait = 5 * time.Second

// SelfTest runs the self-test with c's CRIU and plugin directory, each step
// within c's timeout.
func SelfTest(c CRIU, env Environment) (res SelfTestResult) {
	criuPath, pluginDir, limit := c.Binary, c.PluginDir, c.timeout()
	base := env.TempDir
	if base == "" {
		base = "/tmp"
	}
	tmp, err := os.MkdirTemp(base, "gpucr-check-")
	if err != nil {
		res.Err = err
		return res
	}
	defer os.RemoveAll(tmp)
	count := filepath.Join(tmp, "count")
	img := filepath.Join(tmp, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		res.Err = err
		return res
	}
	closeOnExecAbove2()
	loop := exec.Command("/bin/sh", "-c", selfTestLoop, "gpucr-check-loop", count)
	loop.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // stdio: /dev/null (os/exec)
	if err := loop.Start(); err != nil {
		res.Err = fmt.Errorf("start the test loop: %w", err)
		return res
	}
	pid := loop.Process.Pid
	// The loop goes, whatever happened. Its session (and process group) is
	// killed only while its leader is this process's unreaped child, the
	// original or the restored one, so the pid cannot name another group.
	reaped, restored := false, false
	defer func() {
		switch {
		case !reaped:
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = loop.Wait()
		case restored: // RstSibling: the restored loop is this process's child
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			var ws unix.WaitStatus
			_, _ = unix.Wait4(pid, &ws, 0, nil)
		}
	}()
	if !waitCounter(count, func(n int) bool { return n >= 3 }) {
		res.Err = errors.New("the test loop does not run")
		return res
	}

	sess, err := newSession(base, pluginDir, nil)
	if err != nil {
		res.Err = err
		return res
	}
	defer sess.close()
	d, err := os.Open(img)
	if err != nil {
		res.Err = err
		return res
	}
	defer d.Close()
	work, err := sess.workDir()
	if err != nil {
		res.Err = err
		return res
	}
	defer work.Close()
	// As gpucr checkpoint runs CRIU: no configuration but the session's,
	// only the session's environment. The images directory is this
	// check's own private one.
	cmd := swrk.Cmd{CRIU: criuPath, Env: sess.criuEnv(env), Deadline: limit}
	opts := func(log string) *rpc.CriuOpts {
		o := &rpc.CriuOpts{ImagesDirFd: proto.Int32(int32(d.Fd())), WorkDirFd: proto.Int32(int32(work.Fd())),
			LogFile: proto.String(log), LogLevel: proto.Int32(4), Timeout: proto.Uint32(uint32(max(1, limit/time.Second)))}
		if sess.config != "" {
			o.ConfigFile = proto.String(sess.config)
		}
		return o
	}
	uname := "?"
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		uname = unix.ByteSliceToString(u.Release[:])
	}

	dumpOpts := opts("dump.log")
	dumpOpts.Pid = proto.Int32(int32(pid))
	start := time.Now()
	out := cmd.Dump(dumpOpts, nil)
	res.Dump = time.Since(start)
	if log, err := os.ReadFile(filepath.Join(sess.dir, "dump.log")); err == nil {
		res.DumpRan = true
		res.PluginLoaded = criuPluginLoaded(string(log), "gpucr")
		res.DumpErrors, _ = criuLogErrors(strings.NewReader(string(log)), 3)
	}
	if res.Err = stepFailed("dump", out, limit, uname, filepath.Join(sess.dir, "dump.log"), sess); res.Err != nil {
		return res
	}
	if err := reapWithin(loop, selfTestWait); err != nil {
		res.Err = fmt.Errorf("after the dump: %w", err)
		return res
	}
	reaped = true
	// Until its sleep is reaped too (by pid 1, in its own time), the
	// session's pid is still taken and the restore would fail.
	if !waitSessionEmpty(pid, selfTestWait) {
		res.Err = fmt.Errorf("processes of session %d are still there after the dump", pid)
		return res
	}
	atDump, _ := lastCount(count)
	time.Sleep(300 * time.Millisecond)
	if n, _ := lastCount(count); n != atDump {
		res.Err = fmt.Errorf("the dump did not stop the test loop (counter %d, then %d)", atDump, n)
		return res
	}

	restoreOpts := opts("restore.log")
	restoreOpts.RstSibling = proto.Bool(true)
	start = time.Now()
	cmd.KillNew = true
	out = cmd.Restore(restoreOpts, nil)
	res.Restore = time.Since(start)
	if res.Err = stepFailed("restore", out, limit, uname, filepath.Join(sess.dir, "restore.log"), sess); res.Err != nil {
		return res
	}
	restored = true
	if !waitCounter(count, func(n int) bool { return n > atDump }) {
		n, _ := lastCount(count)
		res.Err = fmt.Errorf("the restored test loop does not run (counter %d at the dump, %d now)", atDump, n)
	}
	return res
}

// stepFailed says why a self-test step failed, nil if it did not.
func stepFailed(step string, out swrk.Outcome, limit time.Duration, uname, log string, sess *criuSession) error {
	switch {
	case out.TimedOut:
		return fmt.Errorf("criu %s did not finish within %v (this CRIU hangs on this kernel, Linux %s?)", step, limit, uname)
	case out.Err != nil:
		msgs, _ := criuLogFile(log, 3)
		msgs = append(sess.pluginLines(), msgs...)
		if len(msgs) == 0 {
			msgs = []string{out.Err.Error()}
		}
		return fmt.Errorf("criu %s failed: %s", step, strings.Join(msgs, "; "))
	}
	return nil
}

// waitCounter waits until the counter file's last number satisfies ok.
func waitCounter(path string, ok func(int) bool) bool {
	deadline := time.Now().Add(selfTestWait)
	for {
		if n, err := lastCount(path); err == nil && ok(n) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lastCount(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	lines := strings.Fields(string(b))
	if len(lines) == 0 {
		return 0, errors.New("empty")
	}
	return strconv.Atoi(lines[len(lines)-1])
}

// reapWithin waits for cmd (killed by the dump) to exit.
func reapWithin(cmd *exec.Cmd, wait time.Duration) error {
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("the test loop (pid %d) still runs %v after its dump", cmd.Process.Pid, wait)
	}
}

// waitSessionEmpty waits until no process (a zombie included) holds sid as
// its pid, process group or session.
func waitSessionEmpty(sid int, wait time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return len(proc.WaitReleased(ctx, []proc.Pid{proc.Pid(sid)})) == 0
}
