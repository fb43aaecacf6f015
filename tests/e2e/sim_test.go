package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testroot"
)

// TestDriverConformance runs drvtest, the driver-API conformance suite that
// also runs unchanged against the real driver on the GPU machine, on the
// simulated driver; each of its cases is reported as a subtest.
func TestDriverConformance(t *testing.T) {
	out, err := runErr(5*time.Minute, simEnv(t), binPath(t, "drvtest"))
	cases := checkerCases(t, out)
	if err != nil {
		t.Errorf("drvtest: %v\n%s", err, tail(out, 40))
	}
	if cases < 20 {
		t.Errorf("drvtest reported only %d cases:\n%s", cases, tail(out, 40))
	}
	// with one device the peer case skips itself; the GPU machine's two
	// cards run it, and two simulated ones here
	for _, c := range []string{"share_peer_access", "ckpt_restore_gpu_pairs"} {
		out, err = runErr(time.Minute, simEnv(t, "GPUCR_SIM_DEVICES=2"), binPath(t, "drvtest"), c)
		if err != nil || !strings.Contains(out, "ok "+c+"\n") {
			t.Errorf("drvtest %s on two devices: %v\n%s", c, err, tail(out, 20))
		}
	}
}

// TestAppsDeterministic checks what the checkpoint tests rely on: an
// application's checksums depend on the iteration only, not on timing, and
// they change from one heartbeat to the next (a frozen app would not pass).
func TestAppsDeterministic(t *testing.T) {
	for _, tc := range appCases {
		t.Run(tc.name, func(t *testing.T) {
			env := simEnv(t)
			fast := reference(t, env, tc.name, tc.args, 40)
			slow := run(t, 2*time.Minute, env, binPath(t, tc.name),
				append(append([]string{}, tc.args...), "--iters", "40", "--interval-ms", "3")...)
			_, hbs := parseHeartbeats(slow)
			if len(hbs) < 4 {
				t.Fatalf("too few heartbeats:\n%s", tail(slow, 20))
			}
			compareWithReference(t, hbs, fast)
			seen := map[string]int{}
			for _, h := range hbs {
				if prev, dup := seen[h.Checksum]; dup {
					t.Errorf("iterations %d and %d have the same checksum %s", prev, h.Iter, h.Checksum)
				}
				seen[h.Checksum] = h.Iter
			}
		})
	}
}

// TestChecksumsMatchGPU runs every case of tests/gpu/expected-checksums.txt on
// the simulated driver. Those checksums were also produced by the same
// applications on an H100 (tests/gpu/run-apps.sh), so this keeps the
// simulator computing what the GPU computes, to the bit.
func TestChecksumsMatchGPU(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testroot.Dir(t), "tests", "gpu", "expected-checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	env := simEnv(t)
	cases := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || strings.HasPrefix(f[0], "#") {
			continue
		}
		cases++
		name, iters, want, args := f[0], f[1], f[2], f[3:]
		t.Run(strings.Join(f[:2], "/")+"/"+strings.Join(args, ""), func(t *testing.T) {
			out := run(t, 2*time.Minute, env, binPath(t, name),
				append(append([]string{}, args...), "--iters", iters, "--interval-ms", "0")...)
			var got string
			for _, l := range strings.Split(out, "\n") {
				if g := strings.Fields(l); len(g) == 3 && g[0] == "done" && g[1] == iters {
					got = g[2]
				}
			}
			if got != want {
				t.Fatalf("%s %s --iters %s: checksum %q, GPU and stored %s\n%s", name, strings.Join(args, " "), iters, got, want, tail(out, 5))
			}
		})
	}
	if cases == 0 {
		t.Fatal("no cases in expected-checksums.txt")
	}
}
