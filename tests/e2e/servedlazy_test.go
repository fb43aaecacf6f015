package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/checkpoint"
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
	out := cliOK(t, h, slow, img, "restore", "-D", img, "--lazy-pages", "--json")
	var rep struct {
		Pid   int                     `json:"pid"`
		Ready checkpoint.RestoreReady `json:"ready"`
	}
	if i := strings.LastIndex(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Pid != a.pid {
		t.Fatalf("gpucr restore --lazy-pages --json: %v\n%s", err, out)
	}
	if r := rep.Ready; r.FirstInstruction <= 0 || r.HostResident < r.FirstInstruction {
		t.Errorf("gpucr restore --lazy-pages: ready %+v; want the host memory in after the first instruction", r)
	}
	if b, err := os.ReadFile(filepath.Join(img, "lazy-pages.log")); err != nil || !strings.Contains(string(b), "UFFD transferred pages") {
		t.Errorf("the lazy-pages daemon's log does not say it transferred the pages (%v):\n%s", err, tail(string(b), 10))
	}
	a.waitIter(before+20, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, before)
}
