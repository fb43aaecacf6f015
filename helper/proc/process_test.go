package proc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the processes the tests hold: with
// GPUCR_PROC_TEST_CONNECT it connects to that unix socket and exits; with
// GPUCR_PROC_TEST_SLEEP it sleeps until killed.
func TestMain(m *testing.M) {
	if path := os.Getenv("GPUCR_PROC_TEST_CONNECT"); path != "" {
		c, err := net.Dial("unix", path)
		if err != nil {
			os.Exit(3)
		}
		_, _ = c.Write([]byte("x"))
		os.Exit(0) // the connection closes with the process; the test keeps its end
	}
	if os.Getenv("GPUCR_PROC_TEST_SLEEP") != "" {
		if os.Getenv("GPUCR_PROC_TEST_UNDUMPABLE") != "" {
			if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
				os.Exit(4)
			}
			fmt.Println("undumpable")
		}
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GPUCR_PROC_TEST_SLEEP=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	return cmd
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Exited not closed within 10 s", what)
	}
}

// A held process runs until it exits; a zombie has exited; Exited is closed
// at the exit, and Check names the pid.
func TestProcessExit(t *testing.T) {
	cmd := sleeper(t)
	pid := Pid(cmd.Process.Pid)
	p, err := Open(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.HasPidfd() {
		t.Log("no pidfd on this kernel: held by pid and start time")
	}
	if !p.Running() || p.Check() != nil || p.Pid() != pid || p.Start() == 0 || p.UID() != uint32(os.Geteuid()) {
		t.Fatalf("a sleeping child: running %v, check %v, pid %d, start %d, uid %d", p.Running(), p.Check(), p.Pid(), p.Start(), p.UID())
	}
	select {
	case <-p.Exited():
		t.Fatal("Exited closed while the child sleeps")
	case <-time.After(50 * time.Millisecond):
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie, which has exited all the same.
	waitClosed(t, p.Exited(), "a killed child")
	if p.Running() {
		t.Error("a zombie counts as running")
	}
	err = p.Check()
	var ge *GoneError
	if !errors.Is(err, ErrGone) || !errors.As(err, &ge) || ge.Pid != pid {
		t.Errorf("Check of a dead child = %v", err)
	}
	if _, err := Open(pid); !errors.Is(err, ErrGone) {
		t.Errorf("Open of a zombie = %v, want ErrGone", err)
	}
	_, _ = cmd.Process.Wait()
	if _, err := Open(pid); !errors.Is(err, ErrGone) {
		t.Errorf("Open of a reaped pid = %v, want ErrGone", err)
	}
}

// Close ends the wait without closing Exited; the process is not known to
// run any more.
func TestProcessClose(t *testing.T) {
	cmd := sleeper(t)
	p, err := Open(Pid(cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	ch := p.Exited()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
		t.Error("Exited closed by Close")
	case <-time.After(100 * time.Millisecond):
	}
	if p.Running() {
		t.Error("a closed Process still says it runs")
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// forcePid makes the next process forked get pid (root: the pid namespace's
// ns_last_pid); it returns false where that cannot be done.
func forcePid(pid Pid) bool {
	return os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(int(pid-1))), 0) == nil
}

// A process that takes a dead process's pid is another process: the held
// one stays gone, Same tells them apart, and OpenStarted with the old start
// time refuses the new one.
func TestPidReuse(t *testing.T) {
	first := sleeper(t)
	pid := Pid(first.Process.Pid)
	p, err := Open(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_ = first.Process.Kill()
	_, _ = first.Process.Wait()
	// Start times count clock ticks (10 ms): a successor started within
	// the same tick would have the same one.
	time.Sleep(30 * time.Millisecond)
	var second *exec.Cmd
	for try := 0; try < 20 && second == nil; try++ {
		if !forcePid(pid) {
			t.Skip("cannot choose the next pid (not root?)")
		}
		c := sleeper(t)
		if Pid(c.Process.Pid) == pid {
			second = c
		}
	}
	if second == nil {
		t.Skip("another process took the pid each time")
	}
	if p.Running() {
		t.Fatal("the held process runs again once its pid is reused")
	}
	q, err := Open(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if Same(p, q) {
		t.Error("Same says the dead process and its pid's new owner are one")
	}
	if !Same(q, q) {
		t.Error("Same(q, q) is false")
	}
	if _, err := OpenStarted(pid, p.Start()); !errors.Is(err, ErrGone) {
		t.Errorf("OpenStarted with the old start time = %v, want ErrGone", err)
	}
}

func listen(t *testing.T) *net.UnixListener {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func peerOf(t *testing.T, c *net.UnixConn) (*Process, error) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		t.Fatal(err)
	}
	if cerr != nil {
		t.Fatal(cerr)
	}
	return Peer(rc, cred)
}

// The peer of a connection is the process that connected: one that is gone
// by the time the connection is looked at (its pid free for another) is
// refused, one that is there is held, and its exit is seen.
func TestPeer(t *testing.T) {
	ln := listen(t)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "GPUCR_PROC_TEST_CONNECT="+ln.Addr().String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("connecting child: %v\n%s", err, out)
	}
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p, err := peerOf(t, c); !errors.Is(err, ErrGone) {
		t.Fatalf("the peer of a connection whose process has exited and was reaped: %v, %v; want ErrGone", p, err)
	}

	// A live peer: this test process itself.
	d, err := net.DialUnix("unix", nil, ln.Addr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c2, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	p, err := peerOf(t, c2)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Pid() != Pid(os.Getpid()) || !p.Running() || p.UID() != uint32(os.Geteuid()) {
		t.Errorf("peer = %v running %v uid %d, want this process", p, p.Running(), p.UID())
	}
	self, err := Open(Pid(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	if !Same(p, self) {
		t.Error("Same(peer, self) is false for one process")
	}
}

func TestParseStat(t *testing.T) {
	line := "4242 (a) b (c)) S 1 4242 4240 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
	st, err := parseStat(4242, []byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != 'S' || st.PPid != 1 || st.Session != 4240 || st.Flags != 4194560 || st.Start != 123456 || !st.Alive() {
		t.Errorf("parseStat = %+v", st)
	}
	for _, bad := range []string{"", "1 (x S", "1 (x) S 1", "1 (x) S x 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 0 0 5"} {
		if _, err := parseStat(1, []byte(bad)); err == nil {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
	if st, _ := parseStat(1, []byte(fmt.Sprintf("1 (x) Z 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 0 0 %d", 7))); st.Alive() {
		t.Error("a zombie is alive")
	}
}

// A shell with two sleeps: its tree is itself and the two; Children finds
// them through the task files and through the parents alike.
func TestTree(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & sleep 60 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
	pid := Pid(cmd.Process.Pid)
	var tree []Pid
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if tree = Tree(pid); len(tree) == 3 {
			break
		}
	}
	if len(tree) != 3 || tree[0] != pid {
		t.Fatalf("tree of %d: %v, want it and its two sleeps", pid, tree)
	}
	kids, err := Children(pid)
	if err != nil || !slices.Equal(kids, tree[1:]) {
		t.Fatalf("children %v (%v), tree %v", kids, err, tree)
	}
	if byParent, err := childrenByParent(pid); err != nil || !slices.Equal(byParent, kids) {
		t.Fatalf("children by parent %v (%v), want %v", byParent, err, kids)
	}
	if _, err := Children(4194304); err == nil {
		t.Error("children of a missing pid")
	}
	if !Exists(pid) || Exists(4194304) {
		t.Error("Exists")
	}
}

// Creds says what a process runs as: this one runs as its own ids alone; a
// process of another user that made itself not dumpable (as a set-user-ID
// program is made) does not run only as that user: its /proc directory is
// root's.
func TestCreds(t *testing.T) {
	self, err := Open(Pid(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	c, err := self.Creds()
	if err != nil {
		t.Fatal(err)
	}
	if uid, gid := uint32(os.Geteuid()), uint32(os.Getegid()); !c.RunsOnlyAs(uid, gid) || c.RunsOnlyAs(uid+1, gid) || c.RunsOnlyAs(uid, gid+1) {
		t.Errorf("this process: %v", c)
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: no process of another user to look at")
	}
	const nobody = 65534
	// A copy of this test binary that nobody may run (go test builds it in
	// a directory only its builder may enter).
	dir, err := os.MkdirTemp("", "gpucr-proc-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "proc.test")
	if b, err := os.ReadFile(os.Args[0]); err != nil || os.WriteFile(bin, b, 0o755) != nil || os.Chmod(dir, 0o755) != nil {
		t.Fatalf("a copy of the test binary: %v", err)
	}
	for _, undumpable := range []bool{false, true} {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "GPUCR_PROC_TEST_SLEEP=1")
		if undumpable {
			cmd.Env = append(cmd.Env, "GPUCR_PROC_TEST_UNDUMPABLE=1")
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
		if undumpable {
			if _, err := out.Read(make([]byte, 16)); err != nil {
				t.Fatalf("the child did not make itself undumpable: %v", err)
			}
		}
		p, err := Open(Pid(cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		c, err := p.Creds()
		if err != nil {
			t.Fatal(err)
		}
		if got := c.RunsOnlyAs(nobody, nobody); got == undumpable {
			t.Errorf("a process of uid %d, undumpable %v: runs only as it: %v (%v)", nobody, undumpable, got, c)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_, _ = cmd.Process.Wait()
		if _, err := p.Creds(); !errors.Is(err, ErrGone) {
			t.Errorf("Creds of a process that exited: %v; want ErrGone", err)
		}
	}
}

// TestNsSession: a process's session in its own pid namespace is what
// getsid gives inside it: this process's own, and 0 for pid 1 of a new pid
// namespace that stayed in this process's session (its leader is outside).
func TestNsSession(t *testing.T) {
	want, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	if sid, ok := NsSession(Pid(os.Getpid())); !ok || sid != Pid(want) {
		t.Errorf("NsSession(self) = %d, %v; getsid says %d", sid, ok, want)
	}
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("no new pid namespace here: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if sid, ok := NsSession(Pid(cmd.Process.Pid)); !ok || sid != 0 {
		t.Errorf("NsSession of pid 1 of a new namespace in this session = %d, %v; want 0, true", sid, ok)
	}
	if _, ok := NsSession(Pid(1 << 30)); ok {
		t.Errorf("NsSession of no process says it knows")
	}
}
