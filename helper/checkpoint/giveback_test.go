package checkpoint

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/daemon"
	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/helper/proc"
)

// startHelper serves a helper with one in-process fake device.
func startHelper(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "helper.sock")
	s := daemon.New(daemon.Config{Socket: sock, Version: "t", Log: zap.NewNop(), Devices: []daemon.Device{fakegpu.New(0, 1<<30)}})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

// After a killed dump, each GPU process is described as the helper and
// /proc see it: not a client, gone, or unknown without a helper.
func TestWaitGPUBack(t *testing.T) {
	sock := startHelper(t)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	got := waitGPUBack(sock, []proc.Pid{proc.Pid(os.Getpid()), proc.Pid(gone.Process.Pid)}, 200*time.Millisecond)
	if len(got) != 2 || got[0].Running || got[0].State != "not a client of the helper" || got[1].State != "gone" {
		t.Fatalf("waitGPUBack = %+v", got)
	}
	if s := got[0].describe(); !strings.Contains(s, "has not got its GPU back") {
		t.Errorf("describe: %q", s)
	}
	got = waitGPUBack(filepath.Join(t.TempDir(), "none.sock"), []proc.Pid{proc.Pid(os.Getpid())}, 0)
	if len(got) != 1 || got[0].Running || !strings.Contains(got[0].State, "does not answer") {
		t.Fatalf("waitGPUBack without a helper = %+v", got)
	}
}
