package checkpoint

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// A word quoted for the target's shell comes out of it unchanged.
func TestShellQuote(t *testing.T) {
	for _, w := range []string{"plain", "/a/b-c_d.e", "with space", "it's", `"dq"`, "$HOME", "a;rm -rf /", "`x`", "", "*"} {
		out, err := exec.Command("/bin/sh", "-c", "printf %s "+shellQuote(w)).Output()
		if err != nil || string(out) != w {
			t.Errorf("%q through the shell: %q, %v", w, out, err)
		}
	}
}

// The image goes over as its files and directories, without gpucr's
// private directories (a dump's stage, an old image put aside).
func TestWriteTar(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"inventory.img": "inv", "gpucr/manifest.pb": "m", "gpucr/c/0001": "chunk",
		".gpucr-criu-1/junk": "x", ".gpucr-old-2/inventory.img": "old"} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	n, err := writeTar(&b, dir, nil)
	if err != nil || n != int64(len("inv")+len("m")+len("chunk")) {
		t.Fatalf("writeTar: %d bytes, %v", n, err)
	}
	var names []string
	tr := tar.NewReader(&b)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	slices.Sort(names)
	if want := []string{"gpucr", "gpucr/c", "gpucr/c/0001", "gpucr/manifest.pb", "inventory.img"}; !slices.Equal(names, want) {
		t.Errorf("archive holds %q, want %q", names, want)
	}
}
