package e2e

// Concurrent checkpoints (gpucr checkpoint --leave-running --concurrent):
// the GPU memory is snapshotted on the device when the tree stops and
// written into the image while it runs on. The image must hold the
// memory as it was at the stop, not as the process left it later.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/checkpoint"
)

// dumpJSON is what these tests read of `gpucr checkpoint --json`.
type dumpJSON struct {
	Concurrent   bool                `json:"concurrent"`
	Redone       string              `json:"redone"`
	Seconds      float64             `json:"seconds"`
	StallSeconds float64             `json:"stall_seconds"`
	Phases       []checkpoint.Step   `json:"phases"`
	GPU          *checkpoint.GPUCopy `json:"gpu"`
	GPUProcesses []struct {
		Phases []checkpoint.Step `json:"phases"`
	} `json:"gpu_processes"`
}

func parseDump(t *testing.T, out string) dumpJSON {
	t.Helper()
	var d dumpJSON
	i := strings.LastIndex(out, "\n{")
	if err := json.Unmarshal([]byte(out[i+1:]), &d); err != nil {
		t.Fatalf("checkpoint --json: %v\n%s", err, out)
	}
	return d
}

// restoredFrom kills a, restores img and returns the first iteration the
// restored process reports (the image's point), once it has reported
// through iteration upTo.
func restoredFrom(t *testing.T, a *app, h *helperProc, env []string, img string, upTo int) int {
	t.Helper()
	a.kill()
	waitPidFree(a.pid, 10*time.Second)
	mark := len(a.heartbeats())
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitFor(time.Minute, "heartbeats after the restore", func(_ string, hbs []heartbeat) bool {
		return len(hbs) > mark && hbs[len(hbs)-1].Iter >= upTo
	})
	return a.heartbeats()[mark].Iter
}

// TestConcurrentCheckpointExact: each test application (two streams with
// events between them, with and without a CUDA graph; a kernel writing
// through pointers it loads from device memory; VMM allocations) takes many steps, every one rewriting its
// buffers, while its background copy is held back; the image is the process
// at the stop all the same: restored, it starts there and computes exactly
// what an uninterrupted run does.
func TestConcurrentCheckpointExact(t *testing.T) {
	needTool(t, "criu")
	for _, tc := range append([]appCase{graphCase}, appCases...) {
		t.Run(tc.name, func(t *testing.T) {
			concurrentExact(t, tc, nil, func(d dumpJSON, out string, _ *helperProc) {
				if !d.Concurrent {
					t.Errorf("--concurrent did not make a concurrent checkpoint:\n%s", out)
				}
				if names := stepNames(d.Phases); !slices.Contains(names, "gpu-background") {
					t.Errorf("no gpu-background step: %v", names)
				}
				names := stepNames(d.GPUProcesses[0].Phases)
				if !slices.Contains(names, "snapshot") || !slices.Contains(names, "resume") {
					t.Errorf("the helper's steps have no snapshot, or do not go on to the resume: %v", names)
				}
				// The background copy waits 5 s (the fault) after the
				// process runs again: its stop ends long before the command.
				if d.StallSeconds <= 0 || d.StallSeconds > d.Seconds-4 {
					t.Errorf("stopped %.3f s in a checkpoint of %.3f s whose copy was held back 5 s after the resume", d.StallSeconds, d.Seconds)
				}
			})
		})
	}
}

// graphCase is heartbeat with a CUDA graph replayed every iteration, which
// rewrites every buffer.
var graphCase = appCase{"heartbeat-graph", append([]string{"--graph"}, appCases[0].args...)}

