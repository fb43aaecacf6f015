package e2e

// What the second user needs for the tests of what one user can do to
// another through the helper: a shared helper (socket mode 0666, as a shared
// machine runs it), processes and commands run as that user, and a raw
// protocol client run as that user (the test binary itself, re-executed),
// for requests the gpucr CLI would never send: what a hostile user's own
// program could.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// TestMain runs the test binary as the raw client when GPUCR_E2E_CLIENT is
// set (see rawAs), as a stale client (GPUCR_E2E_STALE, identity_test.go) or
// its child, as a client that execs a set-user-ID program
// (GPUCR_E2E_SUID_CHILD, costs_test.go), as another user's listener
// (GPUCR_E2E_LISTEN, criuworld_test.go), as a job's owner attacking its
// migration (GPUCR_E2E_PLANT_LINK, GPUCR_E2E_SWAP_FILES,
// migrateattack_test.go), else the tests.
func TestMain(m *testing.M) {
	if socket := os.Getenv("GPUCR_E2E_CLIENT"); socket != "" {
		os.Exit(rawClientMain(socket))
	}
	if socket := os.Getenv("GPUCR_E2E_STALE"); socket != "" {
		os.Exit(staleClientMain(socket))
	}
	if socket := os.Getenv("GPUCR_E2E_STALE_CHILD"); socket != "" {
		os.Exit(staleChildMain(socket))
	}
	if socket := os.Getenv("GPUCR_E2E_SUID_CHILD"); socket != "" {
		os.Exit(setuidChildMain(socket))
	}
	if path := os.Getenv("GPUCR_E2E_LISTEN"); path != "" {
		os.Exit(listenMain(path))
	}
	if args := os.Getenv("GPUCR_E2E_PLANT_LINK"); args != "" {
		os.Exit(plantLinkMain(args))
	}
	if args := os.Getenv("GPUCR_E2E_SWAP_FILES"); args != "" {
		os.Exit(swapFilesMain(args))
	}
	leadSessionInsideNamespace()
	code := m.Run()
	for _, f := range atExit {
		f()
	}
	if binCopyDir != "" {
		os.RemoveAll(binCopyDir)
	}
	os.Exit(code)
}

// leadSessionInsideNamespace makes the tests stand where a shell stands:
// a process they start without setsid is a shell's job, in a session led
// inside its pid namespace. Where the tests run in a session whose leader
// is outside their pid namespace (a CI job in a container started without
// setsid), such a process is one CRIU cannot dump at all, --shell-job or
// not; so the test binary then leads a session of its own, as the shell in
// that container would. The tests that want that other case make it
// themselves (a new pid namespace).
func leadSessionInsideNamespace() {
	if sid, ok := proc.NsSession(proc.Pid(os.Getpid())); ok && sid == 0 {
		if _, err := syscall.Setsid(); err != nil {
			fmt.Fprintf(os.Stderr, "the tests' session is led outside their pid namespace, and setsid failed: %v\n", err)
		}
	}
}

// rawReply is what the raw client prints: the helper's response, or why
// there was none.
type rawReply struct {
	Response  json.RawMessage `json:"response,omitempty"`
	Code      string          `json:"code,omitempty"`
	Message   string          `json:"message,omitempty"`
	Transport string          `json:"transport,omitempty"`
}

func (r rawReply) String() string {
	if r.Transport != "" {
		return "no answer: " + r.Transport
	}
	if r.Code != "" {
		return r.Code + ": " + r.Message
	}
	return "answer " + string(r.Response)
}

// rawClientMain sends the request in $GPUCR_E2E_REQUEST (protojson) on a
// ROLE_CLI connection to socket, with the directory $GPUCR_E2E_DIRFD (if
// set) opened and attached, and prints a rawReply.
func rawClientMain(socket string) int {
	var out rawReply
	defer func() { _ = json.NewEncoder(os.Stdout).Encode(out) }()
	req := &helperpb.Request{}
	if err := protojson.Unmarshal([]byte(os.Getenv("GPUCR_E2E_REQUEST")), req); err != nil {
		out.Transport = "bad request in GPUCR_E2E_REQUEST: " + err.Error()
		return 2
	}
	var fds []int
	if p := os.Getenv("GPUCR_E2E_DIRFD"); p != "" {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			out.Transport = fmt.Sprintf("open %s: %v", p, err)
			return 2
		}
		fds = []int{fd}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := client.Dial(ctx, socket, helperpb.Role_ROLE_CLI, "e2e-raw-client")
	if err != nil {
		out.Transport = err.Error()
		return 1
	}
	defer conn.Close()
	resp, _, err := conn.CallFDs(ctx, req, fds)
	if resp != nil {
		b, _ := protojson.Marshal(resp)
		out.Response = b
		if resp.Error != nil {
			out.Code, out.Message = resp.Error.Code.String(), resp.Error.Message
		}
		return 0
	}
	out.Transport = err.Error()
	return 1
}

