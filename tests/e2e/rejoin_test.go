package e2e

// Fault tolerance across a helper restart: the helper dies (a crash, an
// upgrade, the unit's Restart=always) while applications run under gpucr
// run. They run on with the memory they hold, reconnect to the next helper
// on the same socket, move that memory into the new helper's (copied on the
// device, at the same addresses), and are checkpointable again.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rejoinStatus is what these tests read of `gpucr status --json`.
type rejoinStatus struct {
	Clients []struct {
		Pid               int      `json:"pid"`
		Checkpointable    bool     `json:"checkpointable"`
		NotCheckpointable []string `json:"not_checkpointable"`
		Bytes             uint64   `json:"bytes"`
		Rejoined          *struct {
			Allocations uint64 `json:"allocations"`
			Bytes       uint64 `json:"bytes"`
			Left        uint64 `json:"allocations_left"`
		} `json:"rejoined"`
	} `json:"clients"`
}

func rejoinStatusOf(t *testing.T, h *helperProc, env []string) rejoinStatus {
	t.Helper()
	out, err := runErr(10*time.Second, env, binPath(t, "gpucr"), "status", "--json", "--socket", h.socket)
	var st rejoinStatus
	if err == nil {
		err = json.Unmarshal([]byte(out), &st)
	}
	if err != nil {
		t.Fatalf("gpucr status --json: %v\n%s", err, out)
	}
	return st
}

// TestHelperRestartRejoin: three applications run under gpucr run (one with
// cuMemAlloc buffers, one with its own VMM mappings, one with small buffers
// from slabs); the helper is killed (SIGKILL) and they run on; a new helper
// starts on the same socket. Each reconnects to it within seconds, its
// memory moved into the new helper's, and status says so; each is then
// checkpointed and restored, and every heartbeat equals an uninterrupted
// run's.
func TestHelperRestartRejoin(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_REJOIN_INTERVAL_MS=200")
	h := startHelper(t, dir, env)
	type job struct {
		name string
		args []string
		a    *app
	}
	jobs := []*job{
		{name: "heartbeat", args: []string{"--mib", "16", "--buffers", "4", "--interval-ms", "20", "--hb-every", "1"}},
		{name: "vmmapp", args: []string{"--mib", "8", "--interval-ms", "20", "--hb-every", "1"}},
		{name: "ptrchase", args: []string{"--mib", "4", "--buffers", "16", "--interval-ms", "20", "--hb-every", "1"}},
	}
	for _, j := range jobs {
		j.a = startUnder(t, filepath.Join(dir), h, env, j.name, j.args...)
	}
	for _, j := range jobs {
		j.a.waitIter(5, time.Minute)
	}

	// The helper dies; the applications run on.
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = h.cmd.Process.Wait()
	for _, j := range jobs {
		j.a.waitIter(j.a.lastIter()+5, time.Minute)
	}

	// The next helper, on the same socket: every application is its client
	// again, checkpointable, its memory moved into this helper's.
	h2 := startHelper(t, dir, env)
	var st rejoinStatus
	waitForCond(t, 30*time.Second, func() bool {
		st = rejoinStatusOf(t, h2, env)
		ready := 0
		for _, j := range jobs {
			for _, c := range st.Clients {
				if c.Pid == j.a.pid && c.Checkpointable && c.Rejoined != nil && c.Rejoined.Allocations > 0 && c.Rejoined.Left == 0 {
					ready++
				}
			}
		}
		return ready == len(jobs)
	}, func() string {
		b, _ := json.Marshal(st)
		apps := ""
		for _, j := range jobs {
			var said []string
			for _, l := range strings.Split(j.a.output(), "\n") {
				if !strings.HasPrefix(l, "hb ") {
					said = append(said, l)
				}
			}
			apps += fmt.Sprintf("%s (pid %d), its lines but heartbeats:\n%s\n", j.name, j.a.pid, tail(strings.Join(said, "\n"), 8))
		}
		return fmt.Sprintf("the applications did not all rejoin the new helper, checkpointable: %s\n%shelper log:\n%s",
			b, apps, tail(h2.logText(), 20))
	})
	if out := run(t, 10*time.Second, env, binPath(t, "gpucr"), "status", "--socket", h2.socket); !strings.Contains(out, "rejoined") {
		t.Errorf("gpucr status does not say that the applications rejoined:\n%s", out)
	}

	for i, j := range jobs {
		img := filepath.Join(dir, "img-"+strconv.Itoa(i))
		j.a.waitIter(j.a.lastIter()+3, time.Minute)
		cliOK(t, h2, env, img, "checkpoint", strconv.Itoa(j.a.pid), "-D", img)
		j.a.reap(30 * time.Second)
		before := j.a.lastIter()
		cliOK(t, h2, env, img, "restore", "-D", img)
		j.a.waitIter(before+5, time.Minute)
		_ = syscall.Kill(j.a.pid, syscall.SIGKILL)
		waitDead(t, j.a.pid, 10*time.Second)
		compareWithReference(t, j.a.heartbeats(), reference(t, env, j.name, j.args, maxIter(j.a.heartbeats())))
	}
	for _, j := range jobs {
		if strings.Contains(j.a.output(), "aborting") {
			t.Errorf("%s:\n%s", j.name, tail(j.a.output(), 10))
		}
	}
	_ = os.Remove(filepath.Join(dir, "helper.sock"))
}

