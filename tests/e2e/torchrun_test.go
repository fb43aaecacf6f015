package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// torchrunRank is a rank of a torchrun-shaped job: it reads what torchrun
// gives its workers, rank 0 listens on MASTER_PORT (as the store of an
// env:// job does) and rank 1 connects to it; every 20 ms they pass a
// counter back and forth and each prints "rN hb ITER VALUE". The values
// depend on every exchange before, so a lost or repeated one shows.
// argv: ITERS [fail-at-ITER]: with a fail iteration rank 1 exits 1 there,
// and the ranks exchange nothing (rank 0 only prints), so that rank 0 runs
// on until it is stopped.
const torchrunRank = `import os, socket, struct, sys, time
def say(line):
    os.write(1, (line + "\n").encode())  # one write: the ranks share the log
rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
iters = int(sys.argv[1])
fail = int(sys.argv[2]) if len(sys.argv) > 2 else 0
say("ready rank=%d pid=%d world=%d local=%d libuv=%s" % (rank, os.getpid(), world, local, os.environ.get("USE_LIBUV")))
if fail:
    for i in range(1, iters + 1):
        say("r%d hb %d 0" % (rank, i))
        if rank == 1 and i == fail:
            sys.exit(1)
        time.sleep(0.02)
    sys.exit(0)
if rank == 0:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("", port))
    srv.listen(1)
    conn, _ = srv.accept()
else:
    deadline = time.time() + 30
    while True:
        try:
            conn = socket.create_connection((addr, port))
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
def recv():
    b = b""
    while len(b) < 8:
        c = conn.recv(8 - len(b))
        if not c:
            sys.exit("rank %d: peer closed" % rank)
        b += c
    return struct.unpack("!Q", b)[0]
x = 1
for i in range(1, iters + 1):
    if rank == 0:
        conn.sendall(struct.pack("!Q", x))
        x = (recv() * 7 + 1) % 1000003
    else:
        x = (recv() * 31 + i) % 1000003
        conn.sendall(struct.pack("!Q", x))
    say("r%d hb %d %d" % (rank, i, x))
    time.sleep(0.02)
`

// torchrunExpected is what an uninterrupted run of torchrunRank prints:
// "rN hb ITER VALUE" for both ranks, by rank and iteration.
func torchrunExpected(iters int) [2]map[int]int {
	want := [2]map[int]int{{}, {}}
	x := 1
	for i := 1; i <= iters; i++ {
		y := (x*31 + i) % 1000003
		want[1][i] = y
		x = (y*7 + 1) % 1000003
		want[0][i] = x
	}
	return want
}

var rankHB = regexp.MustCompile(`(?m)^r([01]) hb (\d+) (\d+)$`)

// rankHeartbeats are the heartbeats of each rank, in the order printed.
func rankHeartbeats(out string) [2][][2]int {
	var hbs [2][][2]int
	for _, m := range rankHB.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(m[1])
		i, _ := strconv.Atoi(m[2])
		v, _ := strconv.Atoi(m[3])
		hbs[r] = append(hbs[r], [2]int{i, v})
	}
	return hbs
}

var launchedRank = regexp.MustCompile(`gpucr torchrun: rank (\d) \(local rank (\d)\) pid (\d+)`)

// startTorchrun starts `gpucr torchrun ARGS` in a session of its own, its
// output in DIR/torchrun.log, and waits for both ranks' ready lines.
func startTorchrun(t *testing.T, dir string, h *helperProc, env []string, args ...string) (*app, []int) {
	t.Helper()
	a := &app{t: t, name: "torchrun", log: filepath.Join(dir, "torchrun.log")}
	f, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a.cmd = exec.Command(binPath(t, "gpucr"), append([]string{"torchrun", "--socket", h.socket}, args...)...)
	a.cmd.Env = env
	a.cmd.Stdout, a.cmd.Stderr = f, f
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("gpucr torchrun: %v", err)
	}
	a.started()
	var ranks []int
	t.Cleanup(func() {
		for _, p := range ranks {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		a.kill()
	})
	a.waitFor(30*time.Second, "both ranks ready", func(out string, _ []heartbeat) bool {
		return strings.Count(out, "ready rank=") == 2
	})
	out := a.output()
	for _, m := range launchedRank.FindAllStringSubmatch(out, -1) {
		pid, _ := strconv.Atoi(m[3])
		ranks = append(ranks, pid)
		want := fmt.Sprintf("ready rank=%s pid=%d world=2 local=%s libuv=0", m[1], pid, m[2])
		if !strings.Contains(out, want) {
			t.Errorf("rank %s: no line %q:\n%s", m[1], want, tail(out, 10))
		}
	}
	if len(ranks) != 2 {
		t.Fatalf("gpucr torchrun named %d ranks, want 2:\n%s", len(ranks), tail(out, 10))
	}
	return a, ranks
}

