package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// startNetRank starts netrank's rank (tests/apps/netrank.c) on host h under
// `gpucr run` there: rank 0 listens on addr, rank 1 connects to it.
func startNetRank(t *testing.T, dir string, h *jobHost, env []string, rank int, addr string, args []string) {
	t.Helper()
	sock := ""
	for _, w := range strings.Fields(h.m.gpucr) {
		if strings.HasPrefix(w, "GPUCR_SOCKET=") {
			sock = strings.TrimPrefix(w, "GPUCR_SOCKET=")
		}
	}
	var words []string
	for _, e := range env {
		words = append(words, shq(e))
	}
	log := filepath.Join(dir, fmt.Sprintf("netrank%d.log", rank))
	argv := append([]string{binPath(t, "gpucr"), "run", "--socket", sock, "--", binPath(t, "netrank"),
		"--rank", strconv.Itoa(rank), "--addr", addr, "--port", "29600"}, args...)
	var q []string
	for _, a := range argv {
		q = append(q, shq(a))
	}
	line := fmt.Sprintf("cd %s || exit 1; setsid env -u GPUCR_FAULT %s %s >%s 2>&1 </dev/null &", shq(dir), strings.Join(words, " "),
		strings.Join(q, " "), shq(log))
	if out, err := h.m.run(line); err != nil {
		t.Fatalf("starting rank %d: %v: %s", rank, err, out)
	}
	h.marks = log // jobLogs shows it
	h.hb = &app{t: t, name: "netrank", log: log}
}