// concurrentExact runs tc (bin: its name up to "-graph") under a helper with
// hflags whose background copies wait 5 s, takes a concurrent leave-running
// checkpoint of it and checks, besides what check checks of the report:
// the process ran on meanwhile, the GPU image was committed when the command
// returned, and, restored, the image starts at the stop and continues
// exactly as an uninterrupted run.
func concurrentExact(t *testing.T, tc appCase, hflags []string, check func(d dumpJSON, out string, h *helperProc)) {
	bin := strings.TrimSuffix(tc.name, "-graph")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=stall-background"), hflags...)
	args := append(slices.Clone(tc.args[:len(tc.args)-4]), "--hb-every", "1")
	a := startUnder(t, dir, h, env, bin, append(slices.Clone(args), "--interval-ms", "20")...)
	a.waitIter(5, time.Minute)
	img := filepath.Join(dir, "img")
	before := a.lastIter()
	out := cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", "--concurrent", "--json")
	after := a.lastIter()
	d := parseDump(t, out)
	if len(d.GPUProcesses) != 1 {
		t.Fatalf("GPU processes: %+v", d.GPUProcesses)
	}
	check(d, out, h)
	if after-before < 20 {
		t.Fatalf("the process took %d steps during a checkpoint whose background copy was held back 5 s: it did not run on", after-before)
	}
	if _, err := os.Stat(filepath.Join(img, "gpucr", "manifest.pb")); err != nil {
		t.Fatalf("no committed GPU image once the checkpoint returned: %v", err)
	}
	// Its image committed, no copy-on-write window holds the process back.
	if st := cliOK(t, h, env, img, "status", "--json"); strings.Contains(st, `"window_open":true`) {
		t.Errorf("a copy-on-write window is still open after the checkpoint returned:\n%s", st)
	}
	// The stop came within the command's first second (the background copy
	// then waited 5 s): an image of the process at the stop starts well
	// before the command's end.
	first := restoredFrom(t, a, h, env, img, after+3)
	if first > before+(after-before)/4 {
		t.Errorf("the restored process starts at iteration %d: the image is not the process at the stop (the command ran from iteration %d to %d)",
			first, before, after)
	}
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, bin, args, maxIter(hbs)))
}

// TestConcurrentCheckpointNoRoom: with a snapshot reserve larger than the
// device and no copy-on-write window (--concurrent-mode snapshot), nothing
// is snapshotted: the buffers are copied while the process waits, as
// before, and the image is exact.
func TestConcurrentCheckpointNoRoom(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--snapshot-reserve", "1T", "--concurrent-mode", "snapshot")
	args := []string{"--mib", "8", "--buffers", "3", "--hb-every", "1"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "20")...)
	a.waitIter(5, time.Minute)
	img := filepath.Join(dir, "img")
	before := a.lastIter()
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", "--concurrent")
	if !strings.Contains(h.logText(), "no room to snapshot every buffer") {
		t.Errorf("the helper does not say that it copied while the process waited:\n%s", tail(h.logText(), 20))
	}
	after := a.lastIter()
	a.waitIter(after+10, time.Minute)
	first := restoredFrom(t, a, h, env, img, a.lastIter()+3)
	if first < before || first > after {
		t.Errorf("the restored process starts at iteration %d; the checkpoint ran from %d to %d", first, before, after)
	}
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, maxIter(hbs)))
}

