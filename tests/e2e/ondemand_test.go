package e2e

// Restores that load on demand (gpucr restore --on-demand): the processes
// run while their GPU data loads, and no call sees memory not loaded yet.

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/image"
)

// readyTimes is the restore report's account of when the tree could do what.
type readyTimes struct {
	Ready struct {
		GPULaunch   float64 `json:"gpu_launch_seconds"`
		GPUResident float64 `json:"gpu_resident_seconds"`
	} `json:"ready"`
}

func restoreReady(t *testing.T, out string) readyTimes {
	t.Helper()
	var rep readyTimes
	if i := strings.LastIndex(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("restore --json: %v\n%s", err, out)
	}
	return rep
}

// TestRestoreOnDemand: with every chunk of the load slowed down (a slow
// disk), heartbeat and ptrchase restored on demand are let run well before
// their data is all in, and compute exactly what an uninterrupted run
// does: heartbeat's launches, copies and memsets wait for the buffers they
// touch, and ptrchase's kernels, which follow pointers they read from
// device memory (its PTX says so), wait for everything. The next image of
// the restored heartbeat records the order it touched its buffers in while
// they loaded.
func TestRestoreOnDemand(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=slow-load"))
	for _, tc := range []struct {
		app  string
		args []string
	}{
		{"heartbeat", []string{"--mib", "24", "--still-mib", "40", "--hb-every", "1"}},
		{"ptrchase", []string{"--mib", "24", "--still-mib", "40"}},
	} {
		t.Run(tc.app, func(t *testing.T) {
			img := filepath.Join(dir, tc.app)
			a := startUnder(t, dir, h, env, tc.app, append(append([]string{}, tc.args...), "--interval-ms", "20")...)
			a.waitIter(5, time.Minute)
			cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
			a.reap(30 * time.Second)
			before := a.lastIter()
			rep := restoreReady(t, cliOK(t, h, env, img, "restore", "-D", img, "--on-demand", "--json"))
			// 64 MiB in 4 MiB chunks at 200 ms each: the load takes about two
			// seconds on the two lanes; the process ran long before.
			if rep.Ready.GPUResident-rep.Ready.GPULaunch < 0.3 {
				t.Errorf("the process ran %.3f s into the restore, its data was all in at %.3f s: it did not run on demand",
					rep.Ready.GPULaunch, rep.Ready.GPUResident)
			}
			a.waitIter(before+5, time.Minute)
			if tc.app == "heartbeat" {
				// The restored process's next image keeps the order it
				// touched its buffers in while they loaded.
				img2 := filepath.Join(dir, tc.app+"-again")
				cliOK(t, h, env, img2, "checkpoint", strconv.Itoa(a.pid), "-D", img2, "--leave-running")
				im, err := image.Open(img2)
				if err != nil {
					t.Fatal(err)
				}
				var ranks []int
				for _, b := range im.Buffers() {
					if b.TouchRank > 0 {
						ranks = append(ranks, int(b.TouchRank))
					}
				}
				im.Close()
				// Touches are recorded while the load runs: the buffers the
				// process touched by then rank 1..k, each once (its first
				// step touches them all, but a slow machine may end the load
				// before that step does).
				sort.Ints(ranks)
				ok := len(ranks) > 0
				for i, r := range ranks {
					ok = ok && r == i+1
				}
				if !ok {
					t.Errorf("touch ranks of the next image: %v of %d buffers, want 1..k, each once", ranks, len(im.Buffers()))
				}
			}
			_ = syscall.Kill(a.pid, syscall.SIGKILL)
			waitDead(t, a.pid, 10*time.Second)
			hbs := a.heartbeats()
			compareWithReference(t, hbs, reference(t, env, tc.app, tc.args, maxIter(hbs)))
			waitPidFree(a.pid, 10*time.Second)
		})
	}
}

// TestRestoreOnDemandDamagedChunk: a chunk found damaged while a restored
// process already runs on demand ends that process (it must not compute
// with memory that never came), and gpucr restore fails naming the damage.
// Nothing it printed after the restore differs from an uninterrupted run.
func TestRestoreOnDemandDamagedChunk(t *testing.T) {
	o := dumpSlowLoad(t)
	h, env, img, args, a := o.h, o.env, o.img, o.args, o.a
	// The last chunk of the largest buffer (the still memory): the load
	// takes the small buffers first, so the process runs before this one
	// is read.
	im, err := image.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	big := 0
	for i, b := range im.Buffers() {
		if b.Size > im.Buffers()[big].Size {
			big = i
		}
	}
	chunks := int((im.Buffers()[big].Size + uint64(im.Manifest().GetChunkSize()) - 1) / uint64(im.Manifest().GetChunkSize()))
	f := im.ChunkFile(big, chunks-1)
	im.Close()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0x04
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	before := a.lastIter()
	out, err := cli(t, h, env, "restore", "-D", img, "--on-demand")
	if err == nil || !strings.Contains(out, "corrupt") {
		t.Fatalf("restore of an image with a damaged chunk: %v, want a failure naming the damage:\n%s\n%s", err, out, tail(h.logText(), 20))
	}
	waitDead(t, a.pid, 20*time.Second)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, maxIter(hbs)))
	if got := a.lastIter(); got > before {
		t.Logf("the restored process printed heartbeats up to %d before it was ended (all equal to an uninterrupted run's)", got)
	}
	waitPidFree(a.pid, 10*time.Second)
}

