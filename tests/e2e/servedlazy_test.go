package e2e

import (
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServedLazyRestore: an image of served processes restores with
// --lazy-pages wherever the host's userfaultfd is (a fault limit no host
// meets, which refuses a lazy restore of in-process GPU processes): no
// NVIDIA restore waits on parked driver state, since a served process holds
// none. The tree runs before its host memory is in, and computes on exactly.
func TestServedLazyRestore(t *testing.T) {
	criu := needTool(t, "criu")
	if out, err := runErr(time.Minute, nil, criu, "--no-default-config", "check", "--feature", "uffd-noncoop"); err != nil {
		t.Skipf("this kernel does not let CRIU restore lazily (criu check --feature uffd-noncoop: %v):\n%s", err, out)
	}
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	img := filepath.Join(dir, "img")
	args := []string{"--mib", "16", "--workers", "2"}
	a := startServed(t, dir, h, env, "heartbeat", nil, append(append([]string{}, args...), "--interval-ms", "20")...)
	a.waitIter(15, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	before := a.lastIter()
	if out := cliOK(t, h, env, img, "image", "inspect", img, "--json"); !strings.Contains(out, `"served"`) {
		t.Errorf("gpucr image inspect --json does not say the process was served:\n%s", out)
	}
	slow := append(append([]string{}, env...), "GPUCR_LAZY_FAULT_LIMIT_US=0.001")
	lazyRestore(t, h, slow, img, a.pid)
	a.waitIter(before+20, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, before)
}
