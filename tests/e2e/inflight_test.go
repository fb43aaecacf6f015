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

// inFlightApp holds a TCP connection in flight (connected to its own
// listener, not accepted) until the file RELEASE appears, then accepts it
// and passes 1, 2, 3, ... over it, appending "i" to MARKS for each that
// came back in order. argv: MARKS PENDING RELEASE; PENDING appears once
// the connection is in flight.
const inFlightApp = `import os, socket, sys, time
marks, pending, release = sys.argv[1:4]
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(4)
c = socket.create_connection(l.getsockname())
open(pending, "w").close()
while not os.path.exists(release):
    time.sleep(0.01)
a, _ = l.accept()
f = a.makefile("rb")
i = 0
while True:
    i += 1
    c.sendall(b"%d\n" % i)
    if int(f.readline()) != i:
        sys.exit("out of order at %d" % i)
    with open(marks, "a") as m:
        m.write("%d\n" % i)
    time.sleep(0.01)
`

// TestCheckpointRetriedAfterInFlight: a connection in flight to the tree's
// own listener (its other end in the listener's queue) is the tree's, not
// a peer outside it (the look before the dump once refused it so); the
// dump CRIU refused for it leaves the tree running as it was and is taken
// again; once the connection is accepted the next attempt succeeds, and
// the tree runs on with its connection. The connection is held in flight until the test saw
// the first attempt fail, so that the retry is always what is tested.
func TestCheckpointRetriedAfterInFlight(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := noHelperEnv(dir)
	marks, pending, release := filepath.Join(dir, "marks"), filepath.Join(dir, "pending"), filepath.Join(dir, "release")
	root := startPyTree(t, dir, "inflight.py", inFlightApp, marks, pending, release)
	waitForCond(t, 30*time.Second, func() bool { _, err := os.Stat(pending); return err == nil },
		func() string { return "the connection is not in flight" })
	cmd := exec.Command(binPath(t, "gpucr"), "checkpoint", strconv.Itoa(root), "-D", filepath.Join(dir, "img"), "--leave-running")
	cmd.Env = env
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var out strings.Builder
	sc := bufio.NewScanner(r)
	retried := false
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if !retried && strings.Contains(sc.Text(), "checkpointing again (1 of 3)") {
			retried = true
			if err := os.WriteFile(release, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	if err != nil || !retried || !strings.Contains(out.String(), "not accepted yet by the tree's listener") {
		t.Fatalf("a checkpoint that met a connection in flight, then not: %v (retried: %v)\n%s", err, retried, out.String())
	}
	t.Logf("%s", out.String())
	// the tree runs on, its connection accepted and carrying
	marksMade := func() string { b, _ := os.ReadFile(marks); return string(b) }
	waitForCond(t, 30*time.Second, func() bool { return strings.Count(marksMade(), "\n") >= 30 },
		func() string {
			return fmt.Sprintf("the tree does not run on after the checkpoint: %q", tail(marksMade(), 3))
		})
}