// restoreInBackground starts gpucr restore --on-demand of img and returns
// once the restored process has reattached (its calls now wait for what
// they touch); the command's end is waited for by the returned function.
func restoreInBackground(t *testing.T, h *helperProc, env []string, img string) func() (string, error) {
	t.Helper()
	const back = "reattached client runs again"
	seen := strings.Count(h.logText(), back)
	cmd := exec.Command(binPath(t, "gpucr"), "restore", "-D", img, "--on-demand")
	cmd.Env = append(append(os.Environ(), env...), "GPUCR_SOCKET="+h.socket)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for strings.Count(h.logText(), back) == seen {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the restored process did not come back:\n%s\n%s", out.String(), tail(h.logText(), 20))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return func() (string, error) {
		err := cmd.Wait()
		return out.String(), err
	}
}

// TestRestoreOnDemandInterrupted: what else may happen to a process while
// its GPU data still loads. A checkpoint of it waits for the load (an
// image of memory not loaded yet would not be the process's), and its
// image restores exactly. A process killed then gives its memory back
// without harm to the helper: the load of its part stops, and the image
// restores again, exactly.
func TestRestoreOnDemandInterrupted(t *testing.T) {
	o := dumpSlowLoad(t)
	h, env, dir, img, args, a := o.h, o.env, o.dir, o.img, o.args, o.a

	// A checkpoint while it loads.
	done := restoreInBackground(t, h, env, img)
	img2 := filepath.Join(dir, "img2")
	cliOK(t, h, env, img2, "checkpoint", strconv.Itoa(a.pid), "-D", img2)
	if out, err := done(); err != nil {
		t.Logf("the restore on demand, checkpointed before it ended: %v\n%s", err, out)
	}
	waitDead(t, a.pid, 20*time.Second)
	waitPidFree(a.pid, 10*time.Second)
	if !strings.Contains(h.logText(), "restored process has all its GPU data") {
		t.Errorf("the checkpoint did not wait for the load:\n%s", tail(h.logText(), 30))
	}
	before := a.lastIter()
	cliOK(t, h, env, img2, "restore", "-D", img2)
	a.waitIter(before+5, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	waitDead(t, a.pid, 10*time.Second)
	waitPidFree(a.pid, 10*time.Second)

	// Killed while it loads.
	done = restoreInBackground(t, h, env, img)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	if out, err := done(); err == nil || !strings.Contains(out, "ended before its GPU data was all loaded") {
		t.Errorf("the restore of a process killed while it loaded: %v, want a failure saying so:\n%s", err, out)
	}
	waitDead(t, a.pid, 20*time.Second)
	waitPidFree(a.pid, 10*time.Second)
	before = a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img, "--on-demand")
	a.waitIter(before+5, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	waitDead(t, a.pid, 10*time.Second)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, maxIter(hbs)))
	waitPidFree(a.pid, 10*time.Second)
}

// slowLoad is heartbeat dumped under a helper whose loads are slowed down
// (GPUCR_FAULT=slow-load): 64 MiB in 4 MiB chunks at 200 ms each.
type slowLoad struct {
	h        *helperProc
	env      []string
	dir, img string
	args     []string // heartbeat's, without the interval
	a        *app     // the dumped process (gone)
}

func dumpSlowLoad(t *testing.T) slowLoad {
	t.Helper()
	needTool(t, "criu")
	o := slowLoad{dir: t.TempDir(), env: gpucrEnv(t), args: []string{"--mib", "24", "--still-mib", "40", "--hb-every", "1"}}
	o.h = startHelper(t, o.dir, append(append([]string{}, o.env...), "GPUCR_FAULT=slow-load"))
	o.img = filepath.Join(o.dir, "img")
	o.a = startUnder(t, o.dir, o.h, o.env, "heartbeat", append(append([]string{}, o.args...), "--interval-ms", "20")...)
	o.a.waitIter(5, time.Minute)
	cliOK(t, o.h, o.env, o.img, "checkpoint", strconv.Itoa(o.a.pid), "-D", o.img)
	o.a.reap(30 * time.Second)
	return o
}
