package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readCounts reads gaterace's per-thread counters of calls that returned.
func readCounts(t *testing.T, path string, n int) []uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 8*n {
		t.Fatalf("gaterace counters %s: %d bytes, %v", path, len(b), err)
	}
	c := make([]uint64, n)
	for i := range c {
		c[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return c
}

// TestGateHoldsEveryThread: a quiesce requested while 8 threads launch, set
// and copy memory and record events without a pause, many times over: once
// the quiesce has answered, no thread's gated call returns until the resume
// (at most the one it had finished just before counts itself after), the
// threads go on after each resume, and at the end every launch, memset and
// copy took effect exactly once.
func TestGateHoldsEveryThread(t *testing.T) {
	const threads, cycles = 8, 40
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	counts := filepath.Join(dir, "counts")
	a := startUnder(t, dir, h, env, "gaterace", "--counts", counts, "--threads", "8", "--seconds", "600")
	rng := rand.New(rand.NewSource(1))
	var moved uint64
	prev := readCounts(t, counts, threads)
	for c := 0; c < cycles; c++ {
		time.Sleep(time.Duration(5+rng.Intn(30)) * time.Millisecond)
		h.op(a.pid, "quiesce")
		held := readCounts(t, counts, threads)
		time.Sleep(time.Duration(20+rng.Intn(30)) * time.Millisecond)
		after := readCounts(t, counts, threads)
		for i := range held {
			if after[i] > held[i]+1 {
				t.Fatalf("cycle %d: thread %d returned from %d gated calls while the process was quiesced", c, i, after[i]-held[i])
			}
			moved += held[i] - prev[i]
		}
		h.op(a.pid, "resume")
		prev = after
	}
	if moved == 0 {
		t.Fatal("the threads made no calls between the quiesces")
	}
	if err := a.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(time.Minute); code != 0 || !strings.Contains(a.output(), "errors=0") {
		t.Fatalf("gaterace: exit %d:\n%s", code, tail(a.output(), 10))
	}
	t.Logf("%d calls returned between %d quiesces", moved, cycles)
}

// TestAllocPoolUnderStorm: with allocations made ahead of time (`gpucr helper
// --alloc-pool`), threads that allocate, fill, check and free buffers of every
// size class get correct memory, some of it from the pool.
func TestAllocPoolUnderStorm(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t, "GPUCR_SIM_MEM_MIB=2048")
	h := startHelperWith(t, dir, env, "--alloc-pool", "64M")
	a := startUnder(t, dir, h, env, "stormapp", "--threads", "3", "--rounds", "400", "--live", "8", "--max-kib", "8192")
	if code := a.wait(3 * time.Minute); code != 0 || !strings.Contains(a.output(), "errors=0") {
		t.Fatalf("stormapp: exit %d:\n%s", code, tail(a.output(), 10))
	}
	if !strings.Contains(h.logText(), `"pooled":true`) {
		t.Errorf("no allocation came from the pool:\n%s", tail(h.logText(), 20))
	}
	waitNoClients(t, h, 10*time.Second)
}

// TestOneRoundTripPerAllocation: a helper allocation costs the interposer
// one request to the helper (Alloc tells it the address the range was
// reserved at), not two (Alloc, then Mapped), and checkpoints still find
// the memory where the application has it.
func TestOneRoundTripPerAllocation(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "64", "--buffers", "4", "--interval-ms", "5", "--hb-every", "5", "--iters", "300")
	a.waitIter(20, time.Minute)
	var raw map[string]any
	if err := json.Unmarshal([]byte(h.op(a.pid, "stats")), &raw); err != nil {
		t.Fatal(err)
	}
	calls, _ := strconv.ParseInt(fmt.Sprint(raw["helper_calls"]), 10, 64)
	allocs, _, ok := h.client(a.pid)
	if !ok || allocs < 4 || calls != allocs {
		t.Fatalf("%d requests to the helper for %d helper allocations (client found: %v); want one each", calls, allocs, ok)
	}
	// Its one PTX module was analysed once, at its load (for copy-on-write
	// windows), in a request of its own.
	if n, _ := strconv.ParseInt(fmt.Sprint(raw["modules_analysed"]), 10, 64); n != 1 {
		t.Errorf("%d module analyses for heartbeat's one PTX module, want 1", n)
	}
	// a quiesce/drop/reimport cycle finds every buffer at its address
	for _, op := range []string{"quiesce", "drain", "drop", "reimport", "resume"} {
		h.op(a.pid, op)
	}
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("heartbeat: exit %d:\n%s", code, tail(a.output(), 10))
	}
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", []string{"--mib", "64", "--buffers", "4", "--hb-every", "5"}, 300))
}
