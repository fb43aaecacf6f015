package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
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
// checksums, every iteration. The helper serves all of that memory, the
// peers' imports included, so both ranks are checkpointable; a GPU-only
// checkpoint of one rank alone is refused, naming its peer, without
// disturbing either.
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
	var rank1 string
	for _, c := range st.Clients {
		if !c.Checkpointable {
			t.Errorf("rank pid %s: not checkpointable: %q", c.Pid, strings.Join(c.NotCheckpointable, "; "))
		}
		if c.Pid.String() != strconv.Itoa(a.pid) {
			rank1 = c.Pid.String()
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
	// a checkpoint of one rank alone is refused, naming its peer, and the ranks go on as before
	out, err = gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", filepath.Join(dir, "img"), "--gpu-only", "--leave-running")
	if err == nil || !strings.Contains(out, "shares GPU memory with pid "+rank1) {
		t.Errorf("checkpoint of rank 0 alone: err %v, want a refusal naming rank 1 (pid %s):\n%s", err, rank1, out)
	}
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("peerapp under gpucr: exit %d:\n%s", code, tail(a.output(), 15))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "peerapp", args, 300))
	if hbs := a.heartbeats(); len(hbs) != 30 {
		t.Errorf("%d heartbeats, want 30", len(hbs))
	}
}

// TestPeerRanksCheckpointRestore: the two ranks, which wait for each other
// on the GPU every iteration through flags in each other's memory, are
// checkpointed as one tree by a CRIU dump (gpucr checkpoint), with
// --leave-running and without, and restored: every iteration's checksum
// (over rank 0's buffer and what it received from rank 1) equals an
// uninterrupted run's, before the checkpoint, after it in the ranks that ran
// on, and in the restored ranks, from the image's point to the end. Three
// ranks in a ring on three devices (each importing its next's memory) are
// one group too: both other ranks are checkpointed beside rank 0.
func TestPeerRanksCheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	for _, tc := range []struct {
		name  string
		ranks int
		leave bool
	}{{"leave-running", 2, true}, {"stop", 2, false}, {"three ranks", 3, false}} {
		leave := tc.leave
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := gpucrEnv(t, "GPUCR_SIM_DEVICES="+strconv.Itoa(tc.ranks))
			h := startHelper(t, dir, env)
			args := []string{"--hb-every", "10", "--mib", "4", "--ranks", strconv.Itoa(tc.ranks)}
			a := startUnder(t, dir, h, env, "peerapp", append(args, "--iters", "300", "--interval-ms", "5")...)
			a.waitIter(30, time.Minute)
			img := filepath.Join(dir, "img")
			ck := []string{"checkpoint", strconv.Itoa(a.pid), "-D", img}
			if leave {
				ck = append(ck, "--leave-running")
			}
			cliOK(t, h, env, img, ck...)
			log := h.logText()
			if !strings.Contains(log, "processes sharing GPU memory quiesced together") {
				t.Errorf("the helper did not quiesce the ranks as one group:\n%s", tail(log, 20))
			}
			// the other ranks were checkpointed beside rank 0, not after it
			ahead := regexp.MustCompile(`checkpoint done.*"ahead":\s*true|"ahead":\s*true.*checkpoint done`).FindAllString(log, -1)
			if len(ahead) != tc.ranks-1 {
				t.Errorf("%d ranks checkpointed ahead of their request, want %d:\n%s", len(ahead), tc.ranks-1, tail(log, 20))
			}
			want := reference(t, env, "peerapp", args, 300)
			if leave {
				if code := a.wait(2 * time.Minute); code != 0 {
					t.Fatalf("peerapp after its checkpoint: exit %d:\n%s", code, tail(a.output(), 15))
				}
				compareWithReference(t, a.heartbeats(), want)
			}
			from := restoredFrom(t, a, h, env, img, 300)
			if from <= 30 {
				t.Errorf("the restored ranks began at iteration %d, want past 30 (the image's point)", from)
			}
			if n := len(a.heartbeats()); n < 30 {
				t.Errorf("%d heartbeats in all, want the run's and the restored run's", n)
			}
			compareWithReference(t, a.heartbeats(), want)
		})
	}
}

// TestPeerRanksUnalignedQuiesceBounded: with the helper made to quiesce the
// two ranks one by one (GPUCR_FAULT=no-group-hold), rank 0's GPU waits for
// a flag rank 1 never writes: its drain cannot end. The dump then fails
// within its bounds, saying so, and both ranks run on to their end exactly:
// a checkpoint that cannot drain never hangs the job.
func TestPeerRanksUnalignedQuiesceBounded(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_SIM_DEVICES=2")
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=no-group-hold"))
	args := []string{"--hb-every", "10", "--mib", "4"}
	a := startUnder(t, dir, h, env, "peerapp", append(args, "--iters", "300", "--interval-ms", "5")...)
	a.waitIter(30, time.Minute)
	img := filepath.Join(dir, "img")
	t0 := time.Now()
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	if err == nil || !strings.Contains(out, "did not finish") {
		t.Errorf("dump of ranks quiesced one by one: %v, want a failed drain:\n%s", err, tail(out, 10))
	}
	if took := time.Since(t0); took > time.Minute {
		t.Errorf("the failed dump took %v", took)
	}
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("peerapp after the failed dump: exit %d:\n%s", code, tail(a.output(), 15))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "peerapp", args, 300))
}

