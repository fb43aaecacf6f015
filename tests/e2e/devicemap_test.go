package e2e

import (
	"encoding/json"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gpuOfLastHeartbeat is the GPU (gpu=UUID bus=BUS, --show-device) that the
// application's last heartbeat names, as "UUID BUS".
func gpuOfLastHeartbeat(a *app) string {
	m := regexp.MustCompile(`(?m)^hb \d+ \S+ \S+ gpu=(\S+) bus=(\S+)$`).FindAllStringSubmatch(a.output(), -1)
	if len(m) == 0 {
		return ""
	}
	return m[len(m)-1][1] + " " + m[len(m)-1][2]
}

// heldOn is the device memory the helper holds on each of its GPUs, by UUID.
func heldOn(t *testing.T, h *helperProc) map[string]int64 {
	t.Helper()
	st := h.status()
	out := map[string]int64{}
	for _, d := range st.Devices {
		free, err1 := d.FreeMemory.Int64()
		total, err2 := d.TotalMemory.Int64()
		if err1 != nil || err2 != nil {
			t.Fatalf("status: device %s memory %q of %q", d.UUID, d.FreeMemory, d.TotalMemory)
		}
		out[d.UUID] = total - free
	}
	return out
}

// TestRestoreOntoAnotherGPU: a process checkpointed on one GPU (of two
// simulated ones) restores onto the other, as --device-map asks, and then,
// checkpointed there, back onto the first because the GPU it was on has
// no room left for it. Each time it continues exactly from its stop, the
// GPU behind its ordinal is the new one (as the application itself asks the
// driver), and the helper holds its memory on that GPU alone.
func TestRestoreOntoAnotherGPU(t *testing.T) {
	// 64 MiB GPUs: a 40 MiB process on the second leaves no room there for
	// the 32 MiB one.
	r := newCriuRig(t, "GPUCR_SIM_DEVICES=2", "GPUCR_SIM_MEM_MIB=64")
	env := append(append([]string{}, r.env...), "GPUCR_SIM_DEVICES=2", "GPUCR_SIM_MEM_MIB=64")
	args := []string{"--mib", "32", "--interval-ms", "20", "--hb-every", "1"}
	base := heldOn(t, r.h) // the helper's own
	a := startUnder(t, r.dir, r.h, env, "heartbeat", append(args, "--show-device")...)
	a.waitIter(10, time.Minute)
	st := r.h.status()
	if len(st.Devices) != 2 {
		t.Fatalf("the helper sees %d GPUs, want 2", len(st.Devices))
	}
	// What the application asks of its device follows the move: the UUID
	// (the driver's own answer) and the PCI bus id (the driver still says
	// the old GPU's, as NVIDIA's does; the interposer answers the new one's).
	gpu0, gpu1 := st.Devices[0].UUID+" 0000:18:00.0", st.Devices[1].UUID+" 0000:19:00.0"
	if g := gpuOfLastHeartbeat(a); g != gpu0 {
		t.Fatalf("heartbeat runs on %q, want the first GPU %s", g, gpu0)
	}

	// Onto the second GPU, by ordinal.
	img := r.img
	cliOK(t, r.h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	// The image records the GPUs the process saw: the driver's restore
	// wants every one of them paired.
	var insp struct {
		Processes []struct {
			Pid  int      `json:"pid"`
			GPUs []string `json:"gpus"`
		} `json:"processes"`
	}
	out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "inspect", img, "--json")
	if err := json.Unmarshal([]byte(out), &insp); err != nil || len(insp.Processes) != 1 ||
		!slices.Equal(insp.Processes[0].GPUs, []string{st.Devices[0].UUID, st.Devices[1].UUID}) {
		t.Errorf("the image's process and the GPUs it saw: %+v (%v), want both GPUs\n%s", insp.Processes, err, out)
	}
	before := a.lastIter()
	if out, err := cli(t, r.h, env, "restore", "-D", img, "--device-map", "0=9"); err == nil ||
		!strings.Contains(out, `this machine has no GPU "9"`) {
		t.Errorf("restore onto a GPU that is not there: %v, want a refusal naming it:\n%s", err, out)
	}
	cliOK(t, r.h, env, img, "restore", "-D", img, "--device-map", "0=1")
	a.waitIter(before+10, time.Minute)
	if g := gpuOfLastHeartbeat(a); g != gpu1 {
		t.Errorf("after --device-map 0=1 heartbeat runs on %q, want the second GPU %s", g, gpu1)
	}
	u0, u1 := st.Devices[0].UUID, st.Devices[1].UUID
	if held := heldOn(t, r.h); held[u0] > base[u0]+4<<20 || held[u1] < base[u1]+32<<20 {
		t.Errorf("after --device-map 0=1 the helper holds %v (%v of its own, its scratch for hashing besides); want the process's 32 MiB on %s alone",
			held, base, u1)
	}

	// Checkpointed on the second GPU, which then fills up: the restore goes
	// back onto the first.
	img2 := r.dir + "/img2"
	cliOK(t, r.h, env, img2, "checkpoint", strconv.Itoa(a.pid), "-D", img2)
	waitDead(t, a.pid, 30*time.Second)
	waitPidFree(a.pid, 10*time.Second)
	filler := startUnder(t, t.TempDir(), r.h, env, "heartbeat", "--mib", "40", "--device", "1", "--interval-ms", "50")
	filler.waitIter(10, time.Minute)
	before = a.lastIter()
	out = cliOK(t, r.h, env, img2, "restore", "-D", img2)
	a.waitFor(time.Minute, "heartbeats after the second restore", func(_ string, hbs []heartbeat) bool {
		return len(hbs) > 0 && hbs[len(hbs)-1].Iter >= before+10
	})
	if g := gpuOfLastHeartbeat(a); g != gpu0 {
		t.Errorf("restored while its GPU is full, heartbeat runs on %q, want the first GPU %s:\n%s", g, gpu0, out)
	}
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	filler.kill()
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, maxIter(a.heartbeats())))
	if t.Failed() {
		t.Logf("heartbeat:\n%s", tail(a.output(), 40))
		t.Logf("helper:\n%s", tail(r.h.logText(), 60))
	}
}
