package e2e

import (
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestTwoRestoresOfOneImage: two `gpucr restore -D DIR` of one image,
// started together. One restores the process; the other fails at once
// saying that the image is being restored by another gpucr restore, and
// which (instead of both failing, one with "CRIU did not restore this
// process" and the other with CRIU's "Can't fork ... File exists", while
// the process ran). The process computes on exactly.
func TestTwoRestoresOfOneImage(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	args := []string{"--mib", "16", "--buffers", "4", "--hb-every", "5"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "10")...)
	a.waitIter(20, time.Minute)
	img := filepath.Join(dir, "img")
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	before := a.lastIter()

	type result struct {
		out string
		err error
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out, err := cli(t, h, env, "restore", "-D", img)
			results[i] = result{out, err}
		}()
	}
	close(start)
	wg.Wait()
	ok, refused := -1, -1
	for i, r := range results {
		switch {
		case r.err == nil && ok < 0:
			ok = i
		case r.err != nil && strings.Contains(r.out, "the image in "+img+" is being restored by another gpucr restore (pid "):
			refused = i
		}
	}
	if ok < 0 || refused < 0 {
		t.Fatalf("two restores of one image: want one restored and the other refused because of it:\nfirst: %v\n%s\nsecond: %v\n%s",
			results[0].err, results[0].out, results[1].err, results[1].out)
	}
	t.Logf("the refused restore said:\n%s", results[refused].out)
	a.waitIter(before+40, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, before)
}
