package e2e

// What a user of a helper socket open to every user (--socket-mode 0666, as
// a shared machine needs) can make the helper do. It must survive running
// out of file descriptors, close connections that stall in the middle of a
// frame, keep its memory bounded under a flood of large frames, and hold
// each uid to its GPU memory limit; the applications it serves must not
// notice any of it.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/internal/testroot"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// sharedDir is a directory every user can reach (t.TempDir's parents are
// 0700), for a helper socket other users connect to.
func sharedDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "gpucr-limits-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// dialAs opens n connections to sock as user u (nil: as the test, root),
// each followed by then (if set) before the next is opened.
// The helper reads a connection's uid from SO_PEERCRED, which the kernel
// takes from the connecting thread's effective ids at connect time. So the
// connections are made on a thread of their own whose effective uid and gid
// alone change: the raw setresuid/setresgid system calls act on the calling
// thread only (Go's wrappers would change every thread), and the runtime
// starts no thread from a locked one. If the ids cannot be set back, the
// goroutine ends locked, and the runtime ends the thread with it.
func dialAs(t testing.TB, sock string, u *otherUser, n int, then func(*net.UnixConn) error) []*net.UnixConn {
	t.Helper()
	conns, err := dialAsErr(sock, u, n, then)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	if err != nil {
		t.Fatalf("connecting to %s as %v: %v", sock, u, err)
	}
	return conns
}

// dialAsErr is dialAs that returns the connections it made and the error
// that stopped it.
func dialAsErr(sock string, u *otherUser, n int, then func(*net.UnixConn) error) ([]*net.UnixConn, error) {
	type result struct {
		conns []*net.UnixConn
		err   error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() { done <- r }()
		runtime.LockOSThread()
		const keep = ^uintptr(0) // -1: leave that id as it is
		if u != nil {
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(u.GID), keep); e != 0 {
				runtime.UnlockOSThread()
				r.err = fmt.Errorf("setresgid: %w", e)
				return
			}
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(u.UID), keep); e != 0 {
				r.err = fmt.Errorf("setresuid: %w", e)
				return // locked: the thread ends (its egid is not root's)
			}
		}
		for i := 0; i < n && r.err == nil; i++ {
			var c *net.UnixConn
			if c, r.err = net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"}); r.err == nil {
				r.conns = append(r.conns, c)
				if then != nil {
					r.err = then(c)
				}
			}
		}
		if u != nil {
			_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep)
			_, _, e2 := unix.RawSyscall(unix.SYS_SETRESGID, keep, 0, keep)
			if e1 != 0 || e2 != 0 {
				r.err = fmt.Errorf("back to root: %v, %v (%v)", e1, e2, r.err)
				return // locked: the thread ends
			}
		}
		runtime.UnlockOSThread()
	}()
	r := <-done
	return r.conns, r.err
}

// sayHello sends Hello with role on c and reads the answer.
func sayHello(c *net.UnixConn, role helperpb.Role) error {
	_, err := helloWith(c, role, 0)
	return err
}

// helloWith sends Hello with role and token on c and returns the answer.
func helloWith(c *net.UnixConn, role helperpb.Role, token uint64) (*helperpb.HelloReply, error) {
	w, err := wire.New(c)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if err := w.Write(&helperpb.Request{Id: 1, Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
		ProtocolVersion: wire.Version, Role: role, ClientToken: token, Program: "limits-test"}}}, nil); err != nil {
		return nil, err
	}
	r, _, err := w.ReadResponse()
	if err != nil {
		return nil, err
	}
	if r.GetHello() == nil {
		return nil, fmt.Errorf("Hello answered %v", r)
	}
	return r.GetHello(), nil
}

