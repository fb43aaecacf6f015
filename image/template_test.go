package image

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func memfdWith(t *testing.T, b []byte) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "script")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func scriptFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, SubDir, "template-*.script"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A template script goes into the image as written and comes back checked;
// a damaged one is refused by name; an aborted write leaves none behind.
func TestTemplateScript(t *testing.T) {
	dir := t.TempDir()
	script := fxRand(7, 300000)
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddProcessInfo(ProcessInfo{Pid: 10, Served: true}); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTemplateScript(10, memfdWith(t, script), 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTemplateScript(11, memfdWith(t, script), 1000); err == nil || !strings.Contains(err.Error(), "larger than 1000 bytes") {
		t.Errorf("a script past the bound: %v", err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ps := im.Processes(); len(ps) != 1 || !ps[0].Template || !ps[0].Served {
		t.Errorf("processes %+v, want pid 10 served with its template", ps)
	}
	f, err := im.TemplateScript(10)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	f.Close()
	if err != nil || !bytes.Equal(got, script) {
		t.Fatalf("the script read back: %d bytes (%v), want the %d written", len(got), err, len(script))
	}
	if f, err := im.TemplateScript(20); f != nil || err != nil {
		t.Errorf("a process without a script: %v, %v", f, err)
	}
	im.Close()

	files := scriptFiles(t, dir)
	if len(files) != 1 {
		t.Fatalf("script files %v", files)
	}
	damaged := append([]byte(nil), script...)
	damaged[1234] ^= 1
	if err := os.WriteFile(files[0], damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	im, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if _, err := im.TemplateScript(10); !errors.Is(err, ErrTemplateDamaged) || !strings.Contains(err.Error(), files[0]) {
		t.Errorf("a damaged script: %v, want ErrTemplateDamaged naming %s", err, files[0])
	}
	if err := im.Verify(); !errors.Is(err, ErrTemplateDamaged) {
		t.Errorf("Verify of an image with a damaged script: %v", err)
	}
	if err := os.WriteFile(files[0], script[:1000], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := im.TemplateScript(10); !errors.Is(err, ErrTemplateDamaged) {
		t.Errorf("a truncated script: %v", err)
	}

	other := t.TempDir()
	w, err = Create(other, fxOrigin(), Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddTemplateScript(10, memfdWith(t, script), 1<<20); err != nil {
		t.Fatal(err)
	}
	if len(scriptFiles(t, other)) != 1 {
		t.Fatal("no script file while writing")
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if left := scriptFiles(t, other); len(left) != 0 {
		t.Errorf("an aborted write left %v", left)
	}
}
