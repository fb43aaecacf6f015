package e2e

// A client is a process, not a pid. A user whose process connected as a
// client and exited must not be able to act, through the sockets it kept,
// on whatever process takes that pid next (another user's, or root's).

import (
	"bufio"
	"context"
	"encoding/json"
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
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// staleLine is what the stale client's parent prints once its child has
// registered and exited.
type staleLine struct {
	ChildPid int    `json:"child_pid"`
	Token    uint64 `json:"token"`
	Error    string `json:"error,omitempty"`
}

// staleClientMain (GPUCR_E2E_STALE=SOCKET) is the attacker's program: its
// child connects a calls and a control connection to the helper as an
// interposer would and exits; this process keeps both sockets (it made
// them; the child only connected them), prints a staleLine and answers
// every request on the control connection as a well-behaved interposer,
// until it is killed.
func staleClientMain(socket string) int {
	fail := func(format string, a ...any) int {
		_ = json.NewEncoder(os.Stdout).Encode(staleLine{Error: fmt.Sprintf(format, a...)})
		return 1
	}
	var fds [2]int
	for i := range fds {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return fail("socket: %v", err)
		}
		fds[i] = fd
	}
	child := exec.Command("/proc/self/exe")
	child.Env = []string{"GPUCR_E2E_STALE_CHILD=" + socket}
	keptSockets = []*os.File{os.NewFile(uintptr(fds[0]), "calls"), os.NewFile(uintptr(fds[1]), "control")}
	child.ExtraFiles = keptSockets
	child.Stderr = os.Stderr
	out, err := child.Output()
	if err != nil {
		return fail("child: %v: %s", err, out)
	}
	token, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return fail("child said %q", out)
	}
	ctl, err := wireOf(keptSockets[1])
	if err != nil {
		return fail("control: %v", err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(staleLine{ChildPid: child.Process.Pid, Token: token}); err != nil {
		return 1
	}
	state := helperpb.ClientState_CLIENT_STATE_RUNNING
	for {
		req, rfds, err := ctl.ReadRequest()
		if err != nil {
			return 0 // the helper hung up
		}
		wire.CloseFDs(rfds)
		resp := &helperpb.Response{Id: req.Id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
		switch req.Body.(type) {
		case *helperpb.Request_Quiesce:
			state = helperpb.ClientState_CLIENT_STATE_QUIESCED
		case *helperpb.Request_Drop:
			state = helperpb.ClientState_CLIENT_STATE_DROPPED
		case *helperpb.Request_Resume:
			state = helperpb.ClientState_CLIENT_STATE_RUNNING
		case *helperpb.Request_Snapshot:
			resp.Body = &helperpb.Response_Table{Table: &helperpb.BufferTable{State: state}}
		case *helperpb.Request_GetStats:
			resp.Body = &helperpb.Response_Stats{Stats: &helperpb.ClientStats{}}
		}
		if err := ctl.Write(resp, nil); err != nil {
			return 0
		}
	}
}

// keptSockets are the stale client's sockets, held for its whole life.
var keptSockets []*os.File

// wireOf makes a connection of f (a connected socket; f's own descriptor is
// left open).
func wireOf(f *os.File) (*wire.Conn, error) {
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	return wire.New(nc.(*net.UnixConn))
}

// staleChildMain (GPUCR_E2E_STALE_CHILD=SOCKET) connects fds 3 (calls) and 4
// (control) to the helper, says Hello on each as an interposer does, prints
// its client token and exits.
func staleChildMain(socket string) int {
	hello := func(fd int, role helperpb.Role, token uint64) (uint64, error) {
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: socket}); err != nil {
			return 0, err
		}
		w, err := wireOf(os.NewFile(uintptr(fd), "helper"))
		if err != nil {
			return 0, err
		}
		defer w.Close()
		req := &helperpb.Request{Id: 1, Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
			ProtocolVersion: wire.Version, Role: role, ClientToken: token, Program: "stale"}}}
		if err := w.Write(req, nil); err != nil {
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
	token, err := hello(3, helperpb.Role_ROLE_CLIENT_CALLS, 0)
	if err == nil {
		_, err = hello(4, helperpb.Role_ROLE_CLIENT_CONTROL, token)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stale child:", err)
		return 1
	}
	fmt.Println(token)
	return 0
}

// staleClient is the attacker's program running as u.
type staleClient struct {
	cmd  *exec.Cmd
	line staleLine
}

