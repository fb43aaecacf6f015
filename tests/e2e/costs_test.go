package e2e

// What another user can make the helper spend through the requests added
// since the last audits (Export, ImportPeer, AnalyzeModule, Hello's
// program), with the helper's socket open to every user (--socket-mode
// 0666): descriptors, memory, other processes' memory, and the size of its
// Status reply. None of it may reach another user's jobs or root's.

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// callsClient is a calls connection of a client registered by hand, as a
// hostile user's own program speaks the protocol.
type callsClient struct {
	t    testing.TB
	w    *wire.Conn
	id   uint64
	uuid string // the helper's first device
}

// registerCalls says Hello as an interposer's calls connection on c.
func registerCalls(t testing.TB, c *net.UnixConn) *callsClient {
	t.Helper()
	h, err := helloWith(c, helperpb.Role_ROLE_CLIENT_CALLS, 0)
	if err != nil {
		t.Fatalf("calls Hello: %v", err)
	}
	if len(h.Devices) == 0 {
		t.Fatal("the helper announces no device")
	}
	w, err := wire.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return &callsClient{t: t, w: w, id: 1, uuid: h.Devices[0].Uuid}
}

// call sends req with fds and returns the answer and the fds that came with
// it (the caller closes them).
func (c *callsClient) call(req *helperpb.Request, fds ...int) (*helperpb.Response, []int) {
	c.t.Helper()
	c.id++
	req.Id = c.id
	_ = c.w.UnixConn().SetDeadline(time.Now().Add(30 * time.Second))
	defer c.w.UnixConn().SetDeadline(time.Time{})
	if err := c.w.Write(req, fds); err != nil {
		c.t.Fatalf("%T: %v", req.Body, err)
	}
	r, rfds, err := c.w.ReadResponse()
	if err != nil {
		c.t.Fatalf("%T: no answer: %v", req.Body, err)
	}
	return r, rfds
}

func (c *callsClient) alloc(size uint64) uint64 {
	c.t.Helper()
	r, fds := c.call(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{DeviceUuid: c.uuid, Size: size,
		Kind: helperpb.AllocKind_ALLOC_KIND_MEM_ALLOC}}})
	wire.CloseFDs(fds)
	if r.GetAlloc() == nil {
		c.t.Fatalf("Alloc: %v", r)
	}
	return r.GetAlloc().AllocId
}

// export asks for an export of allocation id: the answer, and its fd (-1:
// none).
func (c *callsClient) export(id uint64) (*helperpb.Response, int) {
	c.t.Helper()
	r, fds := c.call(&helperpb.Request{Body: &helperpb.Request_Export{Export: &helperpb.Export{AllocId: id}}})
	if len(fds) > 1 {
		c.t.Fatalf("Export answered with %d fds", len(fds))
	}
	if len(fds) == 0 {
		return r, -1
	}
	return r, fds[0]
}