// TestTorchrunCheckpointRestore: a two-rank job started by `gpucr torchrun
// --standalone --nproc-per-node 2` (the ranks connected over TCP, as
// through an env:// store) is checkpointed whole through the launcher's
// pid, and restored; both ranks go on exactly where they were (every value
// equal to an uninterrupted run's, none missing or repeated) to their end,
// and the launcher then exits 0.
func TestTorchrunCheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	needTool(t, "python3")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	script := filepath.Join(dir, "rank.py")
	if err := os.WriteFile(script, []byte(torchrunRank), 0o644); err != nil {
		t.Fatal(err)
	}
	const iters = 300
	a, ranks := startTorchrun(t, dir, h, env, "--standalone", "--nproc-per-node", "2", script, strconv.Itoa(iters))
	a.waitFor(time.Minute, "iteration 40 of both ranks", func(out string, _ []heartbeat) bool {
		hbs := rankHeartbeats(out)
		return len(hbs[0]) >= 40 && len(hbs[1]) >= 40
	})
	// the launcher is no client; the ranks, which use no GPU here, none
	// either: status says so of the tree, and fails for none of it
	if out, err := cli(t, h, env, "status", strconv.Itoa(a.pid)); err != nil ||
		!strings.Contains(out, fmt.Sprintf("pid %d and the 2 processes under it", a.pid)) {
		t.Errorf("gpucr status %d (the launcher): %v\n%s", a.pid, err, out)
	}
	img := filepath.Join(dir, "img")
	// No CRIU flags: the connection between the ranks is inside the tree,
	// and gpucr chooses what CRIU needs for it.
	if out := cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img); !strings.Contains(out, "--tcp-established") {
		t.Errorf("the checkpoint of the launcher's tree did not choose --tcp-established for the ranks' connection:\n%s", out)
	}
	a.reap(30 * time.Second)
	before := rankHeartbeats(a.output())
	for _, p := range ranks {
		waitPidFree(p, 10*time.Second)
	}
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitFor(2*time.Minute, "the launcher's end", func(out string, _ []heartbeat) bool {
		return strings.Contains(out, "gpucr torchrun: all 2 ranks exited 0")
	})
	waitDead(t, a.pid, 10*time.Second)
	out := a.output()
	hbs := rankHeartbeats(out)
	want := torchrunExpected(iters)
	for r := range 2 {
		if len(before[r]) >= iters {
			t.Errorf("rank %d had ended before the checkpoint", r)
		}
		if len(hbs[r]) != iters {
			t.Errorf("rank %d printed %d heartbeats, want %d", r, len(hbs[r]), iters)
		}
		for k, hb := range hbs[r] {
			if hb[0] != k+1 || hb[1] != want[r][hb[0]] {
				t.Errorf("rank %d heartbeat %d: iteration %d value %d, want iteration %d value %d", r, k, hb[0], hb[1], k+1, want[r][k+1])
				break
			}
		}
	}
	if t.Failed() {
		t.Logf("the job's output:\n%s", tail(out, 40))
	}
	if strings.Contains(out, "Traceback") {
		t.Errorf("a rank failed:\n%s", tail(out, 20))
	}
}

