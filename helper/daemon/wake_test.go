package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWakeFiles: a wake file is made, read as written and removed in the
// wake directory beside the socket.
func TestWakeFiles(t *testing.T) {
	dir := t.TempDir()
	w := newWakeFiles(dir)
	defer w.close()
	if err := w.create(42, "lost: gone"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "wake", "42")); err != nil || string(b) != "lost: gone" {
		t.Fatalf("wake file: %q, %v", b, err)
	}
	if w.name(42) != "wake/42" || w.path(42) != filepath.Join(dir, "wake", "42") {
		t.Errorf("name %q, path %q", w.name(42), w.path(42))
	}
	if err := w.create(42, ""); err != nil {
		t.Fatalf("made again: %v", err)
	}
	w.remove(42)
	if _, err := os.Lstat(filepath.Join(dir, "wake", "42")); !os.IsNotExist(err) {
		t.Errorf("removed wake file: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "wake")); len(ents) != 0 {
		t.Errorf("left in the wake directory: %v", ents)
	}
}

// TestWakeDirectoryPlanted: another user who could write the socket's
// directory plants the wake or the state directory: as a link to a
// directory of root's, as a directory of their own, or as one everyone can
// write. The helper writes, reads and removes nothing through any of them,
// and says why.
func TestWakeDirectoryPlanted(t *testing.T) {
	for _, c := range []struct {
		name  string
		plant func(t *testing.T, wake, target string)
		want  string
	}{
		{"a link", func(t *testing.T, wake, target string) {
			if err := os.Symlink(target, wake); err != nil {
				t.Fatal(err)
			}
		}, "is not followed"},
		{"another user's directory", func(t *testing.T, wake, _ string) {
			if os.Geteuid() != 0 {
				t.Skip("not root: cannot give a directory to another user")
			}
			if err := os.Mkdir(wake, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(wake, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "belongs to uid 65534"},
		{"a directory everyone can write", func(t *testing.T, wake, _ string) {
			if err := os.Mkdir(wake, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(wake, 0o777); err != nil {
				t.Fatal(err)
			}
		}, "mode 0777"},
	} {
		for _, which := range []string{"wake", "detached"} {
			t.Run(c.name+"/"+which, func(t *testing.T) {
				dir, target := t.TempDir(), t.TempDir()
				if err := os.WriteFile(filepath.Join(target, "42.json"), []byte(`{"pid":42}`), 0o600); err != nil {
					t.Fatal(err)
				}
				c.plant(t, filepath.Join(dir, which), target)
				var err error
				if which == "wake" {
					w := newWakeFiles(dir)
					defer w.close()
					err = w.create(42, "lost: x")
					w.remove(42)
				} else {
					ds := newDetachStates(dir)
					defer ds.close()
					err = ds.save(detachState{Pid: 43})
					ds.drop(42)
					if names := ds.files(); len(names) != 0 {
						t.Errorf("state files read through the planted directory: %v", names)
					}
				}
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("a write: %v, want a refusal with %q", err, c.want)
				}
				if ents, _ := os.ReadDir(target); len(ents) != 1 || ents[0].Name() != "42.json" {
					t.Errorf("the helper wrote or removed through the planted directory: %v", ents)
				}
			})
		}
	}
}

// TestSocketDirectoryOthersCanWrite: the helper does not listen in a
// directory other users can write, or one of another user's, where they
// could plant what it then writes through; it says where to put the socket.
func TestSocketDirectoryOthersCanWrite(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"everyone may write", func(t *testing.T, dir string) {
			if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
				t.Fatal(err)
			}
		}, "with mode 1777"},
		{"group may write", func(t *testing.T, dir string) {
			if err := os.Chmod(dir, 0o775); err != nil {
				t.Fatal(err)
			}
		}, "with mode 0775"},
		{"another user's", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("not root: cannot give a directory to another user")
			}
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "belongs to uid 65534"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.setup(t, dir)
			s := New(Config{Socket: filepath.Join(dir, "helper.sock")})
			err := s.Listen()
			if err == nil {
				s.Shutdown()
				t.Fatal("the helper listens there")
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "a directory of its own") {
				t.Errorf("Listen: %v, want %q and where to put the socket", err, c.want)
			}
			if _, err := os.Lstat(filepath.Join(dir, "helper.sock")); err == nil {
				t.Errorf("the socket was made")
			}
		})
	}
	dir := filepath.Join(t.TempDir(), "made") // made by the helper: its own, 0755
	s := New(Config{Socket: filepath.Join(dir, "helper.sock")})
	if err := s.Listen(); err != nil {
		t.Fatalf("a socket directory the helper makes: %v", err)
	}
	s.Shutdown()
}