var (
	binCopyOnce sync.Once
	binCopyDir  string
	binCopy     string
	binCopyErr  error
)

// testBinary is a copy of this test binary that other users can run (go
// test builds it in a directory only its builder may enter).
func testBinary(t testing.TB) string {
	t.Helper()
	binCopyOnce.Do(func() {
		self, err := os.Executable()
		if err != nil {
			binCopyErr = err
			return
		}
		if binCopyDir, binCopyErr = os.MkdirTemp("", "gpucr-e2e-bin-"); binCopyErr != nil {
			return
		}
		if binCopyErr = os.Chmod(binCopyDir, 0o755); binCopyErr != nil {
			return
		}
		binCopy = filepath.Join(binCopyDir, "e2e.test")
		binCopyErr = copyExec(self, binCopy, 0o755)
	})
	if binCopyErr != nil {
		t.Fatalf("a copy of the test binary for another user: %v", binCopyErr)
	}
	return binCopy
}

func copyExec(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// rawAs sends req to the helper h as user u, from a program of u's own,
// with the directory dirFD (if not "") opened by u and attached.
func rawAs(t testing.TB, u otherUser, h *helperProc, req *helperpb.Request, dirFD string) rawReply {
	t.Helper()
	b, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := asUser(exec.CommandContext(ctx, testBinary(t)), u)
	cmd.Env = []string{"GPUCR_E2E_CLIENT=" + h.socket, "GPUCR_E2E_REQUEST=" + string(b), "GPUCR_E2E_DIRFD=" + dirFD}
	out, err := cmd.Output()
	var r rawReply
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		t.Fatalf("raw client as %s: %v, %v\n%s", u.Name, err, jerr, out)
	}
	return r
}

// sharedHelper starts a helper whose socket everyone may use (mode 0666, in
// a directory everyone may enter), as a shared machine runs it.
func sharedHelper(t testing.TB, dir string, env []string) *helperProc {
	t.Helper()
	openUp(t, dir)
	return startHelperWith(t, dir, env, "--socket-mode", "0666")
}

// openUp makes dir and its parent (t.TempDir's, 0700) enterable by others.
func openUp(t testing.TB, dir string) {
	t.Helper()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// asOther runs a command as u and returns its combined output.
func asOther(t testing.TB, u otherUser, timeout time.Duration, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := asUser(exec.CommandContext(ctx, name, args...), u)
	if env == nil {
		env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	cmd.Env = env
	cmd.Dir = "/"
	b, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", timeout, err)
	}
	return string(b), err
}

// mustAsOther is asOther that fails the test if the command fails.
func mustAsOther(t testing.TB, u otherUser, name string, args ...string) string {
	t.Helper()
	out, err := asOther(t, u, time.Minute, nil, name, args...)
	if err != nil {
		t.Fatalf("%s %s as %s: %v\n%s", name, strings.Join(args, " "), u.Name, err, out)
	}
	return out
}

// startUnderAs is startUnder with the application run as u (its log file
// is opened by the test).
func startUnderAs(t testing.TB, dir string, h *helperProc, env []string, u otherUser, name string, args ...string) *app {
	t.Helper()
	a := &app{t: t, name: name, args: args, log: filepath.Join(dir, name+"-"+u.Name+".log")}
	f, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	full := append([]string{"run", "--socket", h.socket, "--", binPath(t, name)}, args...)
	a.cmd = asUser(exec.Command(binPath(t, "gpucr"), full...), u)
	a.cmd.Env = env
	a.cmd.Dir = "/"
	a.cmd.Stdout, a.cmd.Stderr = f, f
	a.cmd.SysProcAttr.Setsid = true
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("gpucr run %s as %s: %v", name, u.Name, err)
	}
	a.started()
	t.Cleanup(a.kill)
	a.waitFor(30*time.Second, "ready", func(out string, _ []heartbeat) bool {
		return strings.Contains(out, fmt.Sprintf("ready pid=%d", a.pid))
	})
	return a
}

// fileOwner is the uid owning path (not followed).
func fileOwner(t testing.TB, path string) (uid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid, fi.Mode()
}

// treeOf describes every entry under dir (path, type and permissions,
// owner, size, content of small files), to tell whether anything changed.
func treeOf(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s %v uid %d size %d", p, fi.Mode(), st.Uid, fi.Size())
		if fi.Mode().IsRegular() && fi.Size() < 4096 {
			c, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " %q", c)
		}
		b.WriteString("\n")
		return nil
	})
	return b.String()
}