// waitNetRank waits for the ready line of h's rank (once both ranks are
// started: each is ready once connected) and takes its pid.
func waitNetRank(t *testing.T, h *jobHost) {
	t.Helper()
	ready := regexp.MustCompile(`ready pid=(\d+)`)
	deadline := time.Now().Add(30 * time.Second)
	for h.pid == 0 {
		b, _ := os.ReadFile(h.hb.log)
		if m := ready.FindSubmatch(b); m != nil {
			h.pid, _ = strconv.Atoi(string(m[1]))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not start:\n%s", h.hb.log, tail(string(b), 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// netRankReference runs both ranks here, on the simulated driver without
// gpucr, for iters iterations, and returns each one's heartbeats.
func netRankReference(t *testing.T, env []string, args []string, iters int) [2]map[int]string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	var res [2]map[int]string
	errs := make(chan error, 2)
	outs := make([]string, 2)
	for r := range 2 {
		go func() {
			a := append([]string{"--rank", strconv.Itoa(r), "--addr", "127.0.0.1", "--port", port, "--iters", strconv.Itoa(iters),
				"--interval-ms", "0"}, args...)
			out, err := runErr(2*time.Minute, env, binPath(t, "netrank"), a...)
			outs[r] = out
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("netrank's reference run: %v\n%s\n%s", err, outs[0], outs[1])
		}
	}
	for r := range 2 {
		_, hbs := parseHeartbeats(outs[r])
		res[r] = map[int]string{}
		for _, h := range hbs {
			res[r][h.Iter] = h.Checksum
		}
	}
	return res
}

// TestJobCheckpointHoldsCollectives: two ranks on two hosts that meet in a
// collective every iteration (netrank: a kernel NCCL's name, spinning on
// the GPU until a proxy thread has brought the peer's data over TCP), the
// second slow to launch its next one, so that the first rank's kernel
// nearly always waits for it. A host's dump alone would close the slow
// rank's gate before it launched and wait forever for the other's GPU to
// drain; `gpucr job checkpoint` first brings both ranks to one count of
// collectives on every host, then quiesces and drains them all, and only
// then freezes anything. Checkpointed running on, then stopped and restored:
// both ranks compute on exactly as an uninterrupted run of the pair. The
// same with every collective's launch captured into a CUDA graph, which
// is launched (netrank --graph): the launch is counted when the graph runs.
func TestJobCheckpointHoldsCollectives(t *testing.T) {
	for _, c := range []struct {
		name  string
		extra []string
	}{{"launches", nil}, {"graphs", []string{"--graph"}}} {
		t.Run(c.name, func(t *testing.T) { testJobHoldsCollectives(t, c.extra) })
	}
}

func testJobHoldsCollectives(t *testing.T, extra []string) {
	dir, helperDir, env, h1, h2 := twoJobHosts(t)
	args := append([]string{"--mib", "4", "--interval-ms", "2", "--hb-every", "5"}, extra...)
	startNetRank(t, dir, h1, env, 0, h1.linkIP, args)
	startNetRank(t, dir, h2, env, 1, h1.linkIP, append([]string{"--lag-ms", "150"}, args...))
	waitNetRank(t, h1)
	waitNetRank(t, h2)
	h1.hb.waitIter(10, time.Minute)
	h2.hb.waitIter(10, time.Minute)
	// each rank's stats count its launches of the collective's kernel,
	// whose name reaches the interposer mangled, as NCCL's do
	for _, h := range []*jobHost{h1, h2} {
		out, err := h.m.run(fmt.Sprintf("%s client %d stats --json", h.m.gpucr, h.pid))
		var st struct {
			SyncOps string `json:"sync_ops"`
		}
		if err != nil || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("gpucr client %d stats on %s: %v\n%s", h.pid, h.m.addr, err, out)
		}
		if n, _ := strconv.Atoi(st.SyncOps); n < 10 {
			t.Errorf("rank pid %d on %s counted %q operations that wait for a peer after 10 iterations:\n%s", h.pid, h.m.addr, st.SyncOps, out)
		}
	}
	out, err := gpucrJob(t, env, h1, "checkpoint", checkpointParts(h1, h2), "-D", filepath.Join(helperDir, "job-running"), "--leave-running", "--json")
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job checkpoint --leave-running: %v\n%s", err, out)
	}
	var r struct {
		Quiesced float64 `json:"quiesced_seconds"`
		GPUs     int     `json:"gpu_processes"`
		Count    int     `json:"sync_count"`
	}
	lastJSON(t, out, &r)
	if r.GPUs != 2 || r.Count < 10 || r.Quiesced <= 0 {
		t.Errorf("the job checkpoint does not report both ranks brought to one count of collectives:\n%s", out)
	}
	h1.hb.waitIter(h1.hb.lastIter()+10, time.Minute)
	h2.hb.waitIter(h2.hb.lastIter()+10, time.Minute)

	// each part in a directory of its own (--part HOST=PID:DIR), no -D
	img1, img2 := filepath.Join(helperDir, "job-img-1"), filepath.Join(helperDir, "job-img-2")
	out, err = gpucrJob(t, env, h1, "checkpoint", []string{
		"--part", "root@" + h1.m.addr + "=" + strconv.Itoa(h1.pid) + ":" + img1, "--part", "root@" + h2.m.addr + "=" + strconv.Itoa(h2.pid) + ":" + img2})
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job checkpoint: %v\n%s", err, out)
	}
	if !strings.Contains(out, "in "+img1) || !strings.Contains(out, "in "+img2) {
		t.Errorf("the job checkpoint does not name each part's directory:\n%s", out)
	}
	before1, before2 := h1.hb.lastIter(), h2.hb.lastIter()
	out, err = gpucrJob(t, env, h1, "restore", []string{"--part", "root@" + h1.m.addr + "=" + img1, "--part", "root@" + h2.m.addr + "=" + img2})
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job restore: %v\n%s", err, out)
	}
	h1.hb.waitIter(before1+10, time.Minute)
	h2.hb.waitIter(before2+10, time.Minute)
	hbs := [2][]heartbeat{h1.hb.heartbeats(), h2.hb.heartbeats()}
	ref := netRankReference(t, simEnv(t), append([]string{"--lag-ms", "0"}, args...), max(hbs[0][len(hbs[0])-1].Iter, hbs[1][len(hbs[1])-1].Iter))
	for rank := range 2 {
		checkContinuous(t, hbs[rank], 0)
		compareWithReference(t, hbs[rank], ref[rank])
	}
}

// TestSyncHoldIsTheOwners: the helper's sync holds (ClientOp
// OP_HOLD_SYNC, OP_REACH_SYNC, OP_RELEASE_SYNC: a job checkpoint's agent
// holds its host's ranks with them) are refused to another user on root's
// process, which computes on unheld; the user's own connection closing
// leaves nothing held either.
func TestSyncHoldIsTheOwners(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	victim := startUnder(t, dir, h, env, "heartbeat", "--mib", "8", "--interval-ms", "10")
	victim.waitIter(5, time.Minute)
	for _, op := range []helperpb.ClientOp_Op{helperpb.ClientOp_OP_HOLD_SYNC, helperpb.ClientOp_OP_REACH_SYNC, helperpb.ClientOp_OP_RELEASE_SYNC} {
		got := rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_ClientOp{ClientOp: &helperpb.ClientOp{Pid: int64(victim.pid), Op: op,
			SyncTarget: 1 << 40, TimeoutMs: 2000}}}, "")
		if got.Code != helperpb.ErrorCode_ERROR_PERMISSION.String() {
			t.Errorf("uid %d's %v of root's pid %d: %v; want ERROR_PERMISSION", u.UID, op, victim.pid, got)
		}
	}
	before := victim.lastIter()
	victim.waitIter(before+20, 30*time.Second)
}
