package e2e

// Served mode's runtime library (intercept/runtime): programs on the CUDA
// runtime API, as nvcc compiles them, under `gpucr run --served`. rtbeat
// (tests/apps/runtime/rtbeat.c) does heartbeat's work on the runtime, so its
// checksums are heartbeat's.

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rtbeatCases: plain buffers on two streams, and the same with a CUDA graph
// captured through the runtime and replayed every iteration.
var rtbeatCases = []appCase{
	{"rtbeat", []string{"--mib", "16", "--buffers", "5", "--hb-every", "5"}},
	{"rtbeat", []string{"--graph", "--mib", "8", "--buffers", "3", "--hb-every", "5"}},
}

// beatsLine is rtbeat's count of its iterations, kept in a __device__ variable.
var beatsLine = regexp.MustCompile(`(?m)^rtbeat: beats=(\d+)$`)

// lastBeats is the last count rtbeat printed, -1 if none.
func lastBeats(out string) int {
	m := beatsLine.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// TestServedRuntimeChecksums: rtbeat on served mode's runtime computes what
// heartbeat computes on the driver, with the runtime on the driver itself
// and under `gpucr run --served`, where its process maps neither NVIDIA's
// runtime nor a driver: the runtime is served mode's, over the served
// library.
func TestServedRuntimeChecksums(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "2")
	waitIdle(t, h, 2)
	for i, c := range rtbeatCases {
		t.Run(fmt.Sprintf("%s-%d", c.name, i), func(t *testing.T) {
			args := append(append([]string{}, c.args...), "--iters", "40", "--interval-ms", "0")
			want := doneLine.FindStringSubmatch(run(t, time.Minute, env, binPath(t, "heartbeat"), args...))
			if want == nil {
				t.Fatal("heartbeat printed no done line")
			}
			plain := run(t, time.Minute, env, binPath(t, c.name), args...)
			if got := doneLine.FindStringSubmatch(plain); got == nil || got[2] != want[2] {
				t.Fatalf("rtbeat on the runtime over the driver: %v, heartbeat: %s\n%s", got, want[0], tail(plain, 10))
			}
			if n := lastBeats(plain); n != 40 {
				t.Errorf("rtbeat's __device__ count is %d after 40 iterations", n)
			}
			a := startServed(t, t.TempDir(), h, env, c.name, nil,
				append(append([]string{}, c.args...), "--iters", "40", "--interval-ms", "20")...)
			maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", a.pid))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(maps), "/served/libcudart.so.13") || !strings.Contains(string(maps), "/served/libcuda.so.1") ||
				strings.Contains(string(maps), "/sim/libcuda.so.1") {
				t.Errorf("the served process does not map served mode's runtime and library alone:\n%s", maps)
			}
			// Every worker lays its address space out alike, so a process moved to the next one keeps its
			// device addresses free there.
			w := workerOf(t, h, a.pid)
			if p, err := os.ReadFile(fmt.Sprintf("/proc/%d/personality", w)); err != nil || !strings.HasSuffix(strings.TrimSpace(string(p)), "40000") {
				t.Errorf("worker %d's personality %q (%v): want ADDR_NO_RANDOMIZE (0040000)", w, p, err)
			}

			if code := a.wait(time.Minute); code != 0 {
				t.Fatalf("exit %d under gpucr run --served:\n%s", code, tail(a.output(), 20))
			}
			if got := doneLine.FindStringSubmatch(a.output()); got == nil || got[2] != want[2] {
				t.Fatalf("served: %v, heartbeat on the driver: %s\n%s", got, want[0], tail(a.output(), 10))
			}
			if n := lastBeats(a.output()); n != 40 {
				t.Errorf("served: rtbeat's __device__ count is %d after 40 iterations", n)
			}
			if strings.Contains(a.output(), "gpucr: ") || strings.Contains(a.output(), "gpucr runtime: ") {
				t.Errorf("warnings in served mode:\n%s", a.output())
			}
		})
	}
}

// TestServedRuntimeCheckpointRestore: rtbeat served, checkpointed leaving it
// running and then stopped and restored, continues exactly (heartbeat's
// checksums), each time in a new worker, and its __device__ variable (which
// the new worker's load of its libraries would start at zero) keeps
// counting.
func TestServedRuntimeCheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	env := gpucrEnv(t)
	dir := t.TempDir()
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	args := []string{"--graph", "--mib", "8", "--buffers", "3", "--interval-ms", "20", "--hb-every", "1"}
	a := startServed(t, dir, h, env, "rtbeat", nil, args...)
	a.waitIter(10, time.Minute)

	img := dir + "/img"
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running")
	before := a.lastIter()
	a.waitIter(before+10, time.Minute)

	img2 := dir + "/img2"
	cliOK(t, h, env, img2, "checkpoint", strconv.Itoa(a.pid), "-D", img2)
	workerOfGone(t, h, a.pid)
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	before = a.lastIter()
	cliOK(t, h, env, img2, "restore", "-D", img2)
	a.waitIter(before+10, time.Minute)
	a.kill()
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, maxIter(hbs)))
	if n, last := lastBeats(a.output()), maxIter(hbs); n != last {
		t.Errorf("rtbeat's __device__ count is %d at iteration %d: a move to another worker lost it", n, last)
	}
	if strings.Contains(a.output(), "gpucr runtime: ") {
		t.Errorf("the runtime complained:\n%s", a.output())
	}
	if t.Failed() {
		t.Logf("rtbeat:\n%s", tail(a.output(), 30))
		t.Logf("helper:\n%s", tail(h.logText(), 40))
	}
}