// TestExportFloodAsAnotherUser: another user exports one allocation 5,000
// times and then as many allocations as the per-uid cap allows and one
// more. The helper keeps one descriptor per exported allocation (it kept
// one per request: 20,000 requests filled its descriptor table, and other
// users' jobs then ran without checkpoint support and checkpoints failed),
// refuses the allocation past the cap naming it, and root's job registers
// and is checkpointed meanwhile. Once the user's connection is gone, the
// helper's descriptors are what they were.
func TestExportFloodAsAnotherUser(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	env := gpucrEnv(t)
	const limit = 16
	h := startHelper(t, dir, env, "--socket-mode", "0666", "--max-exports-per-uid", strconv.Itoa(limit))
	pid := h.pid()
	fd0 := settledFDs(t, pid)

	conns := dialAs(t, h.socket, &u, 1, nil)
	c := registerCalls(t, conns[0])
	ids := []uint64{c.alloc(2 << 20)}
	afterAlloc := fdCount(t, pid)
	first := -1
	for i := 0; i < 5000; i++ {
		r, fd := c.export(ids[0])
		if r.Error != nil || fd < 0 {
			t.Fatalf("Export %d of one allocation: %v", i, r)
		}
		if first < 0 {
			first = fd
			continue
		}
		if !sameOpenFile(first, fd) {
			t.Fatalf("Export %d of one allocation handed out another open file than the first", i)
		}
		unix.Close(fd)
	}
	unix.Close(first)
	if n := fdCount(t, pid); n > afterAlloc+4 {
		t.Errorf("5,000 Exports of one allocation: the helper holds %d more descriptors than before them", n-afterAlloc)
	}
	for len(ids) < limit+1 {
		ids = append(ids, c.alloc(2<<20))
	}
	for i, id := range ids {
		r, fd := c.export(id)
		if fd >= 0 {
			unix.Close(fd)
		}
		switch {
		case i < limit && (r.Error != nil || fd < 0):
			t.Fatalf("Export of allocation %d of %d, within the cap: %v", i+1, len(ids), r)
		case i == limit && (r.Error == nil || fd >= 0 || !strings.Contains(r.Error.Message, "--max-exports-per-uid") ||
			!strings.Contains(r.Error.Message, fmt.Sprintf("uid %d", u.UID))):
			t.Fatalf("Export of a %dth allocation past the cap of %d: %v; want a refusal naming the limit", i+1, limit, r)
		}
	}

	// Root's job registers, runs and is checkpointed meanwhile.
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "8", "--buffers", "2", "--interval-ms", "20")
	a.waitIter(3, 30*time.Second)
	if _, _, ok := h.client(a.pid); !ok {
		t.Fatalf("root's job is no client of the helper:\n%s", tail(a.output(), 10))
	}
	if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", t.TempDir(), "--gpu-only", "--leave-running"); err != nil ||
		!strings.Contains(out, "state running") {
		t.Fatalf("root's checkpoint during the flood: %v\n%s", err, out)
	}
	a.kill()

	conns[0].Close()
	waitForCond(t, 10*time.Second, func() bool { return fdCount(t, pid) <= fd0+2 },
		func() string {
			return fmt.Sprintf("the helper has %d descriptors once the user has gone, %d before", fdCount(t, pid), fd0)
		})
}

// sameOpenFile reports whether fds a and b of this process are one open
// file (kcmp(2), KCMP_FILE).
func sameOpenFile(a, b int) bool {
	pid := uintptr(unix.Getpid())
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, 0, uintptr(a), uintptr(b), 0)
	return errno == 0 && r == 0
}

