package checkpoint

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
// private directories (a dump's stage, an old image put aside); a symlink
// does not go, and is named.
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
	res, err := writeTar(&b, dir, nil)
	if err != nil || res.Bytes != int64(len("inv")+len("m")+len("chunk")) || !slices.Equal(res.NotSent, []string{"link: symlink"}) {
		t.Fatalf("writeTar: %+v, %v", res, err)
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

// A target whose gpucr cannot receive a streamed image is refused before
// anything stops (unless the image is shared, and nothing is sent).
func TestCheckWantsReceive(t *testing.T) {
	dir := t.TempDir()
	ssh := filepath.Join(dir, "ssh-here")
	if err := os.WriteFile(ssh, []byte("#!/bin/sh\nshift\nexec /bin/sh -c \"$1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		answer string
		shared bool
		want   string
	}{
		{`{"version": "0.0.9"}`, false, "has no `gpucr image receive`"},
		{`{"version": "0.0.9"}`, true, ""},
		{`{"version": "1", "features": "other,image-receive"}`, false, ""},
		{`not json`, false, "does not answer"},
	} {
		gpucr := filepath.Join(dir, "gpucr-here")
		if err := os.WriteFile(gpucr, []byte("#!/bin/sh\necho '"+c.answer+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		tg := &SSHTarget{SSH: []string{ssh}, Host: "here", Gpucr: []string{gpucr}, Shared: c.shared}
		err := tg.Check(t.Context())
		if (c.want == "" && err != nil) || (c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want))) {
			t.Errorf("%s (shared %v): %v, want %q", c.answer, c.shared, err, c.want)
		}
	}
}