// TestHelperRestartSharedMemoryStays: ranks that share GPU memory (peerapp,
// as NCCL's ranks do) rejoin the next helper, but their memory stays where
// it is: each rank moving its own would part the copies the others map.
// They run on exactly, and status says why they are not checkpointable.
func TestHelperRestartSharedMemoryStays(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_SIM_DEVICES=2", "GPUCR_REJOIN_INTERVAL_MS=200")
	h := startHelper(t, dir, env)
	args := []string{"--hb-every", "10", "--mib", "4", "--ranks", "2"}
	a := startUnder(t, dir, h, env, "peerapp", append(args, "--iters", "600", "--interval-ms", "5")...)
	a.waitIter(30, time.Minute)
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = h.cmd.Process.Wait()
	h2 := startHelper(t, dir, env)
	var st rejoinStatus
	waitForCond(t, 30*time.Second, func() bool {
		st = rejoinStatusOf(t, h2, env)
		left := 0
		for _, c := range st.Clients {
			if c.Rejoined != nil && c.Rejoined.Left > 0 && !c.Checkpointable &&
				strings.Contains(strings.Join(c.NotCheckpointable, "; "), "helper that ended") {
				left++
			}
		}
		return left == 2
	}, func() string {
		b, _ := json.Marshal(st)
		return fmt.Sprintf("both ranks should have rejoined with their shared memory left where it was: %s\n%s", b, tail(a.output(), 10))
	})
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("peerapp after the helper's restart: exit %d:\n%s", code, tail(a.output(), 15))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "peerapp", args, 600))
}

// TestCheckpointBeforeRejoin: a checkpoint asked for after the helper's
// restart but before the application has rejoined it says so (and to try
// again), not that the program was started without gpucr run; once it has
// rejoined, the same command works.
func TestCheckpointBeforeRejoin(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_REJOIN_INTERVAL_MS=4000")
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "4", "--interval-ms", "20")
	a.waitIter(5, time.Minute)
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
	_, _ = h.cmd.Process.Wait()
	h2 := startHelper(t, dir, env)
	img := filepath.Join(dir, "img")
	out, err := cli(t, h2, env, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running")
	if err == nil || !strings.Contains(out, "rejoins the helper at") || strings.Contains(out, "start the program with") {
		t.Fatalf("a checkpoint before the application rejoined: %v, want a refusal that says it rejoins:\n%s", err, out)
	}
	waitForCond(t, 30*time.Second, func() bool {
		_, _, ok := h2.client(a.pid)
		return ok
	}, func() string { return "the application did not rejoin:\n" + tail(a.output(), 5) })
	cliOK(t, h2, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", "--force")
	a.kill()
}
