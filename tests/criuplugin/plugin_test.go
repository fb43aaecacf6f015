// Package criuplugin_test checks the built CRIU plugin (build/lib/criu/gpucr_plugin.so):
// its exported symbols, and real CRIU dumps and restores of a plain process
// with no helper and with a fake helper that records what the plugin asks.
package criuplugin_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/internal/testroot"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// pluginPath is the built plugin; missing, it skips the test (fails it in CI).
func pluginPath(t *testing.T) string {
	t.Helper()
	build := os.Getenv("GPUCR_BUILD")
	if build == "" {
		build = filepath.Join(testroot.Dir(t), "build")
	}
	p := filepath.Join(build, "lib", "criu", "gpucr_plugin.so")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not built (run `make`): %v", p, err)
		}
		t.Skipf("%s is not built (run `make`)", p)
	}
	return p
}

func TestExportsOnlyDescriptor(t *testing.T) {
	f, err := elf.Open(pluginPath(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var defined []string
	found := false
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF || elf.ST_BIND(s.Info) == elf.STB_LOCAL {
			continue
		}
		defined = append(defined, s.Name)
		if s.Name == "CR_PLUGIN_DESC" && elf.ST_TYPE(s.Info) == elf.STT_OBJECT {
			found = true
		}
	}
	if !found {
		t.Fatalf("CR_PLUGIN_DESC is not exported; exported: %v", defined)
	}
	if len(defined) != 1 {
		t.Errorf("only CR_PLUGIN_DESC should be exported, found %v", defined)
	}
}

// env is a CRIU run's setup: criu, a plugin directory holding only our
// plugin, the helper socket path the plugin is pointed at.
type env struct {
	t      *testing.T
	criu   string
	libdir string
	socket string
	dir    string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	plugin := pluginPath(t)
	path := "/usr/local/sbin:" + os.Getenv("PATH")
	criu, err := lookPath("criu", path)
	if err != nil || os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs criu on PATH and root (criu: %v, euid %d)", err, os.Geteuid())
		}
		t.Skipf("needs criu and root (criu: %v, euid %d)", err, os.Geteuid())
	}
	dir := t.TempDir()
	e := &env{t: t, criu: criu, libdir: filepath.Join(dir, "lib"), socket: filepath.Join(dir, "helper.sock"), dir: dir}
	if err := os.Mkdir(e.libdir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(plugin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.libdir, "gpucr_plugin.so"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return e
}

func lookPath(name, path string) (string, error) {
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on %s", name, path)
}

// criu runs CRIU with the plugin directory and GPUCR_SOCKET; output goes to
// a file (never a pipe a lingering process could hold).
func (e *env) run(args ...string) (string, error) { return e.runEnv(nil, args...) }

// runEnv is run with extra environment variables.
func (e *env) runEnv(extra []string, args ...string) (string, error) {
	out, err := os.CreateTemp(e.dir, "criu-*.out")
	if err != nil {
		e.t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.criu, append(args, "--libdir", e.libdir)...)
	cmd.Env = append(append(os.Environ(), "GPUCR_SOCKET="+e.socket, "PATH=/usr/local/sbin:"+os.Getenv("PATH")), extra...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, out, out
	err = cmd.Run()
	b, _ := os.ReadFile(out.Name())
	return string(b), err
}

func (e *env) imgDir(name string) string {
	d := filepath.Join(e.dir, name)
	if err := os.Mkdir(d, 0o700); err != nil {
		e.t.Fatal(err)
	}
	return d
}

// proc is a `sleep 100` in its own session, stdio on /dev/null.
type proc struct {
	cmd *exec.Cmd
	pid int
}

func startSleep(t *testing.T) *proc {
	t.Helper()
	cmd := exec.Command("sleep", "100")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid}
	t.Cleanup(func() {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		if p.cmd.ProcessState == nil {
			_, _ = p.cmd.Process.Wait()
		}
	})
	return p
}

// reap collects the original process after CRIU killed it, so that its pid
// is free for the restore.
func (p *proc) reap(t *testing.T) {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("pid %d still running after the dump", p.pid)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

func TestDumpRestoreWithoutHelper(t *testing.T) {
	e := newEnv(t)
	img := e.imgDir("img")
	p := startSleep(t)
	if out, err := e.run("dump", "-t", strconv.Itoa(p.pid), "-D", img, "--shell-job", "-o", "dump.log", "-v4"); err != nil {
		t.Fatalf("criu dump: %v\n%s", err, out)
	}
	p.reap(t)
	if out, err := e.run("restore", "-D", img, "--shell-job", "-d", "-o", "restore.log", "-v4"); err != nil {
		t.Fatalf("criu restore: %v\n%s", err, out)
	}
	if !alive(p.pid) {
		t.Fatalf("pid %d not running after the restore", p.pid)
	}
}

// fdStats is the fstat of the descriptor that came with a request.
type fdStats map[*helperpb.Request]syscall.Stat_t

// fakeHelper answers the plugin's requests and records them.
type fakeHelper struct {
	t        *testing.T
	ln       net.Listener
	mu       sync.Mutex
	reqs     []*helperpb.Request
	dirFDs   fdStats            // what the descriptor that came with a request is
	ckptErr  helperpb.ErrorCode // answer to Checkpoint (0: ok)
	notFound map[int64]bool     // Checkpoint / Restored answer NOT_FOUND for these pids
	silent   bool               // Checkpoint gets no answer at all
}

func startFake(t *testing.T, socket string) *fakeHelper {
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHelper{t: t, ln: ln, notFound: map[int64]bool{}, dirFDs: fdStats{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go h.serve(c)
		}
	}()
	return h
}

func (h *fakeHelper) serve(c net.Conn) {
	defer c.Close()
	wc, err := wire.New(c.(*net.UnixConn))
	if err != nil {
		return
	}
	for {
		req, fds, err := wc.ReadRequest()
		if err != nil {
			return
		}
		var hdr [4]byte
		h.mu.Lock()
		h.reqs = append(h.reqs, req)
		for _, fd := range fds {
			var st syscall.Stat_t
			if syscall.Fstat(fd, &st) == nil {
				h.dirFDs[req] = st
			}
			syscall.Close(fd)
		}
		resp := &helperpb.Response{Id: req.Id}
		fail := func(code helperpb.ErrorCode) {
			resp.Error = &helperpb.Error{Code: code, Message: "fake helper says no"}
		}
		switch b := req.Body.(type) {
		case *helperpb.Request_Hello:
			resp.Body = &helperpb.Response_Hello{Hello: &helperpb.HelloReply{ProtocolVersion: 1, HelperVersion: "fake"}}
		case *helperpb.Request_Checkpoint:
			if h.silent {
				h.mu.Unlock()
				_, _ = io.Copy(io.Discard, c) // until the plugin gives up and hangs up
				return
			}
			if h.notFound[b.Checkpoint.Pid] {
				fail(helperpb.ErrorCode_ERROR_NOT_FOUND)
			} else if h.ckptErr != 0 {
				fail(h.ckptErr)
			} else {
				resp.Body = &helperpb.Response_Checkpoint{Checkpoint: &helperpb.CheckpointReply{}}
			}
		case *helperpb.Request_Restored:
			if h.notFound[b.Restored.Pid] {
				fail(helperpb.ErrorCode_ERROR_NOT_FOUND)
			} else {
				resp.Body = &helperpb.Response_Ok{Ok: &helperpb.Ok{}}
			}
		default:
			resp.Body = &helperpb.Response_Ok{Ok: &helperpb.Ok{}}
		}
		h.mu.Unlock()
		out, _ := proto.Marshal(resp)
		binary.LittleEndian.PutUint32(hdr[:], uint32(len(out)))
		if _, err := c.Write(append(hdr[:], out...)); err != nil {
			return
		}
	}
}

// wait returns the first recorded request that match accepts, waiting up to 20 s.
func (h *fakeHelper) wait(what string, match func(*helperpb.Request) bool) *helperpb.Request {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		h.mu.Lock()
		for _, r := range h.reqs {
			if match(r) {
				h.mu.Unlock()
				return r
			}
		}
		n := len(h.reqs)
		h.mu.Unlock()
		if time.Now().After(deadline) {
			h.t.Fatalf("the plugin never sent %s (%d requests seen)", what, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *fakeHelper) dumpDone(pid int) *helperpb.DumpDone {
	r := h.wait("DumpDone", func(r *helperpb.Request) bool { return r.GetDumpDone().GetPid() == int64(pid) })
	return r.GetDumpDone()
}

// wantDirFD checks that req came with a descriptor of the directory dir
// (CRIU's image directory: the helper works beneath it).
func (h *fakeHelper) wantDirFD(t *testing.T, req *helperpb.Request, dir string) {
	t.Helper()
	var want syscall.Stat_t
	if err := syscall.Stat(dir, &want); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	got, ok := h.dirFDs[req]
	h.mu.Unlock()
	if !ok || got.Dev != want.Dev || got.Ino != want.Ino {
		t.Errorf("%T came without a descriptor of the image directory %s (got one: %v)", req.Body, dir, ok)
	}
}

func TestDumpRestoreWithHelper(t *testing.T) {
	e := newEnv(t)
	h := startFake(t, e.socket)
	img := e.imgDir("img")
	p := startSleep(t)
	if out, err := e.run("dump", "-t", strconv.Itoa(p.pid), "-D", img, "--shell-job", "-o", "dump.log", "-v4"); err != nil {
		t.Fatalf("criu dump: %v\n%s", err, out)
	}
	ckReq := h.wait("Checkpoint", func(r *helperpb.Request) bool { return r.GetCheckpoint() != nil })
	ck := ckReq.GetCheckpoint()
	if ck.Pid != int64(p.pid) || !ck.Detach || ck.LeaveRunning || ck.ImageDir != img {
		t.Fatalf("Checkpoint %v, want pid %d, image_dir %s, detach", ck, p.pid, img)
	}
	h.wantDirFD(t, ckReq, img)
	if h.wait("Hello", func(r *helperpb.Request) bool { return r.GetHello() != nil }).GetHello().Role != helperpb.Role_ROLE_PLUGIN {
		t.Fatal("Hello without ROLE_PLUGIN")
	}
	p.reap(t)
	if dd := h.dumpDone(p.pid); dd.Alive {
		t.Fatalf("DumpDone says pid %d is alive after a plain dump", p.pid)
	}

	// Restore: a GPU image present (the fake does not look inside).
	if err := os.MkdirAll(filepath.Join(img, "gpucr"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(img, "gpucr", "manifest.pb"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := e.run("restore", "-D", img, "--shell-job", "-d", "-o", "restore.log", "-v4"); err != nil {
		t.Fatalf("criu restore: %v\n%s", err, out)
	}
	pr := h.wait("PrepareRestore", func(r *helperpb.Request) bool { return r.GetPrepareRestore() != nil })
	if pr.GetPrepareRestore().ImageDir != img {
		t.Fatalf("PrepareRestore for %q, want %q", pr.GetPrepareRestore().ImageDir, img)
	}
	h.wantDirFD(t, pr, img)
	h.wait("Restored", func(r *helperpb.Request) bool { return r.GetRestored().GetPid() == int64(p.pid) })
	if !alive(p.pid) {
		t.Fatalf("pid %d not running after the restore", p.pid)
	}
}

func TestDumpLeaveRunningWithHelper(t *testing.T) {
	e := newEnv(t)
	h := startFake(t, e.socket)
	p := startSleep(t)
	if out, err := e.run("dump", "-t", strconv.Itoa(p.pid), "-D", e.imgDir("img"), "--shell-job", "--leave-running", "-o", "dump.log"); err != nil {
		t.Fatalf("criu dump: %v\n%s", err, out)
	}
	if dd := h.dumpDone(p.pid); !dd.Alive {
		t.Fatalf("DumpDone says pid %d is dead after --leave-running", p.pid)
	}
	if !alive(p.pid) {
		t.Fatalf("pid %d died", p.pid)
	}
}

func TestDumpCheckpointErrorAborts(t *testing.T) {
	e := newEnv(t)
	h := startFake(t, e.socket)
	h.mu.Lock()
	h.ckptErr = helperpb.ErrorCode_ERROR_DRIVER
	h.mu.Unlock()
	p := startSleep(t)
	out, err := e.run("dump", "-t", strconv.Itoa(p.pid), "-D", e.imgDir("img"), "--shell-job", "-o", "dump.log")
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("criu dump succeeded (or did not run: %v) though the checkpoint failed\n%s", err, out)
	}
	if !strings.Contains(out, "gpucr_plugin: ") || !strings.Contains(out, "fake helper says no") {
		t.Errorf("no plugin error in CRIU's output:\n%s", out)
	}
	if !alive(p.pid) {
		t.Fatalf("pid %d died in a failed dump", p.pid)
	}
}

// A helper that never answers does not hold CRIU forever: the plugin gives
// up after GPUCR_PLUGIN_TIMEOUT_S, says so, the dump fails, the process lives.
func TestDumpHelperSilentTimesOut(t *testing.T) {
	e := newEnv(t)
	h := startFake(t, e.socket)
	h.mu.Lock()
	h.silent = true
	h.mu.Unlock()
	p := startSleep(t)
	start := time.Now()
	out, err := e.runEnv([]string{"GPUCR_PLUGIN_TIMEOUT_S=2"}, "dump", "-t", strconv.Itoa(p.pid), "-D", e.imgDir("img"),
		"--shell-job", "-o", "dump.log")
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("criu dump succeeded (or did not run: %v) though the helper never answered\n%s", err, out)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the dump took %v with a 2 s plugin timeout", took)
	}
	if !strings.Contains(out, "no answer from the helper within GPUCR_PLUGIN_TIMEOUT_S") {
		t.Errorf("the plugin does not say it gave up waiting:\n%s", out)
	}
	if !alive(p.pid) {
		t.Fatalf("pid %d died in a failed dump", p.pid)
	}
}

func TestDumpNotAClient(t *testing.T) {
	e := newEnv(t)
	h := startFake(t, e.socket)
	p := startSleep(t)
	h.mu.Lock()
	h.notFound[int64(p.pid)] = true
	h.mu.Unlock()
	if out, err := e.run("dump", "-t", strconv.Itoa(p.pid), "-D", e.imgDir("img"), "--shell-job", "--leave-running", "-o", "dump.log"); err != nil {
		t.Fatalf("criu dump: %v\n%s", err, out)
	}
	time.Sleep(200 * time.Millisecond)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.reqs {
		if r.GetDumpDone() != nil {
			t.Fatalf("DumpDone for a process the helper does not know: %v", r)
		}
	}
}

func TestRestoreWithoutHelperRefused(t *testing.T) {
	e := newEnv(t)
	img := e.imgDir("img")
	p := startSleep(t)
	if out, err := e.run("dump", "-t", strconv.Itoa(p.pid), "-D", img, "--shell-job", "-o", "dump.log"); err != nil {
		t.Fatalf("criu dump: %v\n%s", err, out)
	}
	p.reap(t)
	if err := os.MkdirAll(filepath.Join(img, "gpucr"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(img, "gpucr", "manifest.pb"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := e.run("restore", "-D", img, "--shell-job", "-d", "-o", "restore.log")
	if err == nil {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		t.Fatalf("restore of a GPU image without a helper succeeded\n%s", out)
	}
	if !strings.Contains(out, "gpucr_plugin: ") || !bytes.Contains([]byte(out), []byte(e.socket)) {
		t.Errorf("no clear plugin error naming the socket:\n%s", out)
	}
	if alive(p.pid) {
		t.Errorf("pid %d exists after a refused restore", p.pid)
	}
}

// TestPluginLogFile: with GPUCR_PLUGIN_LOG set, the plugin appends each of
// its messages to that file as well as to stderr; it never writes through a
// symlink there, and a FIFO there neither blocks it nor gets written to.
func TestPluginLogFile(t *testing.T) {
	e := newEnv(t)
	h := startFake(t, e.socket)
	h.mu.Lock()
	h.ckptErr = helperpb.ErrorCode_ERROR_DRIVER
	h.mu.Unlock()
	p := startSleep(t)
	dump := func(logPath, img string) string {
		t.Helper()
		out, err := e.runEnv([]string{"GPUCR_PLUGIN_LOG=" + logPath},
			"dump", "-t", strconv.Itoa(p.pid), "-D", e.imgDir(img), "--shell-job", "-o", "dump.log")
		if err == nil {
			t.Fatalf("criu dump succeeded though the checkpoint failed\n%s", out)
		}
		if !strings.Contains(out, "gpucr_plugin: checkpoint of the GPU state of pid") {
			t.Errorf("the plugin's message is no longer on stderr:\n%s", out)
		}
		return out
	}

	// A file that already holds a line: the plugin's lines are appended.
	logPath := filepath.Join(e.dir, "plugin.log")
	if err := os.WriteFile(logPath, []byte("earlier line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dump(logPath, "img1")
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if lines[0] != "earlier line" || len(lines) < 2 {
		t.Fatalf("plugin log does not keep the earlier line and append:\n%s", b)
	}
	found := false
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "gpucr_plugin: ") {
			t.Errorf("plugin log line without the prefix: %q", l)
		}
		if strings.Contains(l, "fake helper says no") {
			found = true
		}
	}
	if !found {
		t.Errorf("the helper's refusal is not in the plugin log:\n%s", b)
	}

	// A symlink: not followed, its target unchanged.
	target := filepath.Join(e.dir, "target")
	if err := os.WriteFile(target, []byte("keep\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(e.dir, "link.log")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	dump(link, "img2")
	if b, _ := os.ReadFile(target); string(b) != "keep\n" {
		t.Errorf("the plugin wrote through a symlink: target now %q", b)
	}

	// A FIFO nobody reads: the dump ends (it would block in open otherwise).
	fifo := filepath.Join(e.dir, "fifo.log")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	dump(fifo, "img3")
	if !alive(p.pid) {
		t.Fatalf("pid %d died in a failed dump", p.pid)
	}
}
