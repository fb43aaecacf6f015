package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestBlasConformance runs blastest, the conformance suite of the simulated
// cuBLAS and cuBLASLt (tests/sim/blas), on the simulated driver: every
// product bit for bit against its host reference, and the documented argument
// errors. Each of its cases is reported as a subtest.
func TestBlasConformance(t *testing.T) {
	out, err := runErr(5*time.Minute, simEnv(t), binPath(t, "blastest"))
	cases := checkerCases(t, out)
	if err != nil {
		t.Errorf("blastest: %v\n%s", err, tail(out, 40))
	}
	if cases < 20 {
		t.Errorf("blastest reported only %d cases:\n%s", cases, tail(out, 40))
	}
}

// TestBlasbeat: blasbeat's checksums depend on the iteration only (two runs,
// and its variants, agree), change from one heartbeat to the next, and are
// the same under `gpucr run`, where the libraries' module and launches go
// through the interposer.
func TestBlasbeat(t *testing.T) {
	env := gpucrEnv(t)
	args := []string{"--iters", "30", "--interval-ms", "0", "--hb-every", "5"}
	first := run(t, time.Minute, env, binPath(t, "blasbeat"), args...)
	_, hbs := parseHeartbeats(first)
	if len(hbs) != 6 {
		t.Fatalf("want 6 heartbeats:\n%s", tail(first, 10))
	}
	seen := map[string]int{}
	for _, h := range hbs {
		if prev, dup := seen[h.Checksum]; dup {
			t.Errorf("iterations %d and %d have the same checksum %s", prev, h.Iter, h.Checksum)
		}
		seen[h.Checksum] = h.Iter
	}
	want := doneLine.FindString(first)
	if want == "" {
		t.Fatalf("no done line:\n%s", tail(first, 10))
	}
	for _, extra := range [][]string{nil, {"--device-scalars"}, {"--lt-per-call"}, {"--device-scalars", "--lt-per-call"}} {
		out := run(t, time.Minute, env, binPath(t, "blasbeat"), append(append([]string{}, extra...), args...)...)
		if got := doneLine.FindString(out); got != want {
			t.Errorf("blasbeat %s: %q, a plain run %q", strings.Join(extra, " "), got, want)
		}
	}
	h := startHelper(t, t.TempDir(), env)
	a := startUnder(t, t.TempDir(), h, env, "blasbeat", append([]string{"--lt-per-call"}, args...)...)
	if code := a.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d under gpucr run:\n%s", code, tail(a.output(), 20))
	}
	if got := doneLine.FindString(a.output()); got != want {
		t.Errorf("under gpucr run: %q, without: %q\n%s", got, want, tail(a.output(), 10))
	}
	if strings.Contains(a.output(), "gpucr: ") {
		t.Errorf("warnings with a helper present:\n%s", a.output())
	}
}