// TestRestoreFreesClosedListenPort: a process that serves on a TCP port
// bound without SO_REUSEADDR (as a job's store and NCCL's bootstrap are),
// closing the server's side of each connection first, is dumped and at once
// restored: its listening port is held by connections waiting out their
// TIME_WAIT, which CRIU could not bind past ("Address already in use", as a
// DDP job's restore failed on the GPU machine). The restore ends those
// connections (or, with --wait-time-wait, waits for them), says so, and the
// restored process serves on to its end, exactly.
func TestRestoreFreesClosedListenPort(t *testing.T) {
	needTool(t, "criu")
	for _, tc := range []struct {
		name  string
		flags []string
		says  string
	}{
		{"ended", nil, "closed connection(s) in TIME_WAIT on TCP port"},
		{"waited", []string{"--wait-time-wait"}, "waiting for TCP port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := gpucrEnv(t)
			h := startHelper(t, dir, env)
			args := []string{"--hb-every", "10", "--interval-ms", "5"}
			a := startUnder(t, dir, h, env, "tcpserve", append(args, "--iters", "1500")...)
			a.waitIter(50, time.Minute)
			img := filepath.Join(dir, "img")
			cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--tcp-established")
			waitPidFree(a.pid, 10*time.Second)
			mark := len(a.heartbeats())
			t0 := time.Now()
			out := cliOK(t, h, env, img, append([]string{"restore", "-D", img, "--tcp-established"}, tc.flags...)...)
			if !strings.Contains(out, tc.says) {
				t.Errorf("the restore did not say %q (done in %v):\n%s", tc.says, time.Since(t0), tail(out, 10))
			}
			if tc.flags == nil && strings.Contains(out, "waiting for TCP port") {
				t.Errorf("the restore waited for the port after ending its connections:\n%s", tail(out, 10))
			}
			a.waitFor(2*time.Minute, "the restored process's end", func(s string, hbs []heartbeat) bool {
				return len(hbs) > mark && hbs[len(hbs)-1].Iter >= 1500
			})
			if hbs := a.heartbeats(); hbs[mark].Iter <= 50 {
				t.Errorf("the restored process began at iteration %d, want past 50", hbs[mark].Iter)
			}
			compareWithReference(t, a.heartbeats(), reference(t, env, "tcpserve", args, 1500))
		})
	}
}

// TestRestoreRemakesSocketDirectory: a process that serves on a unix socket
// in a directory of its own, which it removes when it ends (as Python's
// multiprocessing does with /tmp/pymp-*, in every DataLoader with workers),
// is dumped with --leave-running and runs to its end; its image, restored
// after that, binds the socket in that directory again: the restore makes
// it again (CRIU does not: "No such file or directory", as a DDP job's
// restore failed on the GPU machine), and the restored process serves on to
// its end exactly, removing the directory once more.
func TestRestoreRemakesSocketDirectory(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	sockDir := filepath.Join(dir, "pymp-test")
	args := []string{"--hb-every", "10", "--interval-ms", "5", "--unix", sockDir}
	a := startUnder(t, dir, h, env, "tcpserve", append(args, "--iters", "600")...)
	a.waitIter(50, time.Minute)
	img := filepath.Join(dir, "img")
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running")
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("tcpserve after its dump: exit %d:\n%s", code, tail(a.output(), 10))
	}
	if _, err := os.Stat(sockDir); !os.IsNotExist(err) {
		t.Fatalf("the process left its socket's directory behind (%v): the test shows nothing", err)
	}
	waitPidFree(a.pid, 10*time.Second)
	mark := len(a.heartbeats())
	out := cliOK(t, h, env, img, "restore", "-D", img)
	if !strings.Contains(out, "made "+sockDir+" again") {
		t.Errorf("the restore did not say it made the socket's directory again:\n%s", tail(out, 10))
	}
	a.waitFor(time.Minute, "the restored process's end", func(s string, hbs []heartbeat) bool {
		return len(hbs) > mark && hbs[len(hbs)-1].Iter >= 600
	})
	compareWithReference(t, a.heartbeats()[mark:], reference(t, env, "tcpserve", []string{"--hb-every", "10", "--interval-ms", "5",
		"--unix", filepath.Join(dir, "pymp-ref")}, 600))
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(sockDir); os.IsNotExist(err) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("the restored process did not remove its socket's directory at its end")
}

// TestPeerRanksFailedDumpRunsOn: rank 0's checkpoint fails at NVIDIA's lock
// (GPUCR_FAULT=driver-lock@1) after rank 1 was checkpointed beside it, and
// detached, ahead of the dump's request for it, which never comes: the dump
// fails, saying why, and both ranks get their GPU back and run on to their
// end exactly.
func TestPeerRanksFailedDumpRunsOn(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_SIM_DEVICES=2")
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=driver-lock@1"))
	args := []string{"--hb-every", "10", "--mib", "4"}
	a := startUnder(t, dir, h, env, "peerapp", append(args, "--iters", "300", "--interval-ms", "5")...)
	a.waitIter(30, time.Minute)
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", filepath.Join(dir, "img"))
	if err == nil || !strings.Contains(out, "driver lock") {
		t.Errorf("dump with rank 0's driver lock failing: %v, want a failure naming it:\n%s", err, tail(out, 10))
	}
	if log := h.logText(); !strings.Contains(log, `"ahead":true`) {
		t.Errorf("rank 1 was not checkpointed ahead: the test shows nothing:\n%s", tail(log, 20))
	}
	if code := a.wait(2 * time.Minute); code != 0 {
		t.Fatalf("peerapp after the failed dump: exit %d:\n%s", code, tail(a.output(), 15))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "peerapp", args, 300))
}
