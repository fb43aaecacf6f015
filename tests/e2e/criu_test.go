package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// appCase is a test application with the parameters the end-to-end tests use:
// small enough for CI, with several buffers and both streams busy.
type appCase struct {
	name string
	args []string
}

var appCases = []appCase{
	{"heartbeat", []string{"--mib", "24", "--buffers", "7", "--hb-every", "5", "--interval-ms", "10"}},
	{"ptrchase", []string{"--mib", "8", "--hb-every", "5", "--interval-ms", "10"}},
	{"vmmapp", []string{"--mib", "8", "--hb-every", "5", "--interval-ms", "10"}},
}

// driverCheckpoint runs the driver's checkpoint API on pid (the cudackpt tool),
// the step that, without gpucr, precedes every CRIU dump of a GPU process.
func driverCheckpoint(t testing.TB, env []string, pid int, actions ...string) string {
	t.Helper()
	args := append(append([]string{}, actions...), strconv.Itoa(pid))
	return run(t, time.Minute, env, binPath(t, "cudackpt"), args...)
}

func driverState(t testing.TB, env []string, pid int) string {
	t.Helper()
	out := driverCheckpoint(t, env, pid, "state")
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, "state=") {
			return strings.TrimPrefix(f, "state=")
		}
	}
	t.Fatalf("no state in cudackpt output:\n%s", out)
	return ""
}

// TestCRIUDumpRestore is the anchor flow on the simulated driver: driver
// lock+checkpoint, CRIU dump (the process dies), CRIU restore, driver
// restore+unlock; the application must go on from where it was with exactly
// the checksums of a run that was never interrupted.
func TestCRIUDumpRestore(t *testing.T) {
	criu := needTool(t, "criu")
	for _, tc := range appCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			img := filepath.Join(dir, "img")
			if err := os.Mkdir(img, 0o700); err != nil {
				t.Fatal(err)
			}
			env := simEnv(t)
			a := startApp(t, dir, tc.name, env, tc.args...)
			a.waitIter(15, time.Minute)

			driverCheckpoint(t, env, a.pid, "lock", "checkpoint")
			if s := driverState(t, env, a.pid); s != "checkpointed" {
				t.Fatalf("driver state after checkpoint: %s", s)
			}
			before := a.lastIter()
			run(t, 2*time.Minute, nil, criu, "dump", "-t", strconv.Itoa(a.pid), "-D", img,
				"-o", "dump.log", "-v4")
			a.reap(30 * time.Second)
			if err := syscall.Kill(a.pid, 0); err == nil {
				t.Fatalf("pid %d still exists after criu dump", a.pid)
			}
			if got := a.lastIter(); got != before {
				t.Fatalf("application advanced from %d to %d while checkpointed", before, got)
			}

			run(t, 2*time.Minute, nil, criu, "restore", "-D", img, "-d", "-o", "restore.log", "-v4")
			if s := procState(a.pid); s == "" {
				t.Fatalf("pid %d not running after criu restore", a.pid)
			}
			// Restored, but still checkpointed on the driver side: it must not advance.
			time.Sleep(200 * time.Millisecond)
			if got := a.lastIter(); got != before {
				t.Fatalf("application advanced before the driver restore (%d -> %d)", before, got)
			}
			driverCheckpoint(t, env, a.pid, "restore", "unlock")
			if s := driverState(t, env, a.pid); s != "running" {
				t.Fatalf("driver state after restore+unlock: %s", s)
			}
			a.waitIter(before+20, time.Minute)
			_ = syscall.Kill(a.pid, syscall.SIGKILL)

			hbs := a.heartbeats()
			ref := reference(t, env, tc.name, tc.args, hbs[len(hbs)-1].Iter)
			compareWithReference(t, hbs, ref)
			checkContinuous(t, hbs, before)
		})
	}
}

// checkContinuous checks the heartbeats after the restore continue the
// iteration count: no restart, no repeated and no missing heartbeat.
func checkContinuous(t testing.TB, hbs []heartbeat, before int) {
	t.Helper()
	if len(hbs) < 2 {
		t.Fatalf("only %d heartbeats", len(hbs))
	}
	step := hbs[1].Iter - hbs[0].Iter
	for i := 1; i < len(hbs); i++ {
		if d := hbs[i].Iter - hbs[i-1].Iter; d != step || d <= 0 {
			t.Fatalf("heartbeat jumped from iteration %d to %d (period %d)", hbs[i-1].Iter, hbs[i].Iter, step)
		}
	}
	if hbs[len(hbs)-1].Iter <= before {
		t.Fatalf("no heartbeat after the restore (last %d)", before)
	}
}