// askStatus sends Status on a connection that said Hello as ROLE_CLI.
func askStatus(c *net.UnixConn) error {
	w, err := wire.New(c)
	if err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if err := w.Write(&helperpb.Request{Id: 2, Body: &helperpb.Request_Status{Status: &helperpb.Status{}}}, nil); err != nil {
		return err
	}
	// The answer is looked at, not decoded: decoding every client of every
	// reply (in a test binary built with -race) would take the CPU the
	// helper and root's status are measured with.
	body, fds, err := w.ReadFrame()
	if err != nil {
		return err
	}
	wire.CloseFDs(fds)
	if !hasField(body, statusResponseField) {
		return fmt.Errorf("Status answered a frame of %d bytes with no status", len(body))
	}
	return nil
}

// statusResponseField is Response's status, in protocol/helper.proto.
const statusResponseField = 8

// hasField says whether the encoded message b has a top-level field num.
func hasField(b []byte, num protowire.Number) bool {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return false
		}
		if n == num {
			return true
		}
		m := protowire.ConsumeFieldValue(n, typ, b[l:])
		if m < 0 {
			return false
		}
		b = b[l+m:]
	}
	return false
}

// beginFrame sends the length of a frame of n bytes and the first part
// bytes of it (zeros), and no more.
func beginFrame(c *net.UnixConn, n, part int) error {
	b := make([]byte, 4+part)
	binary.LittleEndian.PutUint32(b, uint32(n))
	_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
	_, err := c.Write(b)
	return err
}

func fdCount(t testing.TB, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// settledFDs is pid's number of open descriptors once it has not changed
// for half a second (a new helper opens its copy lanes' in the background).
func settledFDs(t testing.TB, pid int) int {
	t.Helper()
	n, same := fdCount(t, pid), 0
	for deadline := time.Now().Add(10 * time.Second); same < 5 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if m := fdCount(t, pid); m == n {
			same++
		} else {
			n, same = m, 0
		}
	}
	return n
}

// procStatusKiB reads a "Name: N kB" line of /proc/PID/status.
func procStatusKiB(t testing.TB, pid int, name string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status %s: %q", pid, name, v)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, name)
	return 0
}

func (h *helperProc) pid() int { return h.cmd.Process.Pid }

func (h *helperProc) alive() bool {
	s := procState(h.pid())
	return s != "" && s != "Z"
}

func (h *helperProc) logText() string {
	b, _ := os.ReadFile(h.log)
	return string(b)
}

