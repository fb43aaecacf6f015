package fscred

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A file in a directory only root may enter cannot be reached as another
// user: the lookup fails as it would for that user (permission denied),
// whether the file exists or not, and a file that user may read is read.
// The process's own threads keep root's permissions.
func TestDo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: lookups as another user")
	}
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	private := filepath.Join(base, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(private, "there"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open")
	if err := os.WriteFile(open, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	user := Cred{UID: 61001, GID: 61001}
	for _, name := range []string{"there", "missing"} {
		err := Do(user, func() error { _, err := os.Stat(filepath.Join(private, name)); return err })
		if !errors.Is(err, fs.ErrPermission) {
			t.Errorf("stat of %s in root's private directory as uid 61001: %v, want permission denied", name, err)
		}
	}
	if err := Do(user, func() error { _, err := os.ReadFile(open); return err }); err != nil {
		t.Errorf("a file the user may read: %v", err)
	}
	// A supplementary group opens a directory of that group.
	group := filepath.Join(base, "group")
	if err := os.Mkdir(group, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(group, 0, 61050); err != nil {
		t.Fatal(err)
	}
	if err := Do(user, func() error { _, err := os.ReadDir(group); return err }); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("a directory of a group the user is not in: %v", err)
	}
	user.Groups = []uint32{61050}
	if err := Do(user, func() error { _, err := os.ReadDir(group); return err }); err != nil {
		t.Errorf("a directory of one of the user's groups: %v", err)
	}
	if _, err := os.Stat(filepath.Join(private, "there")); err != nil {
		t.Errorf("root lost its permissions: %v", err)
	}
}