// torchrunAgent is a torchrun-shaped launcher: it holds an io_uring
// instance, as torchrun's agent does through its TCPStore servers' libuv
// loops, and starts two ranks of torchrunRank with torchrun's environment.
// argv: RANK_SCRIPT ITERS PORT.
const torchrunAgent = `import ctypes, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
params = (ctypes.c_char * 120)()
if libc.syscall(425, 4, params) < 0:  # io_uring_setup
    print("no io_uring: errno %d" % ctypes.get_errno(), flush=True)
    sys.exit(0)
ranks = []
for r in range(2):
    env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="localhost", MASTER_PORT=sys.argv[3])
    ranks.append(subprocess.Popen([sys.executable, "-u", sys.argv[1], sys.argv[2]], env=env))
print("ready pid=%d" % os.getpid(), flush=True)
sys.exit(max(p.wait() for p in ranks))
`

// TestTorchrunShapedAgentRefused: the same two-rank job under a launcher
// that holds io_uring, as torchrun's agent does, cannot be checkpointed:
// gpucr checkpoint of the launcher fails, its hint names io_uring, and the
// job runs on (what gpucr torchrun, above, is for).
func TestTorchrunShapedAgentRefused(t *testing.T) {
	needTool(t, "criu")
	py := needTool(t, "python3")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	script, agent := filepath.Join(dir, "rank.py"), filepath.Join(dir, "agent.py")
	for f, text := range map[string]string{script: torchrunRank, agent: torchrunAgent} {
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a := startUnderArgv(t, dir, h, env, "agent", []string{py, agent, script, "100000", "29517"})
	a.waitFor(time.Minute, "iteration 20 of both ranks", func(out string, _ []heartbeat) bool {
		hbs := rankHeartbeats(out)
		return strings.Contains(out, "no io_uring") || len(hbs[0]) >= 20 && len(hbs[1]) >= 20
	})
	if out := a.output(); strings.Contains(out, "no io_uring") {
		t.Skipf("this kernel makes no io_uring instance: %s", tail(out, 3))
	}
	ranks := children(a.pid)
	t.Cleanup(func() {
		for _, p := range ranks {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})
	img := filepath.Join(dir, "img")
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	if err == nil {
		t.Fatalf("a torchrun-shaped tree holding io_uring was checkpointed:\n%s", tail(out, 10))
	}
	if !strings.Contains(out, fmt.Sprintf("hint: process %d (", a.pid)) || !strings.Contains(out, "holds an io_uring instance") {
		t.Errorf("the failure does not name the launcher's io_uring:\n%s", tail(out, 12))
	}
	before := len(rankHeartbeats(a.output())[1])
	a.waitFor(30*time.Second, "the ranks running on", func(out string, _ []heartbeat) bool {
		return len(rankHeartbeats(out)[1]) > before+5
	})
}

// TestTorchrunRankFailureStopsTheOthers: when one rank exits 1, gpucr
// torchrun stops the other (SIGTERM) and exits 1, naming the failed rank.
func TestTorchrunRankFailureStopsTheOthers(t *testing.T) {
	needTool(t, "python3")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	script := filepath.Join(dir, "rank.py")
	if err := os.WriteFile(script, []byte(torchrunRank), 0o644); err != nil {
		t.Fatal(err)
	}
	a, ranks := startTorchrun(t, dir, h, env, "--nproc_per_node=2", "--master-port", "0", script, "100000", "30")
	if code := a.wait(time.Minute); code != 1 {
		t.Errorf("gpucr torchrun exited %d after rank 1 exited 1, want 1:\n%s", code, tail(a.output(), 10))
	}
	for _, p := range ranks {
		waitDead(t, p, 5*time.Second)
	}
	out := a.output()
	if !regexp.MustCompile(`rank 1 \(local rank 1, pid \d+\) exited with code 1; stopping the other ranks`).MatchString(out) {
		t.Errorf("the launcher did not name the failed rank:\n%s", tail(out, 10))
	}
	if hbs := rankHeartbeats(out); len(hbs[1]) != 30 {
		t.Errorf("rank 1 printed %d heartbeats, want 30 (it exits there)", len(hbs[1]))
	}
}