// waitStatus waits until the helper answers gpucr status again.
func (h *helperProc) waitStatus(timeout time.Duration) *status {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, err := h.statusErr()
		if err == nil {
			return st
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("the helper does not answer %v later: %v\nlog:\n%s", timeout, err, tail(h.logText(), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHelperSurvivesFDExhaustion: connections from root and from another
// user, far more than the helper's file descriptor limit allows, make its
// accepts fail (EMFILE). The helper backs off and goes on, logs the burst
// once, answers again once the connections are gone, and the application it
// served all along keeps its memory and stays checkpointable.
func TestHelperSurvivesFDExhaustion(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--socket-mode", "0666")
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--buffers", "4", "--interval-ms", "20")
	a.waitIter(5, 30*time.Second)
	_, bytes0, ok := h.client(a.pid)
	if !ok || bytes0 < 16<<20 {
		t.Fatalf("status: pid %d listed %v with %d bytes", a.pid, ok, bytes0)
	}

	// Lowering the soft limit needs no privilege (raising it back up to
	// the hard limit neither).
	pid := h.pid()
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatal(err)
	}
	low := unix.Rlimit{Cur: uint64(settledFDs(t, pid) + 16), Max: old.Max}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &low, nil); err != nil {
		t.Fatalf("lowering the helper's RLIMIT_NOFILE: %v", err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil && h.alive() {
				t.Errorf("restoring the helper's RLIMIT_NOFILE: %v", err)
			}
		}
	}
	defer restore()
	// A helper that exits on the first failed accept takes its socket
	// with it: later connections fail, which the checks below report.
	conns, _ := dialAsErr(h.socket, nil, 150, nil)
	more, _ := dialAsErr(h.socket, &u, 150, nil)
	conns = append(conns, more...)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for h.alive() && !strings.Contains(h.logText(), "accepting connections failed") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // more failed accepts, backing off
	if !h.alive() {
		t.Fatalf("the helper exited when it ran out of file descriptors; log:\n%s", tail(h.logText(), 20))
	}
	if !strings.Contains(h.logText(), "accepting connections failed") {
		t.Fatalf("%d connections against a limit of %d file descriptors, and no accept failed; log:\n%s",
			len(conns), low.Cur, tail(h.logText(), 20))
	}
	// The limit first: a helper that accepts the dead connections left in
	// its backlog with too few descriptors would only start a new burst.
	restore()
	for _, c := range conns {
		c.Close()
	}

	st := h.waitStatus(20 * time.Second)
	found := false
	for _, c := range st.Clients {
		if p, _ := c.Pid.Int64(); int(p) != a.pid {
			continue
		}
		found = true
		if b, _ := c.Bytes.Int64(); b != bytes0 || !c.ControlConnected || !c.Checkpointable {
			t.Errorf("after the flood: %d bytes (%d before), control connected %v, checkpointable %v %v",
				b, bytes0, c.ControlConnected, c.Checkpointable, c.NotCheckpointable)
		}
	}
	if !found {
		t.Fatalf("pid %d is no longer a client after the flood: %+v", a.pid, st.Clients)
	}
	if n := strings.Count(h.logText(), "accepting connections failed"); n != 1 {
		t.Errorf("the burst of failed accepts was logged %d times, want once", n)
	}
	if !strings.Contains(h.logText(), "accepting connections again") {
		t.Errorf("the helper did not log that it accepts again")
	}
	img := filepath.Join(t.TempDir(), "img")
	if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running"); err != nil ||
		!strings.Contains(out, "state running") {
		t.Fatalf("checkpoint after the flood: %v\n%s", err, out)
	}
	a.waitIter(a.lastIter()+5, 30*time.Second)
}

// TestStalledFramesClosed: another user's connections that begin a frame
// (a length and part of the body) and then send nothing more are closed
// once the frame timeout (10 s by default) has passed, whether they said
// Hello first or not; connections idle between frames stay, and the
// helper's file descriptors go back to what it had.
func TestStalledFramesClosed(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	h := startHelper(t, dir, gpucrEnv(t), "--socket-mode", "0666")
	fd0 := settledFDs(t, h.pid())
	// Before Hello, at most a quarter of --max-pending-connections (256 of
	// 1024) per uid.
	hello := func(c *net.UnixConn) error { return sayHello(c, helperpb.Role_ROLE_CLI) }
	stall := func(c *net.UnixConn) error { return beginFrame(c, 1000, 100) }
	stalled := dialAs(t, h.socket, &u, 50, stall)
	stalled = append(stalled, dialAs(t, h.socket, &u, 100, func(c *net.UnixConn) error {
		if err := hello(c); err != nil {
			return err
		}
		return stall(c)
	})...)
	idle := dialAs(t, h.socket, &u, 10, hello)
	start := time.Now()
	deadline := start.Add(10*time.Second + 15*time.Second)
	open := 0
	for _, c := range stalled {
		_ = c.SetReadDeadline(deadline)
		_, err := c.Read(make([]byte, 64))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			open++
		} else if err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("a stalled connection: %v", err)
		}
	}
	if open > 0 {
		t.Fatalf("%d of %d connections with a stalled frame still open %v later", open, len(stalled), time.Since(start).Round(time.Second))
	}
	if took := time.Since(start); took < 5*time.Second {
		t.Errorf("stalled connections closed after %v, before the frame timeout", took)
	}
	for i, c := range idle {
		if err := askStatus(c); err != nil {
			t.Errorf("idle connection %d after the frame timeout: %v", i, err)
		}
	}
	waitForCond(t, 10*time.Second, func() bool { return fdCount(t, h.pid()) <= fd0+len(idle)+2 },
		func() string { return fmt.Sprintf("the helper has %d fds, %d before", fdCount(t, h.pid()), fd0) })
}

