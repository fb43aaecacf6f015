package daemon

// Directories of the helper's own beside its socket: wake/, where detached
// processes look for the file that calls them back (wake.go), and
// detached/, the state files of processes whose memory an image holds
// (adopt.go). Root writes there for every user's processes, so each is
// opened once, without following a link, and must be the helper's own and
// writable by no one else; every file in it is made, read and removed
// beneath that descriptor. (The socket's directory itself must be the
// helper's own too: ownSocketDir.)

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// helperOwns says whether a directory is the helper's own: its owner is the
// helper's uid, and no one else may write it.
func helperOwns(st *unix.Stat_t) bool { return int(st.Uid) == os.Geteuid() && st.Mode&0o022 == 0 }

// ownDir is one such directory: name in sockDir, made with mode.
type ownDir struct {
	sockDir string
	name    string
	mode    uint32
	mu      sync.Mutex
	dir     *os.File // opened on first use
}

// where is the directory's path, for messages.
func (d *ownDir) where() string { return filepath.Join(d.sockDir, d.name) }

// open returns the directory, made and checked on first use: no link, a
// directory, the helper's own, writable by it alone.
func (d *ownDir) open() (*os.File, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dir != nil {
		return d.dir, nil
	}
	parent, err := unix.Open(d.sockDir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket directory %s: %w", d.sockDir, err)
	}
	defer unix.Close(parent)
	made := true
	if err := unix.Mkdirat(parent, d.name, d.mode); err == unix.EEXIST {
		made = false
	} else if err != nil {
		return nil, fmt.Errorf("%s: %w", d.where(), err)
	}
	fd, err := unix.Openat(parent, d.name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (a link, or no directory, is not followed)", d.where(), err)
	}
	if made {
		_ = unix.Fchmod(fd, d.mode) // whatever the helper's umask
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", d.where(), err)
	}
	if !helperOwns(&st) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s belongs to uid %d with mode %04o: the helper writes only in a directory of its own (uid %d) that no one else can write; remove it",
			d.where(), st.Uid, st.Mode&0o7777, os.Geteuid())
	}
	d.dir = os.NewFile(uintptr(fd), d.where())
	return d.dir, nil
}

// write makes the file name with content b (perm): written under another
// name and renamed, so that a reader sees it whole or not at all.
func (d *ownDir) write(name string, b []byte, perm uint32) error {
	dir, err := d.open()
	if err != nil {
		return err
	}
	dfd := int(dir.Fd())
	tmp := "." + name + ".tmp"
	_ = unix.Unlinkat(dfd, tmp, 0) // a leftover of a helper that died here
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(d.where(), name), err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.Write(b)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, name)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("%s: %w", filepath.Join(d.where(), name), werr)
	}
	return nil
}

// read returns the content of the regular file name, at most limit bytes.
func (d *ownDir) read(name string, limit int64) ([]byte, error) {
	dir, err := d.open()
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", filepath.Join(d.where(), name))
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("%s: over %d bytes", filepath.Join(d.where(), name), limit)
	}
	return b, err
}

// remove removes the file name, if there is one.
func (d *ownDir) remove(name string) {
	if dir, err := d.open(); err == nil {
		_ = unix.Unlinkat(int(dir.Fd()), name, 0)
	}
}

// names lists the files whose names end in suffix (none if the directory
// cannot be opened).
func (d *ownDir) names(suffix string) []string {
	dir, err := d.open()
	if err != nil {
		return nil
	}
	// a descriptor of its own: reading moves the offset
	fd, err := unix.Openat(int(dir.Fd()), ".", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), d.where())
	defer f.Close()
	all, _ := f.Readdirnames(-1)
	var out []string
	for _, n := range all {
		if strings.HasSuffix(n, suffix) && !strings.HasPrefix(n, ".") {
			out = append(out, n)
		}
	}
	return out
}

// close lets the directory go (the helper stops; a later use opens it
// again).
func (d *ownDir) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dir != nil {
		_ = d.dir.Close()
		d.dir = nil
	}
}