// sealedImage is a sealed memfd holding image, as the interposer passes a
// module image to the helper (closed when the test ends).
func sealedImage(t testing.TB, image []byte) int {
	t.Helper()
	fd, err := unix.MemfdCreate("gpucr-module", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	for b := image; len(b) > 0; {
		n, err := unix.Write(fd, b)
		if err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS,
		unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestModuleAnalysisMemoryBounded: 24 clients of another user ask at once
// for analyses of 64 MiB module images (when it named them by address, the
// helper read each out of the client's memory). The helper analyses at most its
// per-uid budget of bytes at once and refuses the rest at once, saying
// why; its peak resident memory grows by a bounded amount, it gives the
// memory back afterwards, and root's status is answered quickly
// throughout. (A helper that read every image grew from 98 MiB to 2.9 GiB
// and kept it; another user's status took 3.4 s.)
func TestModuleAnalysisMemoryBounded(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	h := startHelper(t, dir, gpucrEnv(t), "--socket-mode", "0666")
	pid := h.pid()
	h.status()
	rss0 := procStatusKiB(t, pid, "VmRSS") << 10
	const clients, size = 24, 64 << 20
	image := make([]byte, size)
	for i := range image {
		image[i] = byte(i)
	}
	memfd := sealedImage(t, image) // one file for every request: SCM_RIGHTS passes it each time
	var cs []*callsClient
	for _, c := range dialAs(t, h.socket, &u, clients, nil) {
		cs = append(cs, registerCalls(t, c))
	}
	type result struct {
		r   *helperpb.Response
		err error
	}
	results := make(chan result, clients)
	for _, c := range cs {
		go func() {
			c.id++
			req := &helperpb.Request{Id: c.id, Body: &helperpb.Request_AnalyzeModule{AnalyzeModule: &helperpb.AnalyzeModule{Size: size}}}
			_ = c.w.UnixConn().SetDeadline(time.Now().Add(time.Minute))
			err := c.w.Write(req, []int{memfd})
			var r *helperpb.Response
			if err == nil {
				r, _, err = c.w.ReadResponse()
			}
			results <- result{r, err}
		}()
	}
	var slowest time.Duration
	analysed, refused := 0, 0
	for got := 0; got < clients; {
		select {
		case res := <-results:
			got++
			switch {
			case res.err != nil:
				t.Errorf("an analysis: %v", res.err)
			case res.r.GetModuleKernels() != nil:
				analysed++
			case res.r.Error != nil && strings.Contains(res.r.Error.Message, "analysis"):
				refused++
			default:
				t.Errorf("an analysis was answered %v", res.r)
			}
		case <-time.After(200 * time.Millisecond):
			start := time.Now()
			if _, err := h.statusErr(); err != nil {
				t.Errorf("root's status during the analyses: %v", err)
			}
			slowest = max(slowest, time.Since(start))
		}
	}
	start := time.Now()
	if _, err := h.statusErr(); err != nil {
		t.Errorf("root's status after the analyses: %v", err)
	}
	slowest = max(slowest, time.Since(start))
	peak := procStatusKiB(t, pid, "VmHWM") << 10
	time.Sleep(5 * time.Second)
	after := procStatusKiB(t, pid, "VmRSS") << 10
	t.Logf("%d analysed, %d refused; resident memory %d MiB before, peak %d MiB, %d MiB 5 s later; root's status took at most %v",
		analysed, refused, rss0>>20, peak>>20, after>>20, slowest)
	// The per-uid budget (128 MiB by default) holds two such images at
	// once; the collector may let the heap reach twice what is live.
	if peak-rss0 > 400<<20 {
		t.Errorf("the helper's peak resident memory grew by %d MiB", (peak-rss0)>>20)
	}
	if after-rss0 > 64<<20 {
		t.Errorf("5 s after the analyses the helper still holds %d MiB more than before", (after-rss0)>>20)
	}
	if refused == 0 {
		t.Errorf("none of %d analyses of %d MiB at once was refused", clients, size>>20)
	}
	if slowest > 2*time.Second {
		t.Errorf("root's status took %v", slowest)
	}
}

// setuidChildMain (GPUCR_E2E_SUID_CHILD=SOCKET) connects fds 3 (calls) and
// 4 (control) to the helper as an interposer does, prints its client token,
// and execs $GPUCR_E2E_SUID_EXEC (a set-user-ID program) with the
// connections still open: the client is the process, which after the exec
// runs with the program's privileges.
func setuidChildMain(socket string) int {
	token, err := connectHello(3, socket, helperpb.Role_ROLE_CLIENT_CALLS, 0)
	if err == nil {
		_, err = connectHello(4, socket, helperpb.Role_ROLE_CLIENT_CONTROL, token)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "setuid child:", err)
		return 1
	}
	fmt.Println(token)
	prog := os.Getenv("GPUCR_E2E_SUID_EXEC")
	err = syscall.Exec(prog, []string{prog, "600"}, []string{})
	fmt.Fprintln(os.Stderr, "setuid child: exec:", err)
	return 1
}

// connectHello connects fd to socket and says Hello with role and token on
// it; the client token of the answer.
func connectHello(fd int, socket string, role helperpb.Role, token uint64) (uint64, error) {
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: socket}); err != nil {
		return 0, err
	}
	w, err := wireOf(os.NewFile(uintptr(fd), "helper"))
	if err != nil {
		return 0, err
	}
	defer w.Close()
	if err := w.Write(&helperpb.Request{Id: 1, Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
		ProtocolVersion: wire.Version, Role: role, ClientToken: token, Program: "setuid-child"}}}, nil); err != nil {
		return 0, err
	}
	resp, _, err := w.ReadResponse()
	if err != nil {
		return 0, err
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("%s: %s", resp.Error.Code, resp.Error.Message)
	}
	return resp.GetHello().GetClientToken(), nil
}

