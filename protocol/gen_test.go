package protocol_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testroot"
)

// protocVersionLine is the one header line that names the protoc binary that
// ran; it does not change the generated code, so a machine with another
// protoc release does not make the committed code look stale.
var protocVersionLine = regexp.MustCompile(`(?m)^// \tprotoc +v.*$`)

// TestGeneratedCodeUpToDate regenerates protocol/imagepb the way `make proto`
// does, into a temporary directory, and fails if the committed code differs:
// a .proto edited without `make proto` would otherwise ship stale Go.
func TestGeneratedCodeUpToDate(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("protoc not found in CI (scripts/install-deps.sh installs protobuf-compiler): %v", err)
		}
		t.Skipf("protoc not installed: %v", err)
	}
	root := testroot.Dir(t)

	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	plugin, err := exec.Command(goBin, "tool", "-n", "protoc-gen-go").Output()
	if err != nil {
		t.Fatalf("go tool -n protoc-gen-go: %v", err)
	}
	out := t.TempDir()
	protos, err := filepath.Glob(filepath.Join(root, "protocol", "*.proto"))
	if err != nil || len(protos) == 0 {
		t.Fatalf("no .proto files under protocol/ (%v)", err)
	}
	args := []string{"-I", ".", "--plugin=protoc-gen-go=" + strings.TrimSpace(string(plugin)),
		"--go_out=" + out, "--go_opt=module=github.com/gpucr/gpucr"}
	for _, p := range protos {
		rel, _ := filepath.Rel(root, p)
		args = append(args, rel)
	}
	cmd := exec.Command(protoc, args...)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc %v: %v\n%s", args, err, msg)
	}

	generated, err := filepath.Glob(filepath.Join(out, "protocol", "*", "*.pb.go"))
	if err != nil || len(generated) == 0 {
		t.Fatalf("protoc generated nothing under %s (%v)", out, err)
	}
	committed, _ := filepath.Glob(filepath.Join(root, "protocol", "*", "*.pb.go"))
	if len(committed) != len(generated) {
		t.Errorf("committed %d .pb.go files, regeneration gives %d: run `make proto`", len(committed), len(generated))
	}
	for _, g := range generated {
		rel, _ := filepath.Rel(out, g)
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		have, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Errorf("%s: %v: run `make proto` and commit the result", rel, err)
			continue
		}
		want = protocVersionLine.ReplaceAll(want, nil)
		have = protocVersionLine.ReplaceAll(have, nil)
		if !bytes.Equal(want, have) {
			t.Errorf("%s is stale: run `make proto` and commit the result", rel)
		}
	}
}

// TestGeneratedCCodeUpToDate does the same for the C code protoc-c makes of
// helper.proto (protocol/c), which the interposer and the plugin compile.
func TestGeneratedCCodeUpToDate(t *testing.T) {
	protocC, err := exec.LookPath("protoc-c")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("protoc-c not found in CI (scripts/install-deps.sh installs protobuf-c-compiler): %v", err)
		}
		t.Skipf("protoc-c not installed: %v", err)
	}
	root := testroot.Dir(t)
	out := t.TempDir()
	cmd := exec.Command(protocC, "-I", "protocol", "--c_out="+out, "protocol/helper.proto")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc-c: %v\n%s", err, msg)
	}
	for _, name := range []string{"helper.pb-c.c", "helper.pb-c.h"} {
		want, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		have, err := os.ReadFile(filepath.Join(root, "protocol", "c", name))
		if err != nil {
			t.Errorf("protocol/c/%s: %v: run `make proto` and commit the result", name, err)
			continue
		}
		if !bytes.Equal(want, have) {
			t.Errorf("protocol/c/%s is stale: run `make proto` and commit the result", name)
		}
	}
}
