package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = Run(append([]string{"gpucr"}, args...), &o, &e)
	return code, o.String(), e.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "version")
	if code != ExitOK || !strings.Contains(out, Version) {
		t.Fatalf("version: code %d, output %q", code, out)
	}
	code, out, _ = runCLI(t, "version", "--json")
	var v map[string]string
	if code != ExitOK || json.Unmarshal([]byte(out), &v) != nil || v["version"] != Version {
		t.Fatalf("version --json: code %d, output %q", code, out)
	}
}

func TestUsageErrorExitCode(t *testing.T) {
	code, _, errOut := runCLI(t, "version", "--no-such-flag")
	if code != ExitUsage {
		t.Fatalf("bad flag: exit code %d, want %d (stderr %q)", code, ExitUsage, errOut)
	}
}

// With no criu on PATH and no driver, check must fail and say what is missing.
func TestCheckReportsWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("LD_LIBRARY_PATH", t.TempDir())
	r := runCheck(zap.NewNop())
	if r.OK || r.CRIUError == "" {
		t.Fatalf("check passed without criu: %+v", r)
	}
	if !strings.Contains(r.CRIUError, "install-criu.sh") {
		t.Errorf("criu error does not say how to fix it: %q", r.CRIUError)
	}
}

func TestFindDriverRecognisesSimulation(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(lib, []byte("\x7fELF...gpucr simulated GPU..."), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LD_LIBRARY_PATH", dir)
	p, sim, err := findDriver()
	if err != nil || p != lib || !sim {
		t.Fatalf("findDriver = %q, %v, %v; want %q, true", p, sim, err, lib)
	}
	if err := os.WriteFile(lib, []byte("\x7fELF...NVIDIA..."), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, sim, _ := findDriver(); sim {
		t.Fatal("a library without the marker was taken for the simulated driver")
	}
}

func TestFormatCRIUVersion(t *testing.T) {
	if got := formatCRIUVersion(40101); got != "4.1.1" {
		t.Fatalf("formatCRIUVersion(40101) = %q", got)
	}
}