// startStalledCheckpoint starts `gpucr checkpoint ARGS` against h, whose
// helper has the fault stall-background, and returns once the helper holds
// the background copy back (the process runs on meanwhile): the command,
// and what it prints.
func startStalledCheckpoint(t *testing.T, h *helperProc, env []string, args ...string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	out := &strings.Builder{}
	cmd := exec.Command(binPath(t, "gpucr"), append([]string{"checkpoint"}, args...)...)
	cmd.Env = append(append([]string{}, env...), "GPUCR_SOCKET="+h.socket)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(h.logText(), "stalling the background copy") {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the background copy never stalled:\n%s", tail(h.logText(), 20))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cmd, out
}

// TestConcurrentCheckpointHelperDies: the helper dies while the background
// copy of a concurrent checkpoint is held back, the process already running
// on: the process runs on, the checkpoint fails saying that the helper went
// away, its directory holds no image (neither CRIU's nor a GPU image), and
// the previous checkpoint's image restores exactly.
//
// Both with a snapshot and with a copy-on-write window (whose process,
// meanwhile, has the helper save what it writes; once the helper is gone,
// its writes go ahead unguarded).
func TestConcurrentCheckpointHelperDies(t *testing.T) {
	needTool(t, "criu")
	for _, mode := range []string{"auto", "copy-on-write"} {
		t.Run(mode, func(t *testing.T) { concurrentHelperDies(t, mode) })
	}
}

func concurrentHelperDies(t *testing.T, mode string) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=stall-background@2"), "--concurrent-mode", mode)
	args := []string{"--mib", "16", "--buffers", "4", "--hb-every", "1"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "20")...)
	a.waitIter(5, time.Minute)
	prev := filepath.Join(dir, "prev")
	before := a.lastIter()
	cliOK(t, h, env, prev, "checkpoint", strconv.Itoa(a.pid), "-D", prev, "--leave-running", "--concurrent")
	prevAfter := a.lastIter()

	img := filepath.Join(dir, "img")
	cmd, out := startStalledCheckpoint(t, h, env, strconv.Itoa(a.pid), "-D", img, "--leave-running", "--concurrent")
	a.waitIter(a.lastIter()+3, 10*time.Second) // it runs on
	// gpucr status shows the memory the snapshot holds meanwhile
	st := cliOK(t, h, env, img, "status", "--json")
	if m := regexp.MustCompile(`"snapshot_memory":(\d+)`).FindStringSubmatch(st); mode == "auto" && (m == nil || m[1] == "0") {
		t.Errorf("status shows no snapshot memory while the background copy waits:\n%s", st)
	}
	if open := strings.Contains(st, `"window_open":true`); open != (mode == "copy-on-write") {
		t.Errorf("status shows a copy-on-write window open: %v, in mode %s:\n%s", open, mode, st)
	}
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Wait()
	err := waitCmd(cmd, time.Minute)
	t.Logf("%s", out.String())
	if err == nil {
		t.Fatalf("the checkpoint succeeded although its helper died before the GPU image was complete")
	}
	if !strings.Contains(out.String(), "no longer answers") {
		t.Errorf("the failure does not say that the helper went away:\n%s", out.String())
	}
	for _, name := range []string{"inventory.img", filepath.Join("gpucr", "manifest.pb")} {
		if _, err := os.Stat(filepath.Join(img, name)); err == nil {
			t.Errorf("%s holds %s after a checkpoint that failed", img, name)
		}
	}
	at := a.lastIter()
	a.waitIter(at+10, 10*time.Second) // it still runs, without a helper

	h2 := startHelper(t, dir, env)
	first := restoredFrom(t, a, h2, env, prev, at+3)
	if first < before || first > prevAfter {
		t.Errorf("the previous image restores from iteration %d; its checkpoint ran from %d to %d", first, before, prevAfter)
	}
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, maxIter(hbs)))
}

// waitCmd waits for cmd, killing it after timeout.
func waitCmd(cmd *exec.Cmd, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		return <-done
	}
}

// maxIter is the highest iteration reported (a restored process repeats
// those after its image's point).
func maxIter(hbs []heartbeat) int {
	n := 0
	for _, h := range hbs {
		n = max(n, h.Iter)
	}
	return n
}

// TestPreCopyCheckpoint: `gpucr checkpoint --pre-copy N` copies the GPU
// memory in rounds while the process runs (each an image against the one
// before), then dumps it with the last round as the parent; the rounds are
// reported, the process takes steps in between, and the restore computes
// exactly.
func TestPreCopyCheckpoint(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	args := []string{"--mib", "16", "--buffers", "4", "--hb-every", "1"}
	// a step every 1.5 s: most rounds see the memory hold still
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "1500")...)
	a.waitIter(2, time.Minute)
	img := filepath.Join(dir, "img")
	out := cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--pre-copy", "3", "--json")
	var d struct {
		PreCopy []checkpoint.PreCopyRound `json:"pre_copy"`
		Parent  string                    `json:"parent"`
		Phases  []checkpoint.Step         `json:"phases"`
	}
	if err := json.Unmarshal([]byte(out[strings.LastIndex(out, "\n{")+1:]), &d); err != nil {
		t.Fatalf("checkpoint --json: %v\n%s", err, out)
	}
	if len(d.PreCopy) == 0 || d.PreCopy[0].CopiedBytes < 16<<20 || d.PreCopy[0].CopiedBytes != d.PreCopy[0].Bytes {
		t.Fatalf("pre-copy rounds: %+v; want a first round that copies all the GPU memory", d.PreCopy)
	}
	for _, r := range d.PreCopy[1:] {
		if r.CopiedBytes > d.PreCopy[0].CopiedBytes {
			t.Errorf("round %d copied more than the first: %+v", r.Round, d.PreCopy)
		}
	}
	if !slices.Contains(stepNames(d.Phases), "pre-copy") {
		t.Errorf("no pre-copy step: %v", stepNames(d.Phases))
	}
	// The rounds are folded into the image once it is committed.
	if _, err := os.Stat(filepath.Join(img, "gpucr-pre-copy")); err == nil {
		t.Errorf("the pre-copy rounds stay in %s", img)
	}
	if insp := inspect(t, h, env, img); insp.Totals.Chunks.Parent == 0 && a.lastIter() > 0 {
		t.Logf("the final image has no chunk of the rounds: %+v (a step changed every buffer after the last round)", insp.Totals.Chunks)
	}
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+2, time.Minute)
	a.kill()
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, maxIter(hbs)))
	checkContinuous(t, hbs, before)
}

