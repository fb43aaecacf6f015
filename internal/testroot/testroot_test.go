package testroot

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDirHoldsGoMod(t *testing.T) {
	d := Dir(t)
	if !filepath.IsAbs(d) {
		t.Fatalf("Dir = %q, not absolute", d)
	}
	b, err := os.ReadFile(filepath.Join(d, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "module github.com/gpucr/gpucr\n"; len(b) < len(want) || string(b[:len(want)]) != want {
		t.Fatalf("%s/go.mod is not gpucr's", d)
	}
	if got, want := filepath.Join(d, "internal", "testroot"), start; got != want {
		t.Fatalf("Dir = %q; this package is at %q", d, want)
	}
}

func TestFindFromBelowAndNone(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := find(deep, nil); err != nil || got != root {
		t.Fatalf("find(%q) = %q, %v; want %q", deep, got, err, root)
	}
	if _, err := find("/", nil); err == nil {
		t.Fatal("find(/) found a go.mod")
	}
}