// answerControl answers every request on a control connection as a
// well-behaved interposer does, until it closes.
func answerControl(ctl *wire.Conn) {
	state := helperpb.ClientState_CLIENT_STATE_RUNNING
	for {
		req, fds, err := ctl.ReadRequest()
		if err != nil {
			return
		}
		wire.CloseFDs(fds)
		resp := &helperpb.Response{Id: req.Id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
		switch req.Body.(type) {
		case *helperpb.Request_Quiesce:
			state = helperpb.ClientState_CLIENT_STATE_QUIESCED
		case *helperpb.Request_Resume:
			state = helperpb.ClientState_CLIENT_STATE_RUNNING
		case *helperpb.Request_Snapshot:
			resp.Body = &helperpb.Response_Table{Table: &helperpb.BufferTable{State: state}}
		case *helperpb.Request_GetStats:
			resp.Body = &helperpb.Response_Stats{Stats: &helperpb.ClientStats{}}
		}
		if ctl.Write(resp, nil) != nil {
			return
		}
	}
}

// firstMapping is the start address of pid's first mapping (root reads
// any process's maps).
func firstMapping(t testing.TB, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	start, _, _ := strings.Cut(string(b), "-")
	a, err := strconv.ParseUint(start, 16, 64)
	if err != nil {
		t.Fatalf("/proc/%d/maps: %q", pid, tail(string(b), 3))
	}
	return a
}

// TestSetuidClientNotReadNorControlled: another user's process registers
// with the helper and execs a set-user-ID root program, keeping its
// connections. The user alone may not read that program's memory
// (process_vm_readv: EPERM) nor act on it; through the helper neither: an
// AnalyzeModule naming its memory is refused (the helper read it, and
// found the user's data placed there), the user's client operation on it
// is refused, and Status does not call it checkpointable (it did, and
// listed it as the user's).
func TestSetuidClientNotReadNorControlled(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	suid := filepath.Join(dir, "suid-sleep")
	if err := copyExec("/bin/sleep", suid, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(suid, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	var socks []*os.File
	for _, name := range []string{"calls", "control"} {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), name)
		t.Cleanup(func() { f.Close() })
		socks = append(socks, f)
	}
	child := asUser(exec.Command(testBinary(t)), u)
	child.Env = []string{"GPUCR_E2E_SUID_CHILD=" + h.socket, "GPUCR_E2E_SUID_EXEC=" + suid}
	child.ExtraFiles = socks
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the child said nothing: %v", err)
	}
	if _, err := strconv.ParseUint(strings.TrimSpace(line), 10, 64); err != nil {
		t.Fatalf("the child said %q", line)
	}
	pid := child.Process.Pid
	waitForCond(t, 10*time.Second, func() bool { p, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); return p == suid },
		func() string { return "the child did not exec the set-user-ID program" })
	ctl, err := wireOf(socks[1])
	if err != nil {
		t.Fatal(err)
	}
	go answerControl(ctl)
	calls, err := wireOf(socks[0])
	if err != nil {
		t.Fatal(err)
	}

	// Its memory, named on its calls connection (by address: the form the
	// helper read from the process, as root).
	addr := firstMapping(t, pid)
	_ = calls.UnixConn().SetDeadline(time.Now().Add(30 * time.Second))
	if err := calls.Write(&helperpb.Request{Id: 2, Body: &helperpb.Request_AnalyzeModule{AnalyzeModule: &helperpb.AnalyzeModule{
		Address: addr, Size: 4096}}}, nil); err != nil { // the deprecated field alone
		t.Fatal(err)
	}
	r, _, err := calls.ReadResponse()
	if err != nil {
		t.Fatalf("AnalyzeModule: %v", err)
	}
	if r.Error == nil {
		t.Errorf("an analysis of 4 KiB at 0x%x of the set-user-ID program was answered %v: the helper read its memory", addr, r)
	}

	// Its status, for the user.
	var listed bool
	for _, c := range h.status().Clients {
		if p, _ := c.Pid.Int64(); int(p) != pid {
			continue
		}
		listed = true
		if c.Checkpointable || !strings.Contains(strings.Join(c.NotCheckpointable, "; "), "set-user-ID") {
			t.Errorf("status of the set-user-ID program: checkpointable %v, %q", c.Checkpointable, c.NotCheckpointable)
		}
	}
	if !listed {
		t.Logf("(the set-user-ID program is not listed)")
	}

	// The user's operations on it.
	for _, op := range []helperpb.ClientOp_Op{helperpb.ClientOp_OP_QUIESCE, helperpb.ClientOp_OP_SNAPSHOT} {
		got := rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_ClientOp{ClientOp: &helperpb.ClientOp{Pid: int64(pid), Op: op,
			TimeoutMs: 2000}}}, "")
		if got.Code != helperpb.ErrorCode_ERROR_PERMISSION.String() {
			t.Errorf("uid %d's %v of pid %d, running a set-user-ID root program: %v; want ERROR_PERMISSION", u.UID, op, pid, got)
		}
	}
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(img, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	mustAsOther(t, u, "mkdir", filepath.Join(img, "gpucr"))
	got := rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: &helperpb.Checkpoint{Pid: int64(pid),
		ImageDir: img, LeaveRunning: true, TimeoutMs: 2000}}}, img)
	if got.Code != helperpb.ErrorCode_ERROR_PERMISSION.String() {
		t.Errorf("uid %d's checkpoint of pid %d, running a set-user-ID root program: %v; want ERROR_PERMISSION", u.UID, pid, got)
	}
}