// TestConcurrentCheckpointTree: a tree with two GPU processes (heartbeat and
// ptrchase under one shell) checkpointed concurrently into one image, the
// first process's background copy held back 5 s (the second's queues
// behind it): both run on meanwhile, the image holds both, and the tree
// restored from it continues exactly from the stop.
func TestConcurrentCheckpointTree(t *testing.T) {
	rig := newCriuRig(t, "GPUCR_FAULT=stall-background@1")
	dir, env, h := rig.dir, rig.env, rig.h
	root, hb, pc := startTree(t, dir, h, env, "--interval-ms 20 --hb-every 1")
	img := filepath.Join(dir, "tree")
	befores := map[*app]int{hb: hb.lastIter(), pc: pc.lastIter()}
	out := cliOK(t, h, env, img, "checkpoint", strconv.Itoa(root.Process.Pid), "-D", img, "--leave-running", "--concurrent", "--json")
	d := parseDump(t, out)
	if len(d.GPUProcesses) != 2 || d.StallSeconds <= 0 || d.StallSeconds > d.Seconds-4 {
		t.Errorf("two GPU processes, stopped well before the end of a checkpoint whose copy waited 5 s: %+v", d)
	}
	afters := map[*app]int{hb: hb.lastIter(), pc: pc.lastIter()}
	for _, a := range []*app{hb, pc} {
		if afters[a]-befores[a] < 20 {
			t.Errorf("%s took %d steps during the checkpoint: it did not run on", a.name, afters[a]-befores[a])
		}
	}
	insp := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "inspect", img)
	for _, a := range []*app{hb, pc} {
		if !strings.Contains(insp, "process "+strconv.Itoa(a.pid)) {
			t.Fatalf("the GPU image lacks process %d (%s):\n%s", a.pid, a.name, insp)
		}
	}
	for _, p := range []int{hb.pid, pc.pid, root.Process.Pid} {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	_, _ = root.Process.Wait()
	for _, p := range []int{hb.pid, pc.pid, root.Process.Pid} {
		waitPidFree(p, 10*time.Second)
	}
	marks := map[*app]int{hb: len(hb.heartbeats()), pc: len(pc.heartbeats())}
	cliOK(t, h, env, img, "restore", "-D", img)
	for _, a := range []*app{hb, pc} {
		a.waitFor(time.Minute, "heartbeats after the restore", func(_ string, hbs []heartbeat) bool {
			return len(hbs) > marks[a] && hbs[len(hbs)-1].Iter >= afters[a]+3
		})
		if first := a.heartbeats()[marks[a]].Iter; first > befores[a]+(afters[a]-befores[a])/4 {
			t.Errorf("%s restored at iteration %d; the checkpoint began at %d", a.name, first, befores[a])
		}
		_ = syscall.Kill(a.pid, syscall.SIGKILL)
		hbs := a.heartbeats()
		compareWithReference(t, hbs, reference(t, env, a.name, []string{"--mib", "8", "--hb-every", "1"}, maxIter(hbs)))
	}
}