func startStaleClient(t *testing.T, u otherUser, h *helperProc) *staleClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := asUser(exec.CommandContext(ctx, testBinary(t)), u)
	cmd.Env = []string{"GPUCR_E2E_STALE=" + h.socket}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- l
		_, _ = bufio.NewReader(stdout).WriteTo(discard{})
	}()
	s := &staleClient{cmd: cmd}
	select {
	case l := <-lines:
		if err := json.Unmarshal([]byte(l), &s.line); err != nil || s.line.Error != "" || s.line.ChildPid == 0 {
			t.Fatalf("stale client: %q (%v)", l, err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the stale client said nothing within a minute")
	}
	return s
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// startAppAtPid starts name (as startApp does) as pid, which must be free:
// the pid namespace's next pid is set (ns_last_pid, root) before each try.
func startAppAtPid(t *testing.T, dir, name string, env []string, pid int, args ...string) *app {
	t.Helper()
	for try := 0; try < 50; try++ {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Fatalf("choosing the next pid: %v", err)
		}
		a := &app{t: t, name: name, args: args, log: filepath.Join(dir, name+".log")}
		f, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		a.cmd = exec.Command(binPath(t, name), args...)
		a.cmd.Env = env
		a.cmd.Stdout, a.cmd.Stderr = f, f
		a.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		err = a.cmd.Start()
		f.Close()
		if err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		a.started()
		if a.pid != pid {
			a.kill()
			continue
		}
		t.Cleanup(a.kill)
		a.waitFor(30*time.Second, "ready", func(string, []heartbeat) bool {
			p, _ := parseHeartbeats(a.output())
			return p == a.pid
		})
		return a
	}
	t.Fatalf("pid %d was taken by another process at every try", pid)
	return nil
}

// TestStaleClientPidReuse: the second user's child registers as a client and
// exits; the parent keeps the connections and answers like an interposer.
// Root's CUDA process (not under gpucr run) then gets the child's pid. Asked
// to checkpoint "its" client, the helper must refuse: the client went with
// its process, and root's process is never locked or checkpointed in the
// driver, and runs on.
func TestStaleClientPidReuse(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	sc := startStaleClient(t, u, h)
	pid := sc.line.ChildPid

	victim := startAppAtPid(t, dir, "heartbeat", simEnv(t), pid, "--mib", "8", "--interval-ms", "10")
	victim.waitIter(10, time.Minute)

	img := filepath.Join(dir, "stale-img")
	if err := os.Mkdir(img, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(img, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	mustAsOther(t, u, "mkdir", filepath.Join(img, "gpucr"))
	for _, req := range []*helperpb.Request{
		{Body: &helperpb.Request_Checkpoint{Checkpoint: &helperpb.Checkpoint{Pid: int64(pid), ImageDir: img, TimeoutMs: 2000}}},
		{Body: &helperpb.Request_ClientOp{ClientOp: &helperpb.ClientOp{Pid: int64(pid), Op: helperpb.ClientOp_OP_QUIESCE}}},
	} {
		dirFD := ""
		if req.GetCheckpoint() != nil {
			dirFD = img
		}
		r := rawAs(t, u, h, req, dirFD)
		if r.Code != helperpb.ErrorCode_ERROR_NOT_FOUND.String() {
			t.Errorf("%T of the stale client's pid, now root's process: %s", req.Body, r)
		}
	}
	if s := driverState(t, simEnv(t), pid); s != "running" {
		t.Errorf("root's process, which took the stale client's pid, is %s in the driver", s)
	}
	before := victim.lastIter()
	victim.waitIter(before+10, 30*time.Second)
	if _, _, ok := h.client(pid); ok {
		t.Errorf("the helper still lists a client with pid %d", pid)
	}
}

// writeForeignImage writes, as u would with a program of its own, a
// committed GPU image into dir (u's) holding one buffer of size bytes (zeros)
// for process pid, and returns its image id.
func writeForeignImage(t *testing.T, u otherUser, dir string, pid int, size uint64) []byte {
	t.Helper()
	w, err := image.Create(dir, image.Origin{Pid: pid, Time: time.Now()},
		image.Options{Owner: &image.Owner{UID: int(u.UID), GID: int(u.GID)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddProcess(pid, 0); err != nil {
		t.Fatal(err)
	}
	bw, err := w.AddBuffer(image.BufferInfo{Pid: pid, Address: 0x7f0000000000, Size: size, Kind: image.AllocMemAlloc})
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, image.DefaultChunkSize)
	for off := uint64(0); off < size; off += uint64(len(zero)) {
		if _, err := bw.Write(zero[:min(uint64(len(zero)), size-off)]); err != nil {
			t.Fatal(err)
		}
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	return w.ID()
}

// TestAdoptionOfAStrangersImage: a detach state file (what a helper writes
// before a checkpoint has a process give its memory up) names root's
// process, which never detached, and the second user's image, which holds a
// 256 MiB buffer for that pid: what the pid reuse above left behind in a
// helper without its fix, in the format that helper wrote. A helper that
// starts must not adopt it: it holds no memory for root's process (nor past
// the second user's 64 MiB limit), tells it nothing (no wake file), and
// leaves it running.
func TestAdoptionOfAStrangersImage(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	env := gpucrEnv(t)

	victim := startApp(t, dir, "heartbeat", simEnv(t), "--mib", "8", "--interval-ms", "10")
	victim.waitIter(5, time.Minute)
	img := filepath.Join(dir, "strangers-img")
	id := writeForeignImage(t, u, img, victim.pid, 256<<20)

	stateDir := filepath.Join(dir, "detached")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", victim.pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
	start, _ := strconv.ParseUint(fields[19], 10, 64)
	state, _ := json.Marshal(map[string]any{"pid": victim.pid, "start_time": start, "image_dir": img, "image_id": id})
	stateFile := filepath.Join(stateDir, strconv.Itoa(victim.pid)+".json")
	if err := os.WriteFile(stateFile, state, 0o600); err != nil {
		t.Fatal(err)
	}

	h := startHelper(t, dir, env, "--socket-mode", "0666", "--max-gpu-memory-per-uid", "64MiB")
	if a, b, ok := h.client(victim.pid); ok {
		t.Errorf("the helper adopted root's process from the second user's image: %d allocations, %d bytes", a, b)
	}
	if _, err := os.Stat(stateFile); err == nil {
		t.Error("the state file is still there")
	}
	if _, err := os.Stat(filepath.Join(dir, "wake", strconv.Itoa(victim.pid))); err == nil {
		t.Error("the helper wrote a wake file for root's process")
	}
	if s := driverState(t, simEnv(t), victim.pid); s != "running" {
		t.Errorf("root's process is %s in the driver", s)
	}
	before := victim.lastIter()
	victim.waitIter(before+10, 30*time.Second)
}
