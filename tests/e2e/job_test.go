package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A job across two "hosts": two target machines (migrate_test.go), each a
// network namespace with its own pid and mount namespaces, sshd and gpucr
// helper, joined to each other by a veth pair of their own. On each runs a
// part of the job under `gpucr run`: a Python process that talks to the
// other part over TCP across that link, in lockstep, and a heartbeat GPU
// application (the simulated driver) it started.

// jobPart is the exchange each part runs: the server part listens (and
// closes its listener once the client is in), the client connects; then
// every 10 ms each sends (seq, state) and reads the other's, which must
// carry the same seq, and both fold it into their state:
// state = state*31 + peer_state + seq (mod 2^64). Every step is a line
// "x SEQ STATE" in MARKS; a message out of order ends it with "ERR".
//
// The roles "stall" and "flood" instead listen and connect as the server
// and the client, and stream: the flood part writes FLOOD bytes, the
// 8-byte big-endian numbers 0, 1, 2..., as fast as the connection takes
// them, with a line "w BYTES" after each 64 KiB, then "done BYTES"; the
// stall part reads nothing until MARKS.go exists, then reads them all,
// checking each number, and writes "done BYTES".
const jobPart = `import array, os, socket, struct, subprocess, sys, time
role, addr, port, marks, pidfile, hblog = sys.argv[1:7]
hb = sys.argv[8:]
with open(pidfile + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(pidfile + ".tmp", pidfile)
out = open(hblog, "ab")
subprocess.Popen(hb, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
FLOOD = 48 << 20
if role in ("server", "stall"):
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, int(port)))
    l.listen(1)
    s, _ = l.accept()
    l.close()
    state = 1
else:
    for i in range(300):
        try:
            s = socket.create_connection((addr, int(port)))
            break
        except OSError:
            time.sleep(0.05)
    state = 2
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
m = open(marks, "a", buffering=1)
def numbers(first, n):
    a = array.array("Q", range(first, first + n))
    if sys.byteorder == "little":
        a.byteswap()
    return a.tobytes()
if role == "flood":
    sent = 0
    while sent < FLOOD:
        s.sendall(numbers(sent // 8, 8192))
        sent += 65536
        m.write("w %d\n" % sent)
    m.write("done %d\n" % sent)
    while True:
        time.sleep(1)
if role == "stall":
    while not os.path.exists(marks + ".go"):
        time.sleep(0.02)
    got, pend = 0, b""
    while got < FLOOD:
        c = s.recv(1 << 20)
        if not c:
            m.write("ERR connection closed after %d bytes\n" % got)
            sys.exit(1)
        pend += c
        k = len(pend) // 8 * 8
        if pend[:k] != numbers(got // 8, k // 8):
            m.write("ERR bytes %d..%d are not the stream's\n" % (got, got + k))
            sys.exit(1)
        got, pend = got + k, pend[k:]
    m.write("done %d\n" % got)
    while True:
        time.sleep(1)
def recvall(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            m.write("ERR connection closed\n")
            sys.exit(1)
        b += c
    return b
seq = 0
while True:
    seq += 1
    s.sendall(struct.pack("!QQ", seq, state))
    pseq, pstate = struct.unpack("!QQ", recvall(16))
    if pseq != seq:
        m.write("ERR expected %d got %d\n" % (seq, pseq))
        sys.exit(1)
    state = (state * 31 + pstate + seq) & 0xFFFFFFFFFFFFFFFF
    m.write("x %d %x\n" % (seq, state))
    time.sleep(0.01)
`

// jobHost is one host of the job, and its part.
type jobHost struct {
	m      *targetMachine
	linkIP string // its address on the link between the hosts
	marks  string
	pid    int
	hb     *app
}

// startJobHosts starts two machines joined by a link of their own; the
// first one's ssh key opens the second too (one --ssh for the job).
func startJobHosts(t *testing.T, dir, helperDir string, env []string) (*jobHost, *jobHost) {
	t.Helper()
	return startJobHostsConf(t, dir, helperDir, env, "")
}

