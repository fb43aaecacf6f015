package e2e

// Copy-on-write windows (gpucr helper --concurrent-mode): a concurrent
// checkpoint that keeps the buffers where they are, hashed at the stop,
// and saves them while the process runs on; a call about to write a chunk
// not saved yet waits until the helper has saved it. A write the
// interposer cannot see (ptrchase) must be caught by the hash check, never
// end up in an image.

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// savedFirst is what the helper's log says the last window saved ahead of
// the background (SaveFirst), or -1.
func savedFirst(log string) int {
	m := regexp.MustCompile(`copy-on-write window saved.*"saved_first":\s*(\d+)`).FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// TestCopyOnWriteCheckpointExact: with no snapshot memory at all, each test
// application (two streams with events between them; VMM allocations) runs
// on while its window is open and its background copy is held back 5 s: its
// writes wait only for the chunks they touch, which the helper saves first.
// The image is the process at the stop: restored, it continues exactly.
//
// heartbeat also runs with --graph: a CUDA graph replayed every iteration
// rewrites every buffer, and a graph launch in a window counts as writing
// everything.
func TestCopyOnWriteCheckpointExact(t *testing.T) {
	needTool(t, "criu")
	cases := []appCase{graphCase}
	for _, tc := range appCases {
		if tc.name != "ptrchase" { // see TestCopyOnWriteCatchesHiddenWrites
			cases = append(cases, tc)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			concurrentExact(t, tc, []string{"--concurrent-mode", "copy-on-write"}, func(d dumpJSON, _ string, h *helperProc) {
				names := stepNames(d.GPUProcesses[0].Phases)
				if slices.Contains(names, "snapshot") || !slices.Contains(names, "gpu-hash") {
					t.Errorf("the helper's steps: %v, want the window's gpu-hash and no snapshot", names)
				}
				if d.Redone != "" {
					t.Errorf("redone: %s", d.Redone)
				}
				// The process writes every buffer each step, and its steps
				// go on while the background copy waits.
				if n := savedFirst(h.logText()); n <= 0 {
					t.Errorf("the window saved %d chunks ahead of the background, want some:\n%s", n, tail(h.logText(), 20))
				}
			})
		})
	}
}

// TestCopyOnWriteCatchesHiddenWrites: ptrchase's kernels write data buffers
// through pointers they load from a table; no launch parameter names them,
// so the window lets those writes through. The hash check of each saved
// chunk catches them: the concurrent checkpoint makes no image and is taken
// again with the process stopped (the result says why), and that image is
// exact. Both for a CRIU dump and for a GPU-only checkpoint.
func TestCopyOnWriteCatchesHiddenWrites(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=stall-background"),
		"--concurrent-mode", "copy-on-write")
	// 16 MiB the kernels never write beside the 8 they write behind the
	// window's back: the checkpoint taken again copies only the latter.
	const still = 16 << 20
	args := []string{"--mib", "8", "--still-mib", "16", "--hb-every", "1"}
	a := startUnder(t, dir, h, env, "ptrchase", append(slices.Clone(args), "--interval-ms", "20")...)
	a.waitIter(5, time.Minute)

	gpuImg := filepath.Join(dir, "gpu")
	out := cliOK(t, h, env, gpuImg, "checkpoint", strconv.Itoa(a.pid), "-D", gpuImg, "--gpu-only", "--leave-running", "--json")
	if !strings.Contains(out, `"redone"`) || !strings.Contains(out, "changed") {
		t.Errorf("the GPU-only checkpoint does not say it was redone:\n%s", out)
	}
	var gr struct {
		Bytes      uint64 `json:"bytes,string"` // protojson: 64-bit numbers are strings
		BytesMoved uint64 `json:"bytes_moved,string"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &gr); err != nil {
		t.Fatalf("checkpoint --gpu-only --json: %v\n%s", err, out)
	}
	if gr.Bytes < still || gr.BytesMoved >= still {
		t.Errorf("the GPU-only checkpoint taken again moved %d of %d bytes; the %d bytes never written were saved by the window and must not be copied again\n%s",
			gr.BytesMoved, gr.Bytes, still, out)
	}

	img := filepath.Join(dir, "img")
	before := a.lastIter()
	out = cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", "--concurrent", "--json")
	after := a.lastIter()
	d := parseDump(t, out)
	if !strings.Contains(d.Redone, "changed behind") {
		t.Fatalf("the concurrent checkpoint of ptrchase was not redone (redone %q):\n%s\n%s", d.Redone, out, tail(h.logText(), 30))
	}
	if !strings.Contains(h.logText(), "changed while it was saved") {
		t.Errorf("the helper's log does not name the changed chunk:\n%s", tail(h.logText(), 30))
	}
	if d.GPU == nil || d.GPU.TotalBytes < still || d.GPU.BytesMoved >= still {
		t.Errorf("the dump taken again copied %+v; the %d bytes never written were saved by the window and must not be copied again", d.GPU, still)
	}
	// The redo's image: the process at the redo's stop, exact.
	first := restoredFrom(t, a, h, env, img, after+3)
	if first < before || first > after+1 {
		t.Errorf("the restored process starts at iteration %d; the checkpoint ran from %d to %d", first, before, after)
	}
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "ptrchase", args, maxIter(hbs)))
}

// TestCopyOnWriteNarrowsWriteSets: heartbeat's kernels come as PTX, which
// the helper analyses when the process loads them: app_hb_mix writes
// through its first parameter and only reads its second. With --still-mib,
// every step runs it over 16 MiB that nothing writes, and the window does
// not save that memory ahead of those launches: it stays pending, for the
// background, while the process runs on. The image is exact all the same:
// not redone, and restored it continues as an uninterrupted run.
func TestCopyOnWriteNarrowsWriteSets(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=stall-background"),
		"--concurrent-mode", "copy-on-write")
	const still = 16 << 20
	args := []string{"--mib", "8", "--buffers", "4", "--still-mib", "16", "--hb-every", "1"}
	a := startUnder(t, dir, h, env, "heartbeat", append(slices.Clone(args), "--interval-ms", "20")...)
	a.waitIter(5, time.Minute)

	img := filepath.Join(dir, "img")
	before := a.lastIter()
	cmd, out := startStalledCheckpoint(t, h, env, strconv.Itoa(a.pid), "-D", img, "--leave-running", "--concurrent", "--json")
	a.waitIter(a.lastIter()+5, 10*time.Second) // steps in the window, each reading the still memory
	st := cliOK(t, h, env, img, "status", "--json")
	m := regexp.MustCompile(`"window_pending_bytes":(\d+)`).FindStringSubmatch(st)
	if m == nil {
		t.Fatalf("status shows no window while the background copy waits:\n%s", st)
	}
	if pending, _ := strconv.ParseUint(m[1], 10, 64); pending < still {
		t.Errorf("the window has %d bytes left to save while the process runs on; the %d bytes its kernels only read "+
			"must not be saved ahead of them (the module's analysis narrows the launches' write sets)\n%s", pending, still, st)
	}
	if err := waitCmd(cmd, 2*time.Minute); err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, out.String())
	}
	after := a.lastIter()
	if d := parseDump(t, out.String()); d.Redone != "" {
		t.Errorf("redone: %s", d.Redone)
	}
	first := restoredFrom(t, a, h, env, img, after+3)
	if first < before || first > after {
		t.Errorf("the restored process starts at iteration %d; the checkpoint ran from %d to %d", first, before, after)
	}
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, maxIter(hbs)))
}