func waitForCond(t testing.TB, timeout time.Duration, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// floodRSSBound is how much the helper's peak resident memory may grow while
// another user floods it. That user's frames being read hold at most 16 MiB
// (the per-uid budget; frames longer than a role's cap are refused before
// anything is allocated), 400 connections about 5 MiB (a goroutine and
// buffers each), and the Go collector lets the heap reach about twice what
// is live: some 45 MiB.
const floodRSSBound = 64 << 20

// TestHelperMemoryBoundedUnderFlood: 200 connections of another user each
// announce a 16 MiB frame (half of them before Hello, half after a CLI
// Hello) and send 4 MiB of it, and 200 more say Hello and send most of a
// request of 60 KiB (under the cap) and stop.
// The helper's peak resident memory grows by less than floodRSSBound, and
// it answers Status throughout.
func TestHelperMemoryBoundedUnderFlood(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	h := startHelper(t, dir, gpucrEnv(t), "--socket-mode", "0666")
	pid := h.pid()
	h.status()
	rss0 := procStatusKiB(t, pid, "VmRSS") << 10
	hello := func(c *net.UnixConn) error { return sayHello(c, helperpb.Role_ROLE_CLI) }
	// A refused frame makes the write fail (the helper closed the
	// connection); that is no error of the test.
	refused := 0
	announce := func(c *net.UnixConn) error {
		if beginFrame(c, wire.MaxFrame, 4<<20) != nil {
			refused++
		}
		return nil
	}
	big := dialAs(t, h.socket, &u, 100, announce)
	big = append(big, dialAs(t, h.socket, &u, 100, func(c *net.UnixConn) error {
		if err := hello(c); err != nil {
			return err
		}
		return announce(c)
	})...)
	dialAs(t, h.socket, &u, 200, func(c *net.UnixConn) error {
		if err := hello(c); err != nil {
			return err
		}
		return beginFrame(c, 60<<10, 48<<10)
	})
	if _, err := h.statusErr(); err != nil {
		t.Errorf("status during the flood: %v", err)
	}
	time.Sleep(time.Second) // whatever the helper reads, it has read
	peak := procStatusKiB(t, pid, "VmHWM") << 10
	t.Logf("resident memory %d MiB before, peak %d MiB; %d of %d large frames refused (the helper closed the connection)",
		rss0>>20, peak>>20, refused, len(big))
	if peak-rss0 > floodRSSBound {
		t.Errorf("the helper's peak resident memory grew by %d MiB under the flood, more than %d MiB",
			(peak-rss0)>>20, floodRSSBound>>20)
	}
	if _, err := h.statusErr(); err != nil {
		t.Errorf("status after the flood: %v", err)
	}
	if !h.alive() {
		t.Fatal("the helper died")
	}
}

// runUnderAs runs argv under `gpucr run` as user u (nil: root) to its end.
func runUnderAs(t testing.TB, h *helperProc, env []string, u *otherUser, argv ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binPath(t, "gpucr"), append([]string{"run", "--socket", h.socket, "--"}, argv...)...)
	cmd.Env = env
	if u != nil {
		asUser(cmd, *u)
	}
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v still running after a minute:\n%s", argv, out)
	}
	return exitCode(string(out), err)
}

