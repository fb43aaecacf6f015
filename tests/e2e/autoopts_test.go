package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ddpLike is the shape of a DDP job's host side, without a GPU: the root
// holds a POSIX semaphore of multiprocessing's spawn context (glibc maps it
// under a name it unlinked, linked under another: what --link-remap is
// for), listens on 127.0.0.1 as rank 0's store does, and forks a worker
// that connects to it. The worker sends 1, 2, 3, ...; the root answers
// each with its square and the semaphore's value after it took or gave a
// unit (semValue), and the worker appends "i sum value" to MARKS, sum being
// the sum of the squares so far: after a restore, the numbers go on from
// where they were, over the same connection, both ways.
//
// The root and the worker also share 34 MiB of /dev/shm that the root
// unlinked once both had it mapped, as NCCL does with its buffers between
// processes (a file without a name left, which CRIU copies whole only up
// to its --ghost-limit): the root writes each square at its end before
// it answers, and the worker reads it back from there.
//
// With PORT, the root instead talks to a peer outside the tree: it
// connects to 127.0.0.1:PORT, and the lines are the peer's answers.
const ddpLike = `import mmap, multiprocessing as mp, os, socket, struct, sys, time
marks, pidfile = sys.argv[1], sys.argv[2]
s = mp.get_context("spawn").Semaphore(2)
SHM = 34 << 20
buf = None
def worker(c):
    f = c.makefile("rb")
    i = total = 0
    while True:
        i += 1
        c.sendall(b"%d\n" % i)
        sq, v = map(int, f.readline().split())
        if sq != i * i:
            sys.exit("answer %d to %d" % (sq, i))
        if buf is not None and struct.unpack_from("<q", buf, SHM - 8)[0] != sq:
            sys.exit("shared memory holds %d, not %d" % (struct.unpack_from("<q", buf, SHM - 8)[0], sq))
        total += sq
        with open(marks, "a") as m:
            m.write("%d %d %d\n" % (i, total, v))
        time.sleep(0.02)
if len(sys.argv) > 3:
    c = socket.create_connection(("127.0.0.1", int(sys.argv[3])))
    open(pidfile, "w").write("%d\n" % os.getpid())
    worker(c)
shm = "/dev/shm/gpucr-ghost-%d" % os.getpid()
fd = os.open(shm, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, SHM)
buf = mmap.mmap(fd, SHM)
os.close(fd)
buf[:] = b"\x07" * SHM
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(1)
addr = l.getsockname()
kid = os.fork()
if kid == 0:
    l.close()
    worker(socket.create_connection(addr))
a, _ = l.accept()
os.unlink(shm)
open(pidfile, "w").write("%d %d\n" % (os.getpid(), kid))
f = a.makefile("rb")
while True:
    line = f.readline()
    if not line:
        sys.exit(0)
    n = int(line)
    if n % 4 == 0:
        s.release()
    elif s.get_value() > 0:
        s.acquire()
    struct.pack_into("<q", buf, SHM - 8, n * n)
    a.sendall(b"%d %d\n" % (n * n, s.get_value()))
`

// ddpMark is one line of ddpLike's marks.
type ddpMark struct{ i, sum, sem int }

// ddpMarks reads ddpLike's marks file and checks every line: each
// iteration once and in order from 1, its sum the sum of the squares, and
// (for the tree's own connection, sem) the semaphore's value of semLoop's
// sequence.
func ddpMarks(t *testing.T, path string, sem bool) []ddpMark {
	t.Helper()
	b, _ := os.ReadFile(path)
	var out []ddpMark
	sum := 0
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m ddpMark
		if _, err := fmt.Sscanf(l, "%d %d %d", &m.i, &m.sum, &m.sem); err != nil {
			continue // a line being written
		}
		sum += m.i * m.i
		if m.i != len(out)+1 || m.sum != sum || (sem && m.sem != semValue(m.i)) {
			t.Fatalf("mark %q after %d marks: want iteration %d, sum %d, semaphore %d", l, len(out), len(out)+1, sum, semValue(m.i))
		}
		out = append(out, m)
	}
	return out
}

