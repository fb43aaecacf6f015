package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/image"
)

// A checkpoint into a directory that already holds an image would leave the
// old image's files (a process's pages that the new dump does not write, GPU
// chunks) beside the new ones, and a restore would mix them. It is refused,
// unless --force: then the old image is put aside in DIR before the dump and
// removed once the new one is complete, or put back if the dump fails.

// runLeftovers are what a failed run leaves in DIR (its log, its
// statistics); a new checkpoint replaces them.
var runLeftovers = []string{"dump.log", "restore.log", "stats-dump", "stats-restore"}

// asidePrefix starts the name of the directory an old image is put aside in.
const asidePrefix = ".gpucr-old-"

// heldEntries lists what DIR holds besides a failed run's leftovers and
// gpucr's own private directories.
func heldEntries(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if slices.Contains(runLeftovers, n) || strings.HasPrefix(n, ".gpucr-") {
			continue
		}
		out = append(out, n)
	}
	return out, nil
}

// describeHeld says what the entries of DIR are, for a refusal.
func describeHeld(names []string) string {
	var what []string
	if slices.Contains(names, "inventory.img") {
		what = append(what, "a CRIU image")
	}
	if slices.Contains(names, image.SubDir) {
		what = append(what, "a GPU image (gpucr/)")
	}
	s := fmt.Sprintf("%d entries", len(names))
	if len(names) == 1 {
		s = "1 entry"
	}
	if len(what) > 0 {
		s = strings.Join(what, " and ") + ", " + s
	}
	return s
}

// asideDir is an old image moved into a private directory inside DIR.
type asideDir struct {
	dir   *os.File
	path  string // DIR's path
	name  string
	ino   uint64 // the directory made, told apart from one put in its place
	moved []string
}

// ours says whether DIR's entry a.name is still the directory putAside made
// (whoever may write DIR could have swapped it).
func (a *asideDir) ours() bool {
	var st unix.Stat_t
	return unix.Fstatat(int(a.dir.Fd()), a.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Ino == a.ino &&
		st.Mode&unix.S_IFMT == unix.S_IFDIR && int(st.Uid) == os.Geteuid()
}

// putAside moves names of DIR into a new private directory inside it.
func putAside(path string, names []string) (*asideDir, error) {
	d, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", path, err)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		d.Close()
		return nil, err
	}
	a := &asideDir{dir: d, path: path, name: asidePrefix + hex.EncodeToString(b[:])}
	if err := unix.Mkdirat(int(d.Fd()), a.name, 0o700); err != nil {
		d.Close()
		return nil, fmt.Errorf("image directory %s: a place for the old image: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(int(d.Fd()), a.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		d.Close()
		return nil, fmt.Errorf("image directory %s: a place for the old image: %w", path, err)
	}
	a.ino = st.Ino
	for _, n := range names {
		if err := unix.Renameat(int(d.Fd()), n, int(d.Fd()), filepath.Join(a.name, n)); err != nil {
			rerr := a.putBack()
			return nil, errors.Join(fmt.Errorf("image directory %s: moving the old image's %s aside: %w", path, n, err), rerr)
		}
		a.moved = append(a.moved, n)
	}
	return a, nil
}

// putBack returns the old image to DIR (the new dump failed); whatever the
// failed dump left under the same names is removed first.
func (a *asideDir) putBack() error {
	defer a.dir.Close()
	if !a.ours() {
		return fmt.Errorf("the old image's directory %s was replaced meanwhile; left alone", filepath.Join(a.path, a.name))
	}
	var errs []error
	for _, n := range a.moved {
		if err := os.RemoveAll(filepath.Join(a.path, n)); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Renameat(int(a.dir.Fd()), filepath.Join(a.name, n), int(a.dir.Fd()), n); err != nil {
			errs = append(errs, fmt.Errorf("putting back %s: %w", n, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("the old image stays in %s: %w", filepath.Join(a.path, a.name), errors.Join(errs...))
	}
	return unix.Unlinkat(int(a.dir.Fd()), a.name, unix.AT_REMOVEDIR)
}

// discard removes the old image (the new one is complete).
func (a *asideDir) discard() error {
	defer a.dir.Close()
	if !a.ours() {
		return fmt.Errorf("the old image's directory %s was replaced meanwhile; left alone", filepath.Join(a.path, a.name))
	}
	// RemoveAll unlinks symlinks, it does not follow them
	if err := os.RemoveAll(filepath.Join(a.path, a.name)); err != nil {
		return fmt.Errorf("removing the old image %s: %w", filepath.Join(a.path, a.name), err)
	}
	return nil
}
