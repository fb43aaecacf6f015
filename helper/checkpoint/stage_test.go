package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func openDir(t *testing.T, p string) *os.File {
	t.Helper()
	d, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A dump's stage is private; its images replace what DIR held under their
// names (a symlink is replaced, not written through) only when published,
// and the stage goes. A dump that is not published leaves DIR as it was.
func TestStageDump(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "target")
	writeFile(t, outside, "untouched")
	if err := os.Symlink(outside, filepath.Join(dir, "inventory.img")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "core-1.img"), "old image")
	d := openDir(t, dir)

	cd, err := stageDump(d, dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(cd.stage.Name()); err != nil || fi.Mode().Perm() != 0o700 || !strings.HasPrefix(filepath.Base(cd.stage.Name()), stagePrefix) {
		t.Fatalf("stage %s: %v, %v", cd.stage.Name(), fi, err)
	}
	writeFile(t, filepath.Join(cd.stage.Name(), "inventory.img"), "new inventory")
	writeFile(t, filepath.Join(cd.stage.Name(), "core-1.img"), "new image")
	cd.remove() // a failed dump
	if got := readFile(t, filepath.Join(dir, "core-1.img")); got != "old image" {
		t.Errorf("a failed dump changed DIR's image: %q", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("after a failed dump DIR holds %v", ents)
	}

	cd, err = stageDump(d, dir)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cd.stage.Name(), "inventory.img"), "new inventory")
	writeFile(t, filepath.Join(cd.stage.Name(), "core-1.img"), "new image")
	if err := cd.publish(); err != nil {
		t.Fatal(err)
	}
	cd.remove()
	if got := readFile(t, filepath.Join(dir, "core-1.img")); got != "new image" {
		t.Errorf("core-1.img: %q", got)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "inventory.img")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("inventory.img is not the dump's own file: %v, %v", fi, err)
	}
	if got := readFile(t, outside); got != "untouched" {
		t.Errorf("written through the symlink: %q", got)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".gpucr-") {
			t.Errorf("%s left behind", e.Name())
		}
	}
}

// An image that cannot be moved into DIR (a directory has its name) keeps
// the stage, and the error says where the images are.
func TestStageDumpPublishFails(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "core-1.img", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	cd, err := stageDump(openDir(t, dir), dir)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cd.stage.Name(), "core-1.img"), "new image")
	stage := cd.stage.Name()
	err = cd.publish()
	cd.remove()
	if err == nil || !strings.Contains(err.Error(), stage) {
		t.Fatalf("publish over a directory: %v", err)
	}
	if got := readFile(t, filepath.Join(stage, "core-1.img")); got != "new image" {
		t.Errorf("the image was lost: %q", got)
	}
}

// A restore's stage holds links of DIR's regular files of the caller's,
// nothing else (symlinks, others' files, gpucr's own); without the caller's
// inventory.img there is nothing to restore.
func TestStageRestore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of another uid are made")
	}
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "inventory.img"), "inventory")
	writeFile(t, filepath.Join(dir, "core-1.img"), "core")
	writeFile(t, filepath.Join(dir, "pages-1.img"), "someone else's")
	if err := os.Chown(filepath.Join(dir, "pages-1.img"), 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "mm-1.img")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "gpucr"), 0o700); err != nil {
		t.Fatal(err)
	}
	d := openDir(t, dir)
	cd, err := stageRestore(d, dir)
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(cd.stage.Name())
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "core-1.img inventory.img" {
		t.Errorf("the stage holds %v, want the caller's regular files", names)
	}
	writeFile(t, filepath.Join(cd.stage.Name(), "stats-restore"), "stats")
	cd.keepNew()
	cd.remove()
	if got := readFile(t, filepath.Join(dir, "stats-restore")); got != "stats" {
		t.Errorf("stats-restore: %q", got)
	}
	if got := readFile(t, filepath.Join(dir, "core-1.img")); got != "core" {
		t.Errorf("DIR's own file after the restore: %q", got)
	}

	if err := os.Chown(filepath.Join(dir, "inventory.img"), 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if _, err := stageRestore(d, dir); err == nil || !strings.Contains(err.Error(), "inventory.img belongs to uid 12345, not to uid 0") {
		t.Errorf("another uid's inventory.img: %v", err)
	}
	ents, _ = os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".gpucr-") {
			t.Errorf("%s left behind", e.Name())
		}
	}
}

// placeFile puts a copy where a symlink was, writing nothing through it.
func TestPlaceFile(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "target")
	writeFile(t, outside, "untouched")
	if err := os.Symlink(outside, filepath.Join(dir, "dump.log")); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "dump.log")
	writeFile(t, src, "CRIU's log\n")
	if err := placeFile(openDir(t, dir), dir, src, "dump.log"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "dump.log")); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dump.log: %v, %v", fi, err)
	}
	if got := readFile(t, filepath.Join(dir, "dump.log")); got != "CRIU's log\n" {
		t.Errorf("dump.log: %q", got)
	}
	if got := readFile(t, outside); got != "untouched" {
		t.Errorf("written through the symlink: %q", got)
	}
}
