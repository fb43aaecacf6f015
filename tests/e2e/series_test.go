package e2e

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// inspectTotals is the part of `gpucr image inspect --json` the series test
// reads.
type inspectTotals struct {
	Totals struct {
		Chunks struct {
			Total, Here, Parent, Zero, Dedup int
		} `json:"chunks"`
	} `json:"totals"`
}

func inspect(t *testing.T, h *helperProc, env []string, img string) inspectTotals {
	t.Helper()
	out := cliOK(t, h, env, img, "image", "inspect", "--json", img)
	var doc inspectTotals
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &doc); err != nil {
		t.Fatalf("image inspect --json: %v\n%s", err, out)
	}
	return doc
}

// TestCheckpointSeries: checkpoints of one process into base/1, base/2,
// ... with --auto-parent, through the helper alone and through CRIU: each
// takes the newest committed image before it as its parent; an unchanged
// process stores nothing new; a restore through a chain of parents
// computes exactly (its chunks checked on the GPU); gc of the newest image
// leaves the older ones whole (each image holds links of the chunks it
// shares with its parent, and reads nothing from it), and --auto-parent
// goes on from the newest.
func TestCheckpointSeries(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	base := filepath.Join(dir, "series")
	img := func(n int) string { return filepath.Join(base, strconv.Itoa(n)) }
	args := []string{"--mib", "16", "--buffers", "4", "--hb-every", "1"}
	// A step every 2.5 s: two checkpoints fit between steps.
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "2500")...)
	a.waitIter(1, time.Minute)

	at := a.lastIter()
	out := cliOK(t, h, env, img(1), "checkpoint", strconv.Itoa(a.pid), "-D", img(1), "--gpu-only", "--leave-running", "--auto-parent")
	if !strings.Contains(out, "a full GPU image") {
		t.Errorf("first of the series:\n%s", out)
	}
	out = cliOK(t, h, env, img(2), "checkpoint", strconv.Itoa(a.pid), "-D", img(2), "--gpu-only", "--leave-running", "--auto-parent")
	if !strings.Contains(out, "parent: "+img(1)) {
		t.Errorf("second of the series does not name its parent:\n%s", out)
	}
	if a.lastIter() == at {
		if d := inspect(t, h, env, img(2)); d.Totals.Chunks.Here != 0 || d.Totals.Chunks.Parent == 0 {
			t.Errorf("unchanged process: %+v, want every chunk the parent's", d.Totals.Chunks)
		}
		if !strings.Contains(out, "(0 B over PCIe, 0 B stored)") {
			t.Errorf("unchanged process: the checkpoint moved GPU data:\n%s", out)
		}
	} else {
		t.Logf("the process took a step between the checkpoints: not checking that nothing was stored")
	}

	// A step changes every buffer; then a CRIU dump of the series.
	a.waitIter(a.lastIter()+1, time.Minute)
	out = cliOK(t, h, env, img(3), "checkpoint", strconv.Itoa(a.pid), "-D", img(3), "--auto-parent")
	if !strings.Contains(out, "parent: "+img(2)) {
		t.Errorf("CRIU dump of the series does not name its parent:\n%s", out)
	}
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	before := a.lastIter()
	cliOK(t, h, env, img(3), "restore", "-D", img(3))
	a.waitIter(before+2, time.Minute)

	// gc keeping the newest reads none of the older images: they stay
	// whole, each restorable by itself.
	cliOK(t, h, env, img(3), "image", "gc", img(3))
	for _, n := range []int{1, 2} {
		cliOK(t, h, env, img(n), "image", "verify", img(n))
	}
	out = cliOK(t, h, env, img(4), "checkpoint", strconv.Itoa(a.pid), "-D", img(4), "--gpu-only", "--leave-running", "--auto-parent")
	if !strings.Contains(out, "parent: "+img(3)) {
		t.Errorf("--auto-parent after gc:\n%s", out)
	}
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, before)
}