// helloProgram says Hello as an interposer's calls connection on c, naming
// its program program.
func helloProgram(c *net.UnixConn, program string) error {
	w, err := wire.New(c)
	if err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if err := w.Write(&helperpb.Request{Id: 1, Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
		ProtocolVersion: wire.Version, Role: helperpb.Role_ROLE_CLIENT_CALLS, Program: program}}}, nil); err != nil {
		return err
	}
	r, _, err := w.ReadResponse()
	if err != nil {
		return err
	}
	if r.GetHello() == nil {
		return fmt.Errorf("Hello answered %v", r)
	}
	return nil
}

// TestProgramNamesDenyNothing: another user registers 80 clients whose
// program names are 256,000 bytes long, and one whose name holds a newline
// and terminal escapes. Every user's `gpucr status` is answered (the reply
// outgrew the 16 MiB frame: every status got EOF), shows the names cut
// and escaped (a newline forged a line of the listing), and root's
// checkpoint of a GPU job, which asks the helper for its tree's clients,
// goes through (it was refused: "no gpucr helper answers").
func TestProgramNamesDenyNothing(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	long := strings.Repeat("\n\x1b[2J", 100) + strings.Repeat("p", 256000-500)
	dialAs(t, h.socket, &u, 80, func(c *net.UnixConn) error { return helloProgram(c, long) })
	const forged = "  4242  0  forged-root-job  -  1  1.0 GiB  up  yes  running"
	dialAs(t, h.socket, &u, 1, func(c *net.UnixConn) error { return helloProgram(c, "evil\n"+forged+"\x1b]0;title\x07") })

	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "8", "--buffers", "2", "--interval-ms", "20")
	a.waitIter(3, 30*time.Second)
	out, err := gpucrCLI(t, h, "status")
	if err != nil {
		t.Fatalf("root's status: %v\n%s", err, tail(out, 5))
	}
	if !strings.Contains(out, fmt.Sprintf("  %d  ", a.pid)) {
		t.Errorf("root's status does not list root's job %d:\n%s", a.pid, tail(out, 5))
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "4242") || strings.ContainsAny(l, "\x1b\x07\r") {
			t.Errorf("a program name forged output: %q", l)
		}
	}
	if !strings.Contains(out, `evil\n`) {
		t.Errorf("the newline of a program name is not shown escaped")
	}
	st := h.status()
	if len(st.Clients) < 82 {
		t.Errorf("status --json lists %d clients, want all 82", len(st.Clients))
	}
	js, _ := gpucrCLI(t, h, "status", "--json")
	if len(js) > 2<<20 {
		t.Errorf("status --json is %d bytes: program names are not cut", len(js))
	}
	if out, err := asOther(t, u, time.Minute, nil, binPath(t, "gpucr"), "status", "--socket", h.socket); err != nil {
		t.Errorf("uid %d's status: %v\n%s", u.UID, err, tail(out, 5))
	}
	img := filepath.Join(dir, "img")
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running")
	a.waitIter(a.lastIter()+3, 30*time.Second)
}