// TestGPUMemoryLimitPerUID: with --max-gpu-memory-per-uid 40M, another
// user's application holding 24 MiB runs; a second one of that user, which
// would take the uid past 40 MiB, gets CUDA_ERROR_OUT_OF_MEMORY, and the
// interposer prints the helper's reason, which names the limit. Root is not
// limited, and once the first application is gone the second one fits.
func TestGPUMemoryLimitPerUID(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--socket-mode", "0666", "--max-gpu-memory-per-uid", "40M")
	hb := func(mib, iters, interval string) []string {
		return []string{binPath(t, "heartbeat"), "--mib", mib, "--buffers", "3", "--iters", iters, "--interval-ms", interval}
	}
	first := startUnderCmd(t, dir, h, env, "heartbeat", hb("24", "100000", "20"), func(c *exec.Cmd) { asUser(c, u) })
	first.waitIter(3, 30*time.Second)
	if _, b, ok := h.client(first.pid); !ok || b < 24<<20 || b > 40<<20 {
		t.Fatalf("the first application: listed %v with %d bytes", ok, b)
	}

	out, code := runUnderAs(t, h, env, &u, hb("24", "3", "0")...)
	if code == 0 || !strings.Contains(out, "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Fatalf("a second application of uid %d past its limit: exit %d, want CUDA_ERROR_OUT_OF_MEMORY:\n%s", u.UID, code, tail(out, 10))
	}
	if want := fmt.Sprintf("GPU memory limit of uid %d reached: it may hold 40 MiB", u.UID); !strings.Contains(out, want) {
		t.Errorf("the interposer did not say why (%q):\n%s", want, tail(out, 10))
	}
	if strings.Contains(out, "not checkpointable") {
		t.Errorf("the refused allocation fell back to local memory:\n%s", tail(out, 10))
	}

	if out, code := runUnderAs(t, h, env, nil, hb("48", "3", "0")...); code != 0 {
		t.Fatalf("root, 48 MiB: exit %d:\n%s", code, tail(out, 10))
	}

	first.kill()
	waitNoClients(t, h, 10*time.Second)
	if out, code := runUnderAs(t, h, env, &u, hb("24", "3", "0")...); code != 0 {
		t.Fatalf("uid %d alone again, 24 MiB: exit %d:\n%s", u.UID, code, tail(out, 10))
	}
}

// unitSettings reads the helper's systemd unit: key -> values, in order.
func unitSettings(t testing.TB) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testroot.Dir(t), "scripts", "gpucr-helper.service"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = append(m[k], v)
		}
	}
	return m
}

// TestHelperUnitSettings: the systemd unit's helper starts with its
// ExecStart's flags (socket moved to a test directory) and answers; the unit
// keeps it alive (Restart=always, no start limit), protects it from the OOM
// killer without making it immune, and sets no memory limit, which would
// get it killed writing an image into a tmpfs (the unit's comments say why).
// systemd itself cannot run here; install_test.go has systemd-analyze
// verify the unit.
func TestHelperUnitSettings(t *testing.T) {
	u := unitSettings(t)
	one := func(k string) string {
		t.Helper()
		if len(u[k]) != 1 {
			t.Fatalf("the unit sets %s %d times, want once: %q", k, len(u[k]), u[k])
		}
		return u[k][0]
	}
	if v := one("Restart"); v != "always" {
		t.Errorf("Restart=%s, want always", v)
	}
	if v := one("StartLimitIntervalSec"); v != "0" {
		t.Errorf("StartLimitIntervalSec=%s, want 0: never stop restarting the helper", v)
	}
	adj, err := strconv.Atoi(one("OOMScoreAdjust"))
	if err != nil || adj <= -1000 || adj >= 0 {
		t.Errorf("OOMScoreAdjust=%s: want protected (below 0) but not immune (above -1000)", one("OOMScoreAdjust"))
	}
	for _, k := range []string{"MemoryMax", "MemoryHigh", "MemoryLimit"} {
		if len(u[k]) > 0 {
			t.Errorf("the unit sets %s=%s: image pages written into a tmpfs count against it", k, u[k][0])
		}
	}
	argv := strings.Fields(one("ExecStart"))
	if len(argv) < 2 || filepath.Base(argv[0]) != "gpucr" || argv[1] != "helper" {
		t.Fatalf("ExecStart=%s", one("ExecStart"))
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "helper.sock")
	args := argv[1:]
	for i := range args {
		if args[i] == "--socket" && i+1 < len(args) {
			args[i+1] = sock
		}
	}
	h := &helperProc{t: t, socket: sock, log: filepath.Join(dir, "helper.log")}
	f, err := os.Create(h.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h.cmd = exec.Command(binPath(t, "gpucr"), args...)
	h.cmd.Env = gpucrEnv(t)
	h.cmd.Stdout, h.cmd.Stderr = f, f
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.stop)
	if st := h.waitStatus(20 * time.Second); len(st.Devices) == 0 {
		t.Errorf("the unit's helper lists no device: %+v", st)
	}
}

