package cli

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/daemon"
	"github.com/gpucr/gpucr/helper/internal/fakegpu"
)

// The test binary doubles as gpucr for tests that need a real process
// (`gpucr run` execs).
func TestMain(m *testing.M) {
	if os.Getenv("GPUCR_TEST_MAIN") == "1" {
		os.Exit(Run(os.Args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func startHelper(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpucr-cli-test")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "helper.sock")
	s := daemon.New(daemon.Config{Socket: sock, Devices: []daemon.Device{fakegpu.New(0, 1<<30)}, Version: "t", Log: zap.NewNop()})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; os.RemoveAll(dir) })
	return sock
}

func TestStatusJSON(t *testing.T) {
	sock := startHelper(t)
	code, out, errOut := runCLI(t, "status", "--json", "--socket", sock)
	if code != ExitOK {
		t.Fatalf("status: %d %s", code, errOut)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"socket", "helper_version", "devices", "clients"} {
		if _, ok := m[k]; !ok {
			t.Errorf("status --json has no %q: %s", k, out)
		}
	}
	devs, _ := m["devices"].([]any)
	if len(devs) != 1 {
		t.Fatalf("devices: %s", out)
	}
	d := devs[0].(map[string]any)
	for _, k := range []string{"ordinal", "uuid", "name", "total_memory", "granularity"} {
		if _, ok := d[k]; !ok {
			t.Errorf("device has no %q", k)
		}
	}
	if cl, ok := m["clients"].([]any); !ok || len(cl) != 0 {
		t.Errorf("clients: %v", m["clients"])
	}
	code, out, _ = runCLI(t, "status", "--socket", sock)
	if code != ExitOK || !strings.Contains(out, "clients: none") || !strings.Contains(out, "fake GPU") {
		t.Fatalf("status text: %d %q", code, out)
	}
}

func TestStatusNoHelper(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	code, _, errOut := runCLI(t, "status", "--socket", sock)
	if code != ExitFailure || !strings.Contains(errOut, sock) || !strings.Contains(errOut, "no helper answers") {
		t.Fatalf("status without helper: %d %q", code, errOut)
	}
}

func TestClientCommand(t *testing.T) {
	sock := startHelper(t)
	code, _, errOut := runCLI(t, "client", "12345", "stats", "--socket", sock, "--timeout", "1s")
	if code != ExitFailure || !strings.Contains(errOut, "no client with pid 12345") {
		t.Fatalf("unknown pid: %d %q", code, errOut)
	}
	for _, args := range [][]string{{"client", "x", "stats"}, {"client", "1", "explode"}, {"client", "1"}, {"client", "1", "stats", "--nope"}} {
		if code, _, errOut := runCLI(t, args...); code != ExitUsage {
			t.Errorf("%v: exit %d (%q), want %d", args, code, errOut, ExitUsage)
		}
	}
}

func TestRunEnvironment(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libgpucr.so")
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "h.sock")
	cmd := exec.Command(os.Args[0], "run", "--socket", sock, "--", "env")
	cmd.Env = append(os.Environ(), "GPUCR_TEST_MAIN=1", "GPUCR_INTERPOSER="+lib, "LD_PRELOAD=/nonexistent/other.so", "GPUCR_SOCKET=/elsewhere")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gpucr run -- env: %v", err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(l, "=")
		env[k] = v
	}
	if env["LD_PRELOAD"] != lib+":/nonexistent/other.so" || env["GPUCR_SOCKET"] != sock {
		t.Fatalf("LD_PRELOAD=%q GPUCR_SOCKET=%q", env["LD_PRELOAD"], env["GPUCR_SOCKET"])
	}
	// No interposer anywhere: a clear error, exit 1; no command: exit 2.
	t.Setenv("GPUCR_INTERPOSER", filepath.Join(dir, "missing.so"))
	if code, _, errOut := runCLI(t, "run", "--", "true"); code != ExitFailure || !strings.Contains(errOut, "missing.so") {
		t.Fatalf("missing interposer: %d %q", code, errOut)
	}
	if code, _, _ := runCLI(t, "run"); code != ExitUsage {
		t.Fatalf("run without a command: %d", code)
	}
}

func TestFindInterposerOrder(t *testing.T) {
	t.Setenv("GPUCR_INTERPOSER", "")
	if p, err := findInterposer(); err == nil {
		t.Skipf("an interposer is installed here (%s)", p)
	} else if !strings.Contains(err.Error(), "/usr/lib/gpucr/libgpucr.so") || !strings.Contains(err.Error(), "lib/libgpucr.so") {
		t.Fatalf("error does not list where it looked: %v", err)
	}
}
