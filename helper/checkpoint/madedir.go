package checkpoint

// A checkpoint makes its image directory (and the directories above it
// that are missing) if it has to. One that is refused or interrupted must
// not leave them behind empty, as a directory that did not exist before:
// it removes each it made that nothing was put into, deepest first, by
// its name in the directory above, and only if that name is still the
// directory it made (whoever may write there may have put another one in
// its place) and still empty (rmdir removes nothing else).

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/image"
)

// madeDirs are the directories a command made, outermost first.
type madeDirs struct {
	dirs []madeDir
}

type madeDir struct {
	path     string
	dev, ino uint64
}

// mkdirAll makes path and the missing directories above it (0700), as
// os.MkdirAll does, and records those it made. It is made 0700: an image
// directory holds a process's memory.
func (m *madeDirs) mkdirAll(path string) error {
	path = filepath.Clean(path)
	var missing []string
	for p := path; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return &fs.PathError{Op: "mkdir", Path: p, Err: unix.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := m.mkdir(missing[i]); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// mkdir makes the directory p (0700) and records it; one that is there
// already is an fs.ErrExist, and not recorded.
func (m *madeDirs) mkdir(p string) error {
	if err := os.Mkdir(p, 0o700); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		m.dirs = append(m.dirs, madeDir{path: p, dev: uint64(st.Dev), ino: st.Ino})
	}
	return nil
}

// made says whether p is a directory the command made.
func (m *madeDirs) made(p string) bool {
	for _, d := range m.dirs {
		if d.path == filepath.Clean(p) {
			return true
		}
	}
	return false
}

// removeEmpty removes the directories made that are still the ones made
// and empty, deepest first; it stops at the first that is not (the ones
// above it are not empty either).
func (m *madeDirs) removeEmpty() {
	if m == nil {
		return
	}
	for i := len(m.dirs) - 1; i >= 0; i-- {
		if !removeIfEmpty(m.dirs[i]) {
			return
		}
	}
	m.dirs = nil
}

// removeIfEmpty removes d through a descriptor of the directory above it:
// only the entry that is still d (its device and inode, not followed), and
// only empty (rmdir fails on anything else).
func removeIfEmpty(d madeDir) bool {
	fd, err := unix.Open(filepath.Dir(d.path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	name := filepath.Base(d.path)
	var st unix.Stat_t
	if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR ||
		uint64(st.Dev) != d.dev || st.Ino != d.ino {
		return false
	}
	return unix.Unlinkat(fd, name, unix.AT_REMOVEDIR) == nil
}

// removeWriteLeftovers empties DIR/gpucr, which the command made, of what
// an image write that never committed leaves in it: its lock file and
// chunks/ with no chunk file in it (a write removes the files it made, not
// the directories). Anything else (a chunk, a manifest, a part) is left,
// and so is everything while a writer holds the lock.
func removeWriteLeftovers(g string) {
	d, err := os.Open(g)
	if err != nil {
		return
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return
	}
	for _, n := range names {
		if n != ".lock" && n != "chunks" {
			return
		}
	}
	fd := int(d.Fd())
	// The lock first: a writer still at work keeps everything.
	lfd, err := unix.Openat(fd, ".lock", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == nil {
		defer unix.Close(lfd)
		if unix.Flock(lfd, unix.LOCK_EX|unix.LOCK_NB) != nil {
			return
		}
	}
	cfd, err := unix.Openat(fd, "chunks", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		c := os.NewFile(uintptr(cfd), filepath.Join(g, "chunks"))
		subs, _ := c.Readdirnames(-1)
		for _, s := range subs {
			_ = unix.Unlinkat(cfd, s, unix.AT_REMOVEDIR) // only an empty chunks/HH
		}
		c.Close()
		if unix.Unlinkat(fd, "chunks", unix.AT_REMOVEDIR) != nil {
			return
		}
	}
	if err == nil || errors.Is(err, unix.ENOENT) {
		_ = unix.Unlinkat(fd, ".lock", 0)
	}
}

// gpuImageDirMade prepares the image directory of a GPU-only checkpoint,
// as the user who runs gpucr: DIR and DIR/gpucr are made (0700) if
// missing, so the kernel checks that this user may write there, and DIR is
// opened. The helper, which runs as root, writes only beneath the
// descriptor passed to it, into DIR/gpucr, and gives what it writes to
// this user. The directories it makes are recorded in m.
func gpuImageDirMade(dir string, m *madeDirs) (*os.File, error) {
	if err := m.mkdirAll(dir); err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	d := os.NewFile(uintptr(fd), dir)
	// Beneath the descriptor the helper gets: DIR/gpucr is in the
	// directory it writes into, whatever the path leads to meanwhile.
	if err := unix.Mkdirat(fd, image.SubDir, 0o700); err != nil && err != unix.EEXIST {
		d.Close()
		return nil, fmt.Errorf("image directory %s: %w", filepath.Join(dir, image.SubDir), err)
	} else if err == nil {
		var st unix.Stat_t
		if unix.Fstatat(fd, image.SubDir, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			m.dirs = append(m.dirs, madeDir{path: filepath.Join(dir, image.SubDir), dev: uint64(st.Dev), ino: st.Ino})
		}
	}
	return d, nil
}
