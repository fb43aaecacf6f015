// Package intercept_test runs the interposer's C unit tests
// (build/bin/intercept-unit, built by make) and checks that an application
// under LD_PRELOAD=libgpucr.so without a helper computes what it computes
// without the interposer, with one warning.
package intercept_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testroot"
)

// need returns the path of a build output, skipping the test when it is missing
// outside CI (in CI, make has built it, so a missing file is a failure).
func need(t *testing.T, rel string) string {
	t.Helper()
	p := filepath.Join(testroot.Dir(t), rel)
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s missing: run make (CI requires it)", rel)
		}
		t.Skipf("%s missing: run make", rel)
	}
	return p
}

func TestUnit(t *testing.T) {
	bin := need(t, "build/bin/intercept-unit")
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	t.Logf("%s", out)
}

var doneRE = regexp.MustCompile(`(?m)^done \d+ [0-9a-f]+$`)

func TestNoHelperPassThrough(t *testing.T) {
	lib := need(t, "build/lib/libgpucr.so")
	sim := need(t, "build/sim/libcuda.so.1")
	for _, app := range [][]string{
		{"heartbeat", "--mib", "4", "--iters", "5"},
		{"ptrchase", "--iters", "5"},
		{"vmmapp", "--iters", "5"},
	} {
		bin := need(t, filepath.Join("build/bin", app[0]))
		run := func(preload bool) (string, string) {
			cmd := exec.Command(bin, app[1:]...)
			env := append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Dir(sim), "GPUCR_LIBCUDA="+sim,
				"GPUCR_SOCKET="+filepath.Join(t.TempDir(), "no-helper.sock"))
			if preload {
				env = append(env, "LD_PRELOAD="+lib)
			}
			cmd.Env = env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v (preload %v): %v\n%s", app, preload, err, stderr.String())
			}
			return doneRE.FindString(string(out)), stderr.String()
		}
		want, _ := run(false)
		got, stderr := run(true)
		if want == "" || got != want {
			t.Errorf("%v: %q with the interposer, %q without", app, got, want)
		}
		if n := strings.Count(stderr, "gpucr: "); n != 1 {
			t.Errorf("%v: %d gpucr warning lines, want 1:\n%s", app, n, stderr)
		}
	}
}

// The module images an application loads are written out with
// GPUCR_RECORD_MODULES, byte for byte (heartbeat loads its PTX text, NUL
// included), named by their hash; without it nothing is written, and no
// debug line names an image (the interposer reads no image unless asked).
func TestRecordModules(t *testing.T) {
	lib := need(t, "build/lib/libgpucr.so")
	sim := need(t, "build/sim/libcuda.so.1")
	bin := need(t, "build/bin/heartbeat")
	run := func(extra ...string) string {
		cmd := exec.Command(bin, "--mib", "4", "--iters", "2")
		cmd.Env = append(os.Environ(), append([]string{"LD_LIBRARY_PATH=" + filepath.Dir(sim), "GPUCR_LIBCUDA=" + sim,
			"GPUCR_SOCKET=" + filepath.Join(t.TempDir(), "no-helper.sock"), "LD_PRELOAD=" + lib}, extra...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("heartbeat %v: %v\n%s", extra, err, out)
		}
		return string(out)
	}
	dir := t.TempDir()
	run("GPUCR_RECORD_MODULES=" + dir)
	files, _ := filepath.Glob(filepath.Join(dir, "module-*.bin"))
	if len(files) != 1 {
		t.Fatalf("recorded %v, want one module image", files)
	}
	img, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(img), ".version") || img[len(img)-1] != 0 || strings.Count(string(img), "\x00") != 1 {
		t.Errorf("recorded image is not heartbeat's PTX text with its NUL: %d bytes, starts %q", len(img), img[:min(len(img), 20)])
	}
	if out := run("GPUCR_LOG=debug"); !strings.Contains(out, "module image: "+strconv.Itoa(len(img))+" bytes") {
		t.Errorf("GPUCR_LOG=debug names no module image of %d bytes:\n%s", len(img), out)
	}
	if out := run("GPUCR_LOG=info"); strings.Contains(out, "module image") {
		t.Errorf("a module image was noted without being asked for:\n%s", out)
	}
}