// waitDDPMarks waits until the marks reach iteration n.
func waitDDPMarks(t *testing.T, path string, sem bool, n int) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if m := ddpMarks(t, path, sem); len(m) >= n {
			return len(m)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reach iteration %d: %d", path, n, len(ddpMarks(t, path, sem)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readPids reads ddpLike's pid file.
func readPids(t *testing.T, path string) []int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.HasSuffix(string(b), "\n") {
			var out []int
			for _, f := range strings.Fields(string(b)) {
				n, _ := strconv.Atoi(f)
				out = append(out, n)
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pids in %s", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCheckpointNeedsNoCRIUFlags: a tree like a DDP job's host side (a
// multiprocessing semaphore, shared memory unlinked as NCCL's, a TCP
// connection between two of its processes) is checkpointed and restored
// without a CRIU option: gpucr turns on --link-remap, --ghost-limit,
// --tcp-established and --network-lock skip itself,
// says so, records them, and the restore repeats them. After the restore
// the connection carries the numbers on, both ways, the semaphore holds
// its value, and the two processes still share their memory.
func TestCheckpointNeedsNoCRIUFlags(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := noHelperEnv(dir)
	marks, pidfile := filepath.Join(dir, "marks"), filepath.Join(dir, "pids")
	root := startPyTree(t, dir, "ddp.py", ddpLike, marks, pidfile)
	pids := readPids(t, pidfile)
	waitDDPMarks(t, marks, true, 20)
	img := filepath.Join(dir, "img")
	out, code := gpucrRun(t, env, "checkpoint", strconv.Itoa(root), "-D", img)
	if code != 0 {
		t.Fatalf("checkpoint without CRIU options: exit %d:\n%s", code, out)
	}
	for _, want := range []string{"CRIU options chosen by gpucr for what the tree holds: --link-remap --ghost-limit 34M --tcp-established --network-lock skip",
		"TCP connections with both ends in the tree", "/dev/shm/sem.", "/dev/shm/gpucr-ghost-", "34.0 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("checkpoint output lacks %q:\n%s", want, out)
		}
	}
	var rec struct {
		TCPEstablished bool   `json:"tcp_established"`
		LinkRemap      bool   `json:"link_remap"`
		NetworkLock    string `json:"network_lock"`
	}
	if b, err := os.ReadFile(filepath.Join(img, "gpucr-dump.json")); err != nil || json.Unmarshal(b, &rec) != nil ||
		!rec.TCPEstablished || !rec.LinkRemap || rec.NetworkLock != "skip" {
		t.Errorf("the dump record: %+v (%v)", rec, err)
	}
	for _, pid := range pids {
		waitPidFree(pid, 10*time.Second)
	}
	before := len(ddpMarks(t, marks, true))
	out, code = gpucrRun(t, env, "restore", "-D", img)
	if code != 0 {
		t.Fatalf("restore without CRIU options: exit %d:\n%s", code, out)
	}
	if !strings.Contains(out, "--tcp-established --network-lock skip") {
		t.Errorf("the restore does not say it repeats the dump's options:\n%s", out)
	}
	waitDDPMarks(t, marks, true, before+20)
	for _, pid := range pids {
		if procState(pid) == "" {
			t.Errorf("pid %d of the tree is not back", pid)
		}
	}
}

// outsidePeer is a TCP server of the test, outside any checkpointed tree:
// it answers each number with its square and 0.
func outsidePeer(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					n, _ := strconv.Atoi(strings.TrimSpace(line))
					fmt.Fprintf(c, "%d 0\n", n*n)
				}
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// TestCheckpointRefusesOutsideConnection: a process whose TCP connection's
// other end is outside the tree is not checkpointed: the refusal comes
// before anything stops, names the connection and what to do, and the
// process runs on, its connection untouched. With --tcp-close, the user's
// choice, it is checkpointed (and left running), and gpucr chose no TCP
// option itself; --json lists what it chose.
func TestCheckpointRefusesOutsideConnection(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := noHelperEnv(dir)
	port := outsidePeer(t)
	marks, pidfile := filepath.Join(dir, "marks"), filepath.Join(dir, "pids")
	root := startPyTree(t, dir, "ddp.py", ddpLike, marks, pidfile, strconv.Itoa(port))
	readPids(t, pidfile)
	waitDDPMarks(t, marks, false, 10)
	img := filepath.Join(dir, "img")
	out, code := gpucrRun(t, env, "checkpoint", strconv.Itoa(root), "-D", img)
	peer := fmt.Sprintf("-> 127.0.0.1:%d", port)
	if code != 1 || !strings.Contains(out, "refused before anything was stopped") || !strings.Contains(out, fmt.Sprintf("pid %d (python", root)) ||
		!strings.Contains(out, peer) || !strings.Contains(out, "--tcp-close") {
		t.Fatalf("checkpoint of a process connected outside its tree: exit %d, want 1 naming the connection to %s:\n%s", code, peer, out)
	}
	if _, err := os.Stat(filepath.Join(img, "dump.log")); err == nil {
		t.Errorf("CRIU ran for a refused checkpoint")
	}
	at := len(ddpMarks(t, marks, false))
	waitDDPMarks(t, marks, false, at+10) // it runs on, over its connection

	out, code = gpucrRun(t, env, "checkpoint", strconv.Itoa(root), "-D", img, "--tcp-close", "--leave-running", "--json")
	if code != 0 {
		t.Fatalf("checkpoint --tcp-close: exit %d:\n%s", code, out)
	}
	var res struct {
		AutoOptions []struct{ Option, Why string } `json:"auto_options"`
	}
	lastJSON(t, out, &res)
	if len(res.AutoOptions) != 1 || res.AutoOptions[0].Option != "--link-remap" || !strings.Contains(res.AutoOptions[0].Why, "/dev/shm/sem.") {
		t.Errorf("auto_options with --tcp-close: %+v, want --link-remap alone:\n%s", res.AutoOptions, out)
	}
	b, _ := os.ReadFile(filepath.Join(img, "gpucr-dump.json"))
	if strings.Contains(string(b), "tcp_established") || strings.Contains(string(b), "network_lock") {
		t.Errorf("the record of a --tcp-close dump: %s", b)
	}
	at = len(ddpMarks(t, marks, false))
	waitDDPMarks(t, marks, false, at+10)
}
