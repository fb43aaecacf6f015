package e2e

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPeerRanksUnderGpucr: two ranks on two (simulated) devices that share
// memory as NCCL does on one host (tests/apps/peerapp.c: host memory through
// cuMem, device memory exported as POSIX fds whose handle values travel to
// the peer and back to the owner's proxy thread, peer mappings, stream memory
// operations as flags) run under `gpucr run` exactly as without it: the same
// checksums, every iteration. What gpucr does not serve passes through, both
// ranks say they are not checkpointable, and why, and a checkpoint is refused
// for that reason without disturbing them.
func TestPeerRanksUnderGpucr(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_SIM_DEVICES=2")
	h := startHelper(t, dir, env)
	args := []string{"--hb-every", "10", "--mib", "4"}
	a := startUnder(t, dir, h, env, "peerapp", append(args, "--iters", "300", "--interval-ms", "5")...)
	a.waitIter(20, time.Minute)
	st := h.status()
	if len(st.Clients) != 2 {
		t.Fatalf("%d clients while both ranks run, want 2: %+v", len(st.Clients), st.Clients)
	}
	for _, c := range st.Clients {
		why := strings.Join(c.NotCheckpointable, "; ")
		if c.Checkpointable || !strings.Contains(why, "imported foreign memory") ||
			!strings.Contains(why, "exported to a shareable handle") || !strings.Contains(why, "application VMM allocations") {
			t.Errorf("rank pid %s: checkpointable %v, reasons %q; want not checkpointable for its imports, its exports and its host memory",
				c.Pid, c.Checkpointable, why)
		}
	}
	// gpucr status PID shows that process alone
	out, err := runErr(10*time.Second, nil, binPath(t, "gpucr"), "status", strconv.Itoa(a.pid), "--json", "--socket", h.socket)
	var one status
	if err != nil || json.Unmarshal([]byte(out), &one) != nil || len(one.Clients) != 1 || one.Clients[0].Pid.String() != strconv.Itoa(a.pid) {
		t.Errorf("gpucr status %d: %v, want that client alone:\n%s", a.pid, err, out)
	}
	if out, err := runErr(10*time.Second, nil, binPath(t, "gpucr"), "status", "1", "--socket", h.socket); err == nil ||
		!strings.Contains(out, "pid 1 is no client") {
		t.Errorf("gpucr status 1: %v, want a refusal naming pid 1:\n%s", err, out)
	}
	// a checkpoint is refused, naming why, and the ranks go on as before
	out, err = gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", filepath.Join(dir, "img"), "--gpu-only", "--leave-running")
	if err == nil || !strings.Contains(out, "not checkpointable") || !strings.Contains(out, "imported foreign memory") {
		t.Errorf("checkpoint of rank 0: err %v, want a refusal naming its imports:\n%s", err, out)
	}
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("peerapp under gpucr: exit %d:\n%s", code, tail(a.output(), 15))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "peerapp", args, 300))
	if hbs := a.heartbeats(); len(hbs) != 30 {
		t.Errorf("%d heartbeats, want 30", len(hbs))
	}
}

// TestPeerRanksDumpRefusedClearly: a CRIU dump (gpucr checkpoint without
// --gpu-only) of the two ranks, which share memory gpucr cannot carry yet,
// fails before anything is frozen for long and says why in the command's
// own output (the process that is not checkpointable and the reasons), not
// only in the helper's log; the ranks run on to their end exactly.
func TestPeerRanksDumpRefusedClearly(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_SIM_DEVICES=2")
	h := startHelper(t, dir, env)
	args := []string{"--hb-every", "10", "--mib", "4"}
	a := startUnder(t, dir, h, env, "peerapp", append(args, "--iters", "300", "--interval-ms", "5")...)
	a.waitIter(20, time.Minute)
	img := filepath.Join(dir, "img")
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	if err == nil || !strings.Contains(out, "not checkpointable") || !strings.Contains(out, "imported foreign memory") {
		t.Errorf("CRIU dump of the ranks: %v, want a refusal naming what is not checkpointable:\n%s", err, out)
	}
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("peerapp after the refused dump: exit %d:\n%s", code, tail(a.output(), 15))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "peerapp", args, 300))
}
