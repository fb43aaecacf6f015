package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestJobTorchrunTwoNodes: a job started on two hosts by `gpucr torchrun
// --nnodes 2 --node-rank N`, one rank a node, rank 1 connected to rank 0
// across the hosts (as an env:// store's clients are), is checkpointed
// with `gpucr job checkpoint` through each node's launcher and restored
// with `gpucr job restore`: both ranks go on exactly, every value once and
// equal to an uninterrupted run's, to their end.
func TestJobTorchrunTwoNodes(t *testing.T) {
	needTool(t, "python3")
	dir, helperDir, env, h1, h2 := twoJobHosts(t)
	script := filepath.Join(dir, "rank.py")
	if err := os.WriteFile(script, []byte(torchrunRank), 0o644); err != nil {
		t.Fatal(err)
	}
	const iters = 400
	var words []string
	for _, e := range env {
		words = append(words, shq(e))
	}
	logs := [2]string{filepath.Join(dir, "node0.log"), filepath.Join(dir, "node1.log")}
	var launchers [2]int
	for n, h := range []*jobHost{h1, h2} {
		sock := ""
		for _, w := range strings.Fields(h.m.gpucr) {
			if strings.HasPrefix(w, "GPUCR_SOCKET=") {
				sock = strings.TrimPrefix(w, "GPUCR_SOCKET=")
			}
		}
		pidfile := filepath.Join(dir, fmt.Sprintf("launcher%d.pid", n))
		argv := []string{binPath(t, "gpucr"), "torchrun", "--socket", sock, "--nnodes", "2", "--node-rank", strconv.Itoa(n),
			"--nproc-per-node", "1", "--master-addr", h1.linkIP, "--master-port", "29600", script, strconv.Itoa(iters)}
		var q []string
		for _, a := range argv {
			q = append(q, shq(a))
		}
		line := fmt.Sprintf("cd %s || exit 1; setsid sh -c 'echo $$ >%s; exec env -u GPUCR_FAULT %s %s' >%s 2>&1 </dev/null &",
			shq(dir), pidfile, strings.Join(words, " "), strings.Join(q, " "), shq(logs[n]))
		if out, err := h.m.run(line); err != nil {
			t.Fatalf("starting node %d: %v: %s", n, err, out)
		}
		deadline := time.Now().Add(30 * time.Second)
		for launchers[n] == 0 {
			if b, err := os.ReadFile(pidfile); err == nil && strings.HasSuffix(string(b), "\n") {
				launchers[n], _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d's launcher does not start", n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// hbs is each rank's heartbeats, from its node's log
	hbs := func() [2][][2]int {
		var out [2][][2]int
		for n := range 2 {
			b, _ := os.ReadFile(logs[n])
			out[n] = rankHeartbeats(string(b))[n]
		}
		return out
	}
	waitHB := func(n int, what string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			h := hbs()
			if len(h[0]) >= n && len(h[1]) >= n {
				return
			}
			if time.Now().After(deadline) {
				b0, _ := os.ReadFile(logs[0])
				b1, _ := os.ReadFile(logs[1])
				t.Fatalf("%s: %d and %d heartbeats:\n%s\n%s", what, len(h[0]), len(h[1]), tail(string(b0), 10), tail(string(b1), 10))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitHB(40, "the job's start")
	img := filepath.Join(helperDir, "job-img")
	out, err := gpucrJob(t, env, h1, "checkpoint", []string{
		"--part", "root@" + h1.m.addr + "=" + strconv.Itoa(launchers[0]), "--part", "root@" + h2.m.addr + "=" + strconv.Itoa(launchers[1])}, "-D", img)
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job checkpoint of the two launchers: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	before := hbs()
	out, err = gpucrJob(t, env, h1, "restore", restoreParts(h1, h2), "-D", img)
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job restore: %v\n%s", err, out)
	}
	waitHB(iters, "the restored job's end")
	got, want := hbs(), torchrunExpected(iters)
	for r := range 2 {
		if len(before[r]) >= iters {
			t.Errorf("rank %d had ended before the checkpoint", r)
		}
		if len(got[r]) != iters {
			t.Errorf("rank %d printed %d heartbeats, want %d (each once)", r, len(got[r]), iters)
		}
		for k, hb := range got[r] {
			if hb[0] != k+1 || hb[1] != want[r][hb[0]] {
				t.Fatalf("rank %d's heartbeat %d is iteration %d value %d; an uninterrupted run has iteration %d value %d",
					r, k+1, hb[0], hb[1], k+1, want[r][k+1])
			}
		}
	}
}
