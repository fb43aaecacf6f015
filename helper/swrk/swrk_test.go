package swrk

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"
)

// fakeCRIU writes an executable script standing in for criu.
func fakeCRIU(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func procGone(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err != nil
}

// A CRIU that never answers is killed at the deadline, and reaped.
func TestDeadline(t *testing.T) {
	c := Cmd{CRIU: fakeCRIU(t, "exec sleep 60"), Env: []string{"PATH=/usr/bin:/bin"}, Deadline: 300 * time.Millisecond}
	start := time.Now()
	o := c.Dump(opts(), nil)
	if !o.TimedOut || o.Pid <= 0 || o.Hung || o.Err == nil {
		t.Fatalf("outcome %+v: want a timeout that killed swrk and returned", o)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
	if !procGone(o.Pid) {
		t.Errorf("criu swrk (pid %d) not killed and reaped", o.Pid)
	}
}

// Cancel ends a request at once, as the deadline would, but says so; CRIU
// runs in a process group of its own (a terminal's Ctrl-C is for gpucr).
func TestCancel(t *testing.T) {
	cancel := make(chan struct{})
	c := Cmd{CRIU: fakeCRIU(t, "exec sleep 60"), Env: []string{"PATH=/usr/bin:/bin"}, Deadline: time.Minute, Cancel: cancel}
	time.AfterFunc(200*time.Millisecond, func() { close(cancel) })
	start := time.Now()
	o := c.Dump(opts(), nil)
	if !o.Cancelled || o.TimedOut || o.Pid <= 0 || o.Err == nil {
		t.Fatalf("outcome %+v: want a cancellation that killed swrk", o)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v", took)
	}
	if !procGone(o.Pid) {
		t.Errorf("criu swrk (pid %d) not killed and reaped", o.Pid)
	}
}

// CRIU's process group is its own.
func TestOwnProcessGroup(t *testing.T) {
	out := filepath.Join(t.TempDir(), "pgid")
	o := Cmd{CRIU: fakeCRIU(t, "cut -d' ' -f5 /proc/$$/stat > "+out+"; echo $$ >> "+out+"; exit 1"), Env: []string{"PATH=/usr/bin:/bin"},
		Deadline: time.Minute}.Dump(opts(), nil)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("%v (outcome %+v)", err, o)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] != f[1] {
		t.Errorf("criu swrk's process group and pid: %q, want equal", b)
	}
}

// A CRIU that exits without an answer is a failure, not a timeout.
func TestExits(t *testing.T) {
	o := Cmd{CRIU: fakeCRIU(t, "exit 3"), Deadline: time.Minute}.Restore(opts(), nil)
	if o.TimedOut || o.Err == nil || !strings.Contains(o.Err.Error(), "without an answer") {
		t.Fatalf("outcome %+v: want a failure that says CRIU gave no answer", o)
	}
}

// CRIU runs with --no-default-config, exactly the environment given (none
// of this process's), the RPC socket as descriptor 3 and the files given
// as 4, 5.
func TestCommandLineEnvironmentFiles(t *testing.T) {
	out := filepath.Join(t.TempDir(), "seen")
	script := `{ echo "args: $*"; env | sort; for fd in 3 4 5 6; do [ -e /proc/self/fd/$fd ] && echo "fd $fd"; done; } > ` + out + `; exit 1`
	t.Setenv("GPUCR_SWRK_TEST_LEAK", "inherited")
	a, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c := Cmd{CRIU: fakeCRIU(t, script), Env: []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "ONLY=this"},
		Files: []*os.File{a, b}, Deadline: time.Minute}
	if o := c.Dump(opts(), nil); o.Err == nil {
		t.Fatal("a CRIU that exits at once succeeded")
	}
	seen, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	s := string(seen)
	for _, want := range []string{"args: --no-default-config swrk 3\n", "HOME=/nonexistent\n", "ONLY=this\n", "fd 3\n", "fd 4\n", "fd 5\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("CRIU saw no %q:\n%s", want, s)
		}
	}
	for _, unwanted := range []string{"GPUCR_SWRK_TEST_LEAK", "fd 6\n"} {
		if strings.Contains(s, unwanted) {
			t.Errorf("CRIU saw %q:\n%s", unwanted, s)
		}
	}
}

// A CRIU binary that is not there is a clear error.
func TestMissingCRIU(t *testing.T) {
	o := Cmd{CRIU: filepath.Join(t.TempDir(), "criu"), Deadline: time.Minute}.Dump(opts(), nil)
	if o.Err == nil || o.Pid != 0 || !strings.Contains(o.Err.Error(), "start") {
		t.Fatalf("outcome %+v", o)
	}
}

func opts() *rpc.CriuOpts { return &rpc.CriuOpts{ImagesDirFd: proto.Int32(-1)} }