// startJobHostsConf is startJobHosts with more lines of the second host's
// sshd configuration (SetEnv GPUCR_FAULT=...: its agent's environment).
func startJobHostsConf(t *testing.T, dir, helperDir string, env []string, conf2 string) (*jobHost, *jobHost) {
	t.Helper()
	ip := needTool(t, "ip")
	var hs [2]*jobHost
	for i := range hs {
		d := filepath.Join(dir, fmt.Sprintf("host%d", i+1))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		conf := ""
		if i == 1 {
			conf = conf2
		}
		hs[i] = &jobHost{m: startMachine(t, d, helperDir, env, true, conf)}
	}
	if strings.EqualFold(hs[0].m.addr, hs[1].m.addr) {
		t.Fatalf("both machines are on one subnet (%s): startMachine picks one no machine has", hs[0].m.addr)
	}
	id := randomHex(3)
	n, _ := strconv.ParseUint(id[:2], 16, 8)
	hs[0].linkIP, hs[1].linkIP = fmt.Sprintf("10.214.%d.1", n), fmt.Sprintf("10.214.%d.2", n)
	a, b := "gja"+id, "gjb"+id
	for _, args := range [][]string{
		{"link", "add", a, "type", "veth", "peer", "name", b},
		{"link", "set", a, "netns", hs[0].m.ns},
		{"link", "set", b, "netns", hs[1].m.ns},
		{"-n", hs[0].m.ns, "addr", "add", hs[0].linkIP + "/24", "dev", a},
		{"-n", hs[1].m.ns, "addr", "add", hs[1].linkIP + "/24", "dev", b},
		{"-n", hs[0].m.ns, "link", "set", a, "up"},
		{"-n", hs[1].m.ns, "link", "set", b, "up"},
	} {
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	pub, err := os.ReadFile(filepath.Join(hs[0].m.keys, "client.pub"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(hs[1].m.keys, "authorized_keys"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(pub); err != nil {
		t.Fatal(err)
	}
	return hs[0], hs[1]
}

// twoJobHosts starts two job hosts (startJobHosts) in a new test
// directory, their helpers' sockets in its directory "helper".
func twoJobHosts(t *testing.T) (dir, helperDir string, env []string, h1, h2 *jobHost) {
	t.Helper()
	needTool(t, "criu")
	dir = t.TempDir()
	env = gpucrEnv(t)
	helperDir = filepath.Join(dir, "helper")
	if err := os.MkdirAll(helperDir, 0o755); err != nil {
		t.Fatal(err)
	}
	h1, h2 = startJobHosts(t, dir, helperDir, env)
	return dir, helperDir, env, h1, h2
}

// startPart starts the part of host h under `gpucr run` there: role
// "server" listens on its link address, "client" connects to peer's.
func startPart(t *testing.T, dir string, h *jobHost, env []string, role, connectTo string, hbArgs []string) {
	t.Helper()
	py := needTool(t, "python3")
	script := filepath.Join(dir, "jobpart.py")
	if err := os.WriteFile(script, []byte(jobPart), 0o644); err != nil {
		t.Fatal(err)
	}
	pfx := filepath.Join(dir, role)
	h.marks = pfx + ".marks"
	pidfile, hblog, log := pfx+".pid", pfx+"-heartbeat.log", pfx+".log"
	var words []string
	for _, e := range env {
		words = append(words, shq(e))
	}
	sock := ""
	for _, w := range strings.Fields(h.m.gpucr) {
		if strings.HasPrefix(w, "GPUCR_SOCKET=") {
			sock = strings.TrimPrefix(w, "GPUCR_SOCKET=")
		}
	}
	argv := []string{binPath(t, "gpucr"), "run", "--socket", sock, "--", py, script, role, connectTo, "29500", h.marks, pidfile, hblog, "--",
		binPath(t, "heartbeat")}
	argv = append(argv, hbArgs...)
	var q []string
	for _, a := range argv {
		q = append(q, shq(a))
	}
	// The background job is the one command, its output redirected: a
	// list in the background would be a subshell that waits for it with
	// the session's output open, and ssh would wait for that.
	line := fmt.Sprintf("cd %s || exit 1; setsid env -u GPUCR_FAULT %s GPUCR_SOCKET=%s %s >%s 2>&1 </dev/null &", shq(dir), strings.Join(words, " "), shq(sock),
		strings.Join(q, " "), shq(log))
	if out, err := h.m.run(line); err != nil {
		t.Fatalf("starting the %s part: %v: %s", role, err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for h.pid == 0 {
		if b, err := os.ReadFile(pidfile); err == nil {
			h.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(log)
			t.Fatalf("the %s part does not start:\n%s", role, tail(string(b), 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.hb = &app{t: t, name: "heartbeat", args: hbArgs, log: hblog}
}

// shq quotes a word for the remote shell.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// jobMark is one step of a part's exchange.
type jobMark struct {
	seq   int
	state uint64
}

// readMarks reads a part's steps; a line "ERR ..." fails the test.
func readMarks(t *testing.T, path string) []jobMark {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []jobMark
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) > 0 && fl[0] == "ERR" {
			t.Fatalf("%s: %s", path, sc.Text())
		}
		if len(fl) != 3 || fl[0] != "x" {
			continue
		}
		seq, err1 := strconv.Atoi(fl[1])
		st, err2 := strconv.ParseUint(fl[2], 16, 64)
		if err1 == nil && err2 == nil {
			out = append(out, jobMark{seq, st})
		}
	}
	return out
}

// waitMarks waits until the part at path has made step n.
func waitMarks(t *testing.T, path string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if ms := readMarks(t, path); len(ms) > 0 && ms[len(ms)-1].seq >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no step %d in %v", path, n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkExchange checks both parts' steps against the exchange computed
// here: every step once, in order, from 1, each state what the other
// part's previous state makes it. A message lost, repeated or reordered
// across the checkpoint shows.
func checkExchange(t *testing.T, server, client []jobMark) {
	t.Helper()
	s, c := uint64(1), uint64(2)
	n := min(len(server), len(client))
	if n == 0 {
		t.Fatal("no steps")
	}
	for i := 0; i < n; i++ {
		seq := uint64(i + 1)
		s, c = s*31+c+seq, c*31+s+seq
		if server[i].seq != i+1 || client[i].seq != i+1 {
			t.Fatalf("step %d: the server's is %d, the client's %d", i+1, server[i].seq, client[i].seq)
		}
		if server[i].state != s || client[i].state != c {
			t.Fatalf("step %d: states %x and %x, the exchange computes %x and %x", i+1, server[i].state, client[i].state, s, c)
		}
	}
}

// jobRig is a job of two parts on two hosts as most job tests start it:
// the exchange (jobPart), server on host 1 and client on host 2, each with
// a heartbeat GPU application.
type jobRig struct {
	dir, helperDir string
	env            []string
	h1, h2         *jobHost
	hbArgs         []string
}

// startJobRig starts the two hosts (conf2: more lines of the second one's
// sshd configuration) and both parts, and waits for 30 steps of the
// exchange.
func startJobRig(t *testing.T, conf2 string) *jobRig {
	t.Helper()
	needTool(t, "criu")
	r := &jobRig{dir: t.TempDir(), env: gpucrEnv(t), hbArgs: []string{"--mib", "8", "--interval-ms", "20"}}
	r.helperDir = filepath.Join(r.dir, "helper")
	if err := os.MkdirAll(r.helperDir, 0o755); err != nil {
		t.Fatal(err)
	}
	r.h1, r.h2 = startJobHostsConf(t, r.dir, r.helperDir, r.env, conf2)
	startPart(t, r.dir, r.h1, r.env, "server", r.h1.linkIP, r.hbArgs)
	startPart(t, r.dir, r.h2, r.env, "client", r.h1.linkIP, r.hbArgs)
	waitMarks(t, r.h1.marks, 30, time.Minute)
	return r
}

// checkHeartbeats checks both GPU applications' heartbeats, once each has
// made more beyond its last: continuous, and each equal to an
// uninterrupted run's.
func (r *jobRig) checkHeartbeats(t *testing.T, more int) {
	t.Helper()
	for _, h := range []*jobHost{r.h1, r.h2} {
		if more > 0 {
			h.hb.waitIter(h.hb.lastIter()+more, time.Minute)
		}
		hbs := h.hb.heartbeats()
		checkContinuous(t, hbs, 0)
		compareWithReference(t, hbs, reference(t, r.env, "heartbeat", r.hbArgs, hbs[len(hbs)-1].Iter))
	}
}

// gpucrJob runs `gpucr job VERB PARTS... ARGS...`, reaching the hosts as
// h's key does (jobFlags).
func gpucrJob(t *testing.T, env []string, h *jobHost, verb string, parts []string, args ...string) (string, error) {
	t.Helper()
	argv := append(append(append([]string{"job", verb}, parts...), args...), jobFlags(h)...)
	return runErr(3*time.Minute, env, binPath(t, "gpucr"), argv...)
}

// checkpointParts are the --part flags of a checkpoint of the parts on
// hosts hs: HOST=PID each.
func checkpointParts(hs ...*jobHost) []string {
	var out []string
	for _, h := range hs {
		out = append(out, "--part", "root@"+h.m.addr+"="+strconv.Itoa(h.pid))
	}
	return out
}

// restoreParts are the --part flags of their restore: HOST each.
func restoreParts(hs ...*jobHost) []string {
	var out []string
	for _, h := range hs {
		out = append(out, "--part", "root@"+h.m.addr)
	}
	return out
}

// exchangeGoesOn waits until both parts made n more steps of the
// exchange, and checks every step so far.
func (r *jobRig) exchangeGoesOn(t *testing.T, n int) {
	t.Helper()
	at := len(readMarks(t, r.h1.marks))
	waitMarks(t, r.h1.marks, at+n, time.Minute)
	waitMarks(t, r.h2.marks, at+n, time.Minute)
	checkExchange(t, readMarks(t, r.h1.marks), readMarks(t, r.h2.marks))
}

// jobFlags are the flags that reach both hosts.
func jobFlags(h *jobHost) []string {
	return []string{"--ssh", h.m.ssh, "--remote-gpucr", h.m.gpucr}
}

// TestJobCheckpointRestore: `gpucr job checkpoint` checkpoints both parts of
// the job at one cut, their connection to each other included, without a
// CRIU flag and without iptables: once with --leave-running (the exchange
// goes on at once), then ending them; `gpucr job restore` restores both, and
// the exchange goes on exactly: every message once, in order, with the
// state it had, and both GPU applications compute on as uninterrupted
// runs.
func TestJobCheckpointRestore(t *testing.T) {
	rig := startJobRig(t, "")
	env, helperDir, h1, h2 := rig.env, rig.helperDir, rig.h1, rig.h2
	h1.hb.waitIter(10, time.Minute)
	h2.hb.waitIter(10, time.Minute)
	// the image directory: the same path on both, each host's own (the
	// helper's directory is each machine's own)
	img := filepath.Join(helperDir, "job-img")
	// First with --leave-running: both parts go on at once, their
	// connection out of the repair mode CRIU left it in.
	out, err := gpucrJob(t, env, h1, "checkpoint", checkpointParts(h1, h2), "-D", filepath.Join(helperDir, "job-running"), "--leave-running")
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job checkpoint --leave-running: %v\n%s", err, out)
	}
	rig.exchangeGoesOn(t, 30)
	out, err = gpucrJob(t, env, h1, "checkpoint", checkpointParts(h1, h2), "-D", img, "--json")
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job checkpoint: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	var r struct {
		ID    string  `json:"id"`
		Froze float64 `json:"frozen_seconds"`
		Parts []struct {
			Host  string `json:"host"`
			Conns []struct {
				Local, Remote string
			} `json:"conns"`
		} `json:"parts"`
	}
	lastJSON(t, out, &r)
	if r.ID == "" || len(r.Parts) != 2 || len(r.Parts[0].Conns) != 1 || len(r.Parts[1].Conns) != 1 {
		t.Fatalf("job checkpoint report %+v:\n%s", r, out)
	}
	// both parts are gone, at the same step
	time.Sleep(300 * time.Millisecond)
	s1, c1 := readMarks(t, h1.marks), readMarks(t, h2.marks)
	time.Sleep(300 * time.Millisecond)
	if s2, c2 := readMarks(t, h1.marks), readMarks(t, h2.marks); len(s2) != len(s1) || len(c2) != len(c1) {
		t.Fatalf("the parts ran on after the checkpoint (%d -> %d, %d -> %d steps)", len(s1), len(s2), len(c1), len(c2))
	}
	before1, before2 := h1.hb.lastIter(), h2.hb.lastIter()
	out, err = gpucrJob(t, env, h1, "restore", restoreParts(h1, h2), "-D", img, "--json")
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job restore: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	waitMarks(t, h1.marks, len(s1)+50, time.Minute)
	waitMarks(t, h2.marks, len(c1)+50, time.Minute)
	h1.hb.waitIter(before1+10, time.Minute)
	h2.hb.waitIter(before2+10, time.Minute)
	checkExchange(t, readMarks(t, h1.marks), readMarks(t, h2.marks))
	rig.checkHeartbeats(t, 0)
}

// TestJobCheckpointFailureLeavesPartsRunning: a job checkpoint that fails on
// one host (its image directory holds another image) gives every part back:
// the other part, frozen at the barrier by then, runs on; the exchange
// goes on exactly, and no image of the failed checkpoint is left.
func TestJobCheckpointFailureLeavesPartsRunning(t *testing.T) {
	rig := startJobRig(t, "")
	env, helperDir, h1, h2 := rig.env, rig.helperDir, rig.h1, rig.h2
	img := filepath.Join(helperDir, "job-img")
	// host 2's directory is not empty: its dump refuses
	if out, err := h2.m.run(fmt.Sprintf("mkdir -p %s && echo other >%s/other-file", img, img)); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := gpucrJob(t, env, h1, "checkpoint", checkpointParts(h1, h2), "-D", img)
	if err == nil || !strings.Contains(out, "job checkpoint failed") || !strings.Contains(out, "already holds") ||
		!strings.Contains(out, fmt.Sprintf("pid %d runs on", h1.pid)) || !strings.Contains(out, fmt.Sprintf("pid %d runs on", h2.pid)) {
		jobLogs(t, h1, h2)
		t.Fatalf("a job checkpoint that fails on host 2: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	rig.exchangeGoesOn(t, 50)
	// host 1's image of the aborted checkpoint is gone (host 2's
	// directory keeps only what was there)
	if out, _ := h1.m.run("ls -A " + img + " 2>/dev/null"); strings.TrimSpace(out) != "" {
		t.Errorf("host 1 kept an image of the aborted checkpoint: %s", out)
	}
	if out, _ := h2.m.run("ls -A " + img); strings.TrimSpace(out) != "other-file" {
		t.Errorf("host 2's directory holds %q after the aborted checkpoint", out)
	}
	rig.checkHeartbeats(t, 10)
}

// TestJobCheckpointAbortAfterDump: a job checkpoint in which one part fails
// after it was dumped (an injected fault: GPUCR_FAULT=job-after-dump in its
// agent), while the other is dumped and stopped, waiting for the commit:
// both are continued with their GPU, the exchange goes on exactly, and
// neither host keeps an image.
func TestJobCheckpointAbortAfterDump(t *testing.T) {
	rig := startJobRig(t, "SetEnv GPUCR_FAULT=job-after-dump\n")
	env, helperDir, h1, h2 := rig.env, rig.helperDir, rig.h1, rig.h2
	img := filepath.Join(helperDir, "job-img")
	out, err := gpucrJob(t, env, h1, "checkpoint", checkpointParts(h1, h2), "-D", img)
	if err == nil || !strings.Contains(out, "job checkpoint failed in its dump") || !strings.Contains(out, "injected fault") ||
		!strings.Contains(out, fmt.Sprintf("pid %d runs on", h1.pid)) || !strings.Contains(out, fmt.Sprintf("pid %d runs on", h2.pid)) ||
		!strings.Contains(out, fmt.Sprintf("the source (pid %d) runs on", h1.pid)) {
		jobLogs(t, h1, h2)
		t.Fatalf("a job checkpoint whose second part fails once dumped: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	rig.exchangeGoesOn(t, 50)
	for _, h := range []*jobHost{h1, h2} {
		if out, _ := h.m.run("ls -A " + img + " 2>/dev/null"); strings.TrimSpace(out) != "" {
			t.Errorf("%s kept an image of the aborted checkpoint: %s", h.m.addr, out)
		}
	}
	rig.checkHeartbeats(t, 10)
}

// jobLogs logs the hosts' helper logs and the parts' output, for a failure.
func jobLogs(t *testing.T, hs ...*jobHost) {
	t.Helper()
	for _, h := range hs {
		b, _ := os.ReadFile(h.m.helper)
		t.Logf("helper of %s:\n%s", h.m.addr, tail(string(b), 15))
		b, _ = os.ReadFile(strings.TrimSuffix(h.marks, ".marks") + ".log")
		t.Logf("part at %s:\n%s", h.m.addr, tail(string(b), 15))
	}
}

// TestJobRestoreFailureEndsEveryPart: a job restore in which one part fails
// after every part was made and let go (an injected fault in host 2's
// agent: GPUCR_FAULT=job-after-restore) ends every part, host 1's too,
// which would otherwise wait for its peer for good; both images stay for
// another restore.
func TestJobRestoreFailureEndsEveryPart(t *testing.T) {
	rig := startJobRig(t, "SetEnv GPUCR_FAULT=job-after-restore\n")
	env, helperDir, h1, h2 := rig.env, rig.helperDir, rig.h1, rig.h2
	img := filepath.Join(helperDir, "job-img")
	out, err := gpucrJob(t, env, h1, "checkpoint", checkpointParts(h1, h2), "-D", img)
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job checkpoint: %v\n%s", err, out)
	}
	out, err = gpucrJob(t, env, h1, "restore", restoreParts(h1, h2), "-D", img)
	if err == nil || !strings.Contains(out, "injected fault") || !strings.Contains(out, "no part of the job runs, and every image stays") ||
		strings.Count(out, "its part was ended") != 2 {
		jobLogs(t, h1, h2)
		t.Fatalf("a job restore whose second part fails once restored: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	for _, h := range []*jobHost{h1, h2} {
		if out, _ := h.m.run(fmt.Sprintf("test -d /proc/%d && echo runs", h.pid)); strings.Contains(out, "runs") {
			t.Errorf("%s: the restored part (pid %d) runs on", h.m.addr, h.pid)
		}
		if out, err := h.m.run("ls " + img); err != nil || !strings.Contains(out, "inventory.img") || !strings.Contains(out, "gpucr-job.json") {
			t.Errorf("%s: the image is not whole after the failed restore: %v %s", h.m.addr, err, out)
		}
	}
	n := len(readMarks(t, h1.marks))
	time.Sleep(500 * time.Millisecond)
	if m := len(readMarks(t, h1.marks)); m != n {
		t.Errorf("host 1's part went on (%d -> %d steps) after the failed restore", n, m)
	}
}

// TestJobCheckpointRefusesSharedDirectory: parts that name one image
// directory (-D) on a file system their hosts share would write their
// images into one directory; the job is refused before anything stops,
// naming the way out, every part runs on, and neither the directory nor a
// mark is left. A directory a part (--part HOST=PID:DIR) then checkpoints,
// and so does one path that each host mounts its own directory at.
func TestJobCheckpointRefusesSharedDirectory(t *testing.T) {
	rig := startJobRig(t, "")
	dir, env, h1, h2 := rig.dir, rig.env, rig.h1, rig.h2
	shared := filepath.Join(dir, "shared") // the test's directory: both hosts see it
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(shared, "job-img")
	p1, p2 := "root@"+h1.m.addr+"="+strconv.Itoa(h1.pid), "root@"+h2.m.addr+"="+strconv.Itoa(h2.pid)
	out, err := gpucrJob(t, env, h1, "checkpoint", []string{"--part", p1, "--part", p2}, "-D", img)
	if err == nil || !strings.Contains(out, "refused before anything was stopped") || !strings.Contains(out, "share the file system of "+img) ||
		!strings.Contains(out, "--part HOST=PID:DIR") {
		jobLogs(t, h1, h2)
		t.Fatalf("a job checkpoint whose parts share their one directory: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	if ents, _ := os.ReadDir(shared); len(ents) != 0 {
		t.Errorf("left beside the refused directory: %v", ents)
	}
	rig.exchangeGoesOn(t, 20)
	out, err = gpucrJob(t, env, h1, "checkpoint", []string{"--part", p1 + ":" + filepath.Join(shared, "part1"), "--part", p2 + ":" + filepath.Join(shared, "part2")},
		"--leave-running")
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("the job checkpoint with a directory a part: %v\n%s", err, out)
	}
	rig.exchangeGoesOn(t, 20)
	// One path that is each host's own directory (a mount of each host's
	// under the parent they share) is no shared directory: it checkpoints,
	// each part into its host's.
	own := filepath.Join(shared, "own")
	for i, h := range []*jobHost{h1, h2} {
		mine := filepath.Join(shared, fmt.Sprintf("host%d", i+1))
		if out, err := h.m.run(fmt.Sprintf("mkdir -p %s %s && mount --bind %s %s", own, mine, mine, own)); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	out, err = gpucrJob(t, env, h1, "checkpoint", []string{"--part", p1, "--part", p2}, "-D", own, "--leave-running")
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("the job checkpoint into a directory each host mounts its own at: %v\n%s", err, out)
	}
	for i := range 2 {
		if _, err := os.Stat(filepath.Join(shared, fmt.Sprintf("host%d", i+1), "gpucr-job.json")); err != nil {
			t.Errorf("host %d's part is not in its own directory: %v", i+1, err)
		}
	}
	rig.exchangeGoesOn(t, 20)
}

// TestJobCheckpointRetriedAfterInFlight: a part's dump that met a TCP
// connection in flight (an injected fault in host 2's agent, once:
// GPUCR_FAULT=job-in-flight-once) fails the attempt with every part running
// on, and the job is checkpointed again, all of it, from its prepare; the
// restore is exact.
func TestJobCheckpointRetriedAfterInFlight(t *testing.T) {
	rig := startJobRig(t, "SetEnv GPUCR_FAULT=job-in-flight-once\n")
	env, helperDir, h1, h2 := rig.env, rig.helperDir, rig.h1, rig.h2
	img := filepath.Join(helperDir, "job-img")
	out, err := gpucrJob(t, env, h1, "checkpoint", checkpointParts(h1, h2), "-D", img)
	if err != nil || !strings.Contains(out, "checkpointing the job again (1 of 3)") {
		jobLogs(t, h1, h2)
		t.Fatalf("a job checkpoint whose first attempt met a connection in flight: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	s1 := len(readMarks(t, h1.marks))
	before1, before2 := h1.hb.lastIter(), h2.hb.lastIter()
	out, err = gpucrJob(t, env, h1, "restore", restoreParts(h1, h2), "-D", img)
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job restore: %v\n%s", err, out)
	}
	waitMarks(t, h1.marks, s1+30, time.Minute)
	h1.hb.waitIter(before1+10, time.Minute)
	h2.hb.waitIter(before2+10, time.Minute)
	checkExchange(t, readMarks(t, h1.marks), readMarks(t, h2.marks))
	rig.checkHeartbeats(t, 0)
}

// floodMarks reads the flood or stall part's marks: the last byte count,
// whether it said done, and an "ERR" line fails the test.
func floodMarks(t *testing.T, path string) (bytes int, done bool) {
	t.Helper()
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && f[0] == "ERR":
			t.Fatalf("%s: %s", path, l)
		case len(f) == 2 && (f[0] == "w" || f[0] == "done"):
			bytes, _ = strconv.Atoi(f[1])
			done = f[0] == "done"
		}
	}
	return bytes, done
}

// TestJobCheckpointFullReceiver: one part of the job streams to the other,
// which reads nothing, across the hosts' link. Once both ends' buffers are
// full, the sender's queue holds bytes that the receiver's closed window
// keeps there, and /proc/net/tcp shows them as not acknowledged; nothing
// is in flight though, and a checkpoint must not wait for bytes that will
// never move while every part is frozen. `gpucr job checkpoint` dumps the
// connection so, says which, and `gpucr job restore` brings both ends
// back; the receiver then reads the whole stream, every byte once and in
// order, the sender's queued bytes included.
func TestJobCheckpointFullReceiver(t *testing.T) {
	dir, helperDir, env, h1, h2 := twoJobHosts(t)
	hb := []string{"--mib", "8", "--interval-ms", "20"}
	startPart(t, dir, h1, env, "stall", h1.linkIP, hb)
	startPart(t, dir, h2, env, "flood", h1.linkIP, hb)
	// the stream stops once the receiver's buffer and the sender's queue are full
	sent, still := 0, 0
	for deadline := time.Now().Add(time.Minute); still < 10; time.Sleep(50 * time.Millisecond) {
		n, done := floodMarks(t, h2.marks)
		if done {
			t.Fatalf("the flood part sent all %d bytes: the stall part read them", n)
		}
		if n > 0 && n == sent {
			still++
		} else {
			sent, still = n, 0
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood part does not stall: %d bytes", n)
		}
	}
	h1.hb.waitIter(5, time.Minute)
	h2.hb.waitIter(5, time.Minute)
	img := filepath.Join(helperDir, "job-img")
	out, err := gpucrJob(t, env, h1, "checkpoint", checkpointParts(h1, h2), "-D", img, "--json")
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job checkpoint of a connection whose receiver's buffer is full: %v\n%s", err, out)
	}
	if !strings.Contains(out, "dumped with bytes never sent in its queue: its receiver's buffer was full") {
		t.Errorf("the job checkpoint does not say which connection it dumped with its receiver's buffer full:\n%s", out)
	}
	before1, before2 := h1.hb.lastIter(), h2.hb.lastIter()
	out, err = gpucrJob(t, env, h1, "restore", restoreParts(h1, h2), "-D", img)
	if err != nil {
		jobLogs(t, h1, h2)
		t.Fatalf("gpucr job restore: %v\n%s", err, out)
	}
	if err := os.WriteFile(h1.marks+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		got, done := floodMarks(t, h1.marks)
		if done {
			if sent, _ := floodMarks(t, h2.marks); got != 48<<20 || sent != got {
				t.Errorf("the stall part read %d bytes, the flood part wrote %d; want %d", got, sent, 48<<20)
			}
			break
		}
		if time.Now().After(deadline) {
			jobLogs(t, h1, h2)
			t.Fatalf("the restored stream did not arrive whole: the stall part read %d bytes", got)
		}
	}
	h1.hb.waitIter(before1+10, time.Minute)
	h2.hb.waitIter(before2+10, time.Minute)
}