// silentClient registers as an interposer would (a calls connection, then a
// control connection with its token) and then never reads nor answers
// anything on the control connection.
func silentClient(c *net.UnixConn, ctl *net.UnixConn) error {
	h, err := helloWith(c, helperpb.Role_ROLE_CLIENT_CALLS, 0)
	if err != nil {
		return err
	}
	if h.ClientToken == 0 {
		return fmt.Errorf("calls Hello answered no token")
	}
	_, err = helloWith(ctl, helperpb.Role_ROLE_CLIENT_CONTROL, h.ClientToken)
	return err
}

// TestStatusFloodWithSilentClients: another user registers 300 clients
// that never answer on their control connections, and 400 connections of
// theirs ask Status back to back for 10 s. Each Status costs the helper a
// bounded amount whatever the number of silent clients: its resident memory
// (silent clients included) grows by less than floodRSSBound, at the peak
// and once the askers have gone, and root's `gpucr status` is answered
// throughout, within seconds. (A helper that asked every client for every
// request grew by over 500 MiB here and kept it, and root's status took
// 1.5 s.)
func TestStatusFloodWithSilentClients(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	h := startHelper(t, dir, gpucrEnv(t), "--socket-mode", "0666")
	pid := h.pid()
	h.status()
	rss0 := procStatusKiB(t, pid, "VmRSS") << 10
	const silent, askers = 300, 400
	for i := 0; i < silent; i++ {
		pair := dialAs(t, h.socket, &u, 2, nil)
		if err := silentClient(pair[0], pair[1]); err != nil {
			t.Fatalf("silent client %d: %v", i, err)
		}
	}
	conns := dialAs(t, h.socket, &u, askers, func(c *net.UnixConn) error { return sayHello(c, helperpb.Role_ROLE_CLI) })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var asked atomic.Int64
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if askStatus(c) != nil {
					return
				}
				asked.Add(1)
			}
		}()
	}
	var slowest time.Duration
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		start := time.Now()
		if _, err := h.statusErr(); err != nil {
			t.Errorf("root's status during the flood: %v", err)
		}
		slowest = max(slowest, time.Since(start))
	}
	close(stop)
	wg.Wait()
	peak := procStatusKiB(t, pid, "VmHWM") << 10
	during := procStatusKiB(t, pid, "VmRSS") << 10
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(5 * time.Second)
	after := procStatusKiB(t, pid, "VmRSS") << 10
	t.Logf("%d Status answered; resident memory %d MiB before, peak %d MiB, %d MiB at the end, %d MiB 5 s after the askers left; root's status took at most %v",
		asked.Load(), rss0>>20, peak>>20, during>>20, after>>20, slowest)
	if peak-rss0 > floodRSSBound {
		t.Errorf("the helper's peak resident memory grew by %d MiB under the Status flood, more than %d MiB",
			(peak-rss0)>>20, floodRSSBound>>20)
	}
	if after-rss0 > floodRSSBound {
		t.Errorf("5 s after the flood the helper still holds %d MiB more than before", (after-rss0)>>20)
	}
	if slowest > 5*time.Second {
		t.Errorf("root's gpucr status took %v during the flood", slowest)
	}
	if !h.alive() {
		t.Fatal("the helper died")
	}
}
