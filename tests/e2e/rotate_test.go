package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSeriesRotation: a user keeps the last checkpoints of a series and
// deletes the older ones. Five incremental checkpoints with --auto-parent
// (memory that never changes is stored once for all of them); images 1 and
// 2 are deleted with rm -rf and image 3 with `gpucr image rm`. Images 4 and
// 5 still restore, exactly, and a sixth checkpoint with --auto-parent takes
// the newest image left as its parent. (Before, an incremental image read
// its unchanged chunks from its ancestors' directories: deleting one made
// every later image unrestorable, and --auto-parent failed on it.)
func TestSeriesRotation(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	base := filepath.Join(dir, "series")
	img := func(n int) string { return filepath.Join(base, strconv.Itoa(n)) }
	args := []string{"--mib", "8", "--buffers", "3", "--still-mib", "8", "--hb-every", "1"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "300")...)
	a.waitIter(2, time.Minute)

	at := map[int]int{} // the last heartbeat before each checkpoint
	for n := 1; n <= 5; n++ {
		at[n] = a.lastIter()
		out := cliOK(t, h, env, img(n), "checkpoint", strconv.Itoa(a.pid), "-D", img(n), "--leave-running", "--auto-parent")
		if n > 1 && !strings.Contains(out, "parent: "+img(n-1)) {
			t.Errorf("checkpoint %d does not take %d as its parent:\n%s", n, n-1, out)
		}
		a.waitIter(a.lastIter()+1, time.Minute)
	}
	if d := inspect(t, h, env, img(5)); d.Totals.Chunks.Parent == 0 {
		t.Errorf("image 5 shares no chunk with its parent: %+v", d.Totals.Chunks)
	}
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)

	// The oldest go.
	for _, n := range []int{1, 2} {
		if err := os.RemoveAll(img(n)); err != nil {
			t.Fatal(err)
		}
	}
	out := cliOK(t, h, env, img(3), "image", "rm", img(3))
	if _, err := os.Stat(img(3)); err == nil {
		t.Fatalf("gpucr image rm %s left it:\n%s", img(3), out)
	}

	restore := func(n int) {
		t.Helper()
		seen := len(a.heartbeats())
		cliOK(t, h, env, img(n), "restore", "-D", img(n))
		a.waitFor(time.Minute, "heartbeats after the restore of "+strconv.Itoa(n), func(_ string, hbs []heartbeat) bool {
			return len(hbs) >= seen+3
		})
		if got := a.heartbeats()[seen].Iter; got <= at[n] {
			t.Errorf("the restore of image %d went on at iteration %d, before the checkpoint (%d)", n, got, at[n])
		}
	}
	restore(4)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	waitDead(t, a.pid, 10*time.Second)
	waitPidFree(a.pid, 10*time.Second)
	restore(5)

	// The series goes on from the newest image left.
	out = cliOK(t, h, env, img(6), "checkpoint", strconv.Itoa(a.pid), "-D", img(6), "--leave-running", "--auto-parent")
	if !strings.Contains(out, "parent: "+img(5)) {
		t.Errorf("checkpoint 6 does not take 5 as its parent:\n%s", out)
	}
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	max := 0
	for _, hb := range hbs {
		max = maxInt(max, hb.Iter)
	}
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, max))
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
