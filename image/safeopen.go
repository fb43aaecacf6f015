package image

// Every file and directory beneath an image directory is opened here: a
// path is resolved beneath an open directory and follows no symlink, an
// open never blocks on a FIFO, and what was opened is checked to be the
// kind of file expected before anything reads or writes it. The path to
// the image directory itself is the caller's (as for any program given a
// path); nothing the image directory holds can send a reader or writer
// elsewhere.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// beneath is how a path under an open directory is resolved: inside it
// (no "..", no absolute path, no magic link of /proc), through no symlink.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openFlags go with every open: the last component is not followed either,
// a FIFO or a device does not block the open (a FIFO then fails the type
// check instead), the descriptor does not leak into children, and no
// terminal becomes ours.
const openFlags = unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY

// Modes of what the image package creates: an image is its owner's alone.
const (
	dirMode  = 0o700
	fileMode = 0o600
)

// noOpenat2 is set once openat2 answered ENOSYS (a kernel before 5.6, or a
// seccomp filter that does not know it): paths are then walked one
// component at a time, with the same guarantees.
var noOpenat2 atomic.Bool

// openat2 opens rel beneath dirfd (resolution as by beneath); perm is used
// with O_CREAT only.
func openat2(dirfd int, rel string, flags int, perm uint32) (int, error) {
	if flags&unix.O_CREAT == 0 {
		perm = 0
	}
	if !noOpenat2.Load() {
		for tries := 0; ; tries++ {
			fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: uint64(flags), Mode: uint64(perm), Resolve: beneath})
			// EAGAIN: a rename raced with the lookup; EINTR: a signal.
			if (err == unix.EINTR || err == unix.EAGAIN) && tries < 16 {
				continue
			}
			if err != unix.ENOSYS {
				return fd, err
			}
			noOpenat2.Store(true)
			break
		}
	}
	return walkOpen(dirfd, rel, flags, perm)
}

// walkOpen is openat2 without openat2: each directory on the way is opened
// with O_NOFOLLOW from the one before, so no symlink is followed and ".."
// is refused outright.
func walkOpen(dirfd int, rel string, flags int, perm uint32) (int, error) {
	parts := strings.Split(rel, "/")
	cur := dirfd
	defer func() {
		if cur != dirfd {
			unix.Close(cur)
		}
	}()
	for i, p := range parts {
		if p == "" || p == "." || p == ".." {
			return -1, unix.EXDEV // what openat2 says of a path leaving its directory
		}
		if i == len(parts)-1 {
			return unix.Openat(cur, p, flags, perm)
		}
		next, err := unix.Openat(cur, p, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOTDIR {
			var st unix.Stat_t
			if unix.Fstatat(cur, p, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
		}
		if err != nil {
			return -1, err
		}
		if cur != dirfd {
			unix.Close(cur)
		}
		cur = next
	}
	return -1, unix.EINVAL // not reached: Split returns at least one part
}

// FileTypeError is a path in an image that is not the kind of file expected
// there: a FIFO or symlink where a chunk or the manifest should be, say. It
// is damage to the image (errors.Is ErrCorrupt), and nothing was read from
// or written through it.
type FileTypeError struct {
	Path string
	Is   string // "FIFO", "symlink", "directory", ...
	Want string // "regular file" or "directory"
}

func (e *FileTypeError) Error() string { return e.Path + " " + e.what() }

// what is the message without the path, for errors that name it already.
func (e *FileTypeError) what() string {
	s := fmt.Sprintf("is a %s, not a %s", e.Is, e.Want)
	if e.Is == "symlink" {
		s += " (symlinks in an image are not followed)"
	}
	return s
}

func (e *FileTypeError) Unwrap() error { return ErrCorrupt }

// ErrOwner: a file or directory of an image, or a parent image, belongs to
// another user than the image's owner (Options.Owner).
var ErrOwner = errors.New("belongs to another user")

// OwnerError names the file and both users.
type OwnerError struct {
	Path      string
	UID, Want int
}

func (e *OwnerError) Error() string {
	return fmt.Sprintf("%s belongs to uid %d, not to uid %d, the image's owner", e.Path, e.UID, e.Want)
}

func (e *OwnerError) Unwrap() error { return ErrOwner }

// fileKind names a file type for messages.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsDir():
		return "directory"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m.IsRegular():
		return "regular file"
	}
	return "special file"
}

// Owner is the user an image belongs to (Options.Owner): what the image
// package creates is chowned to it, and what it finds must already be its.
type Owner struct {
	UID, GID int
}

// check refuses fi (of path) unless it belongs to o; a nil Owner accepts
// everything (the process works for itself, and the kernel's permission
// checks are the rule).
func (o *Owner) check(path string, fi fs.FileInfo) error {
	if o == nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner known", path)
	}
	if int(st.Uid) != o.UID {
		return &OwnerError{Path: path, UID: int(st.Uid), Want: o.UID}
	}
	return nil
}

// chown gives f to o, unless it is the process's own already.
func (o *Owner) chown(f *os.File) error {
	if o == nil || (o.UID == os.Geteuid() && o.GID == os.Getegid()) {
		return nil
	}
	if err := f.Chown(o.UID, o.GID); err != nil {
		return fmt.Errorf("give %s to uid %d: %w", f.Name(), o.UID, err)
	}
	return nil
}

// fsDir is an open directory of an image and the path it is known by (for
// messages; nothing is opened by that path).
type fsDir struct {
	f    *os.File
	path string
}

func (d *fsDir) fd() int                { return int(d.f.Fd()) }
func (d *fsDir) join(rel string) string { return filepath.Join(d.path, rel) }

func (d *fsDir) close() {
	if d != nil && d.f != nil {
		d.f.Close()
	}
}

// sync makes d's entries (creations, renames, removals) durable.
func (d *fsDir) sync() error {
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", d.path, err)
	}
	return nil
}

// openDirPath opens the directory at path (the caller's path: symlinks on
// the way are followed, as for any path a program is given). A FIFO or
// another non-directory there is refused without being opened for I/O.
func openDirPath(path string) (*fsDir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err == unix.EINTR {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	}
	if err != nil {
		if err == unix.ENOTDIR {
			if fi, serr := os.Stat(path); serr == nil && !fi.IsDir() {
				return nil, &FileTypeError{Path: path, Is: fileKind(fi.Mode()), Want: "directory"}
			}
		}
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return &fsDir{f: os.NewFile(uintptr(fd), path), path: path}, nil
}

// dirOf wraps an open directory given by a caller (a descriptor another
// process passed): it is duplicated, the caller keeps f, and it must be a
// directory.
func dirOf(f *os.File) (*fsDir, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	path := fdPath(f)
	if !fi.IsDir() {
		return nil, &FileTypeError{Path: path, Is: fileKind(fi.Mode()), Want: "directory"}
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", path, err)
	}
	return &fsDir{f: os.NewFile(uintptr(fd), path), path: path}, nil
}

// fdPath is the path the kernel knows an open file by (in this process's
// mount namespace), else the name it was opened with.
func fdPath(f *os.File) string {
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil || !filepath.IsAbs(p) {
		return f.Name()
	}
	return p
}

// open opens rel beneath d, as by openat2 with openFlags added; the error
// names the path and, for a symlink on the way or a FIFO that cannot be
// opened without blocking, says so.
func (d *fsDir) open(rel string, flags int, perm uint32) (*os.File, error) {
	fd, err := openat2(d.fd(), rel, flags|openFlags, perm)
	if err != nil {
		return nil, d.openError(rel, err, flags&unix.O_DIRECTORY != 0)
	}
	return os.NewFile(uintptr(fd), d.join(rel)), nil
}

// openError turns a failed open of rel into an error naming the path: a
// symlink anywhere on the way (ELOOP, EXDEV), or a FIFO without a reader
// (ENXIO), is named as what it is. wantDir: rel was to be a directory.
func (d *fsDir) openError(rel string, err error, wantDir bool) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENOTDIR) {
		if p, kind := d.describe(rel); kind != "" {
			want := "regular file"
			if wantDir || p != d.join(rel) {
				want = "directory"
			}
			if kind != want {
				return &FileTypeError{Path: p, Is: kind, Want: want}
			}
		}
	}
	return &fs.PathError{Op: "open", Path: d.join(rel), Err: err}
}

// describe finds the first component of rel beneath d that is a symlink or
// is not a directory where one is needed, and says what it is. It opens
// nothing for I/O (O_PATH).
func (d *fsDir) describe(rel string) (path, kind string) {
	parts := strings.Split(rel, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		fd, err := openat2(d.fd(), sub, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", ""
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			return "", ""
		}
		mode := statMode(st.Mode)
		if mode&fs.ModeSymlink != 0 || i == len(parts)-1 || !mode.IsDir() {
			return d.join(sub), fileKind(mode)
		}
	}
	return "", ""
}

// statMode is the fs.FileMode type bits of a stat mode.
func statMode(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFLNK:
		return fs.ModeSymlink
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	}
	return 0
}

// openFile opens the regular file rel beneath d and refuses anything else
// (a FIFO, a device, a directory) before any I/O; own, if set, must own it.
func (d *fsDir) openFile(rel string, flags int, own *Owner) (*os.File, error) {
	f, err := d.open(rel, flags, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &FileTypeError{Path: f.Name(), Is: fileKind(fi.Mode()), Want: "regular file"}
	}
	if err == nil {
		err = own.check(f.Name(), fi)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openDir opens the directory rel beneath d; own, if set, must own it.
func (d *fsDir) openDir(rel string, own *Owner) (*fsDir, error) {
	// Another user's directory is refused by its owner before it is
	// opened: looked up with the caller's own permissions (fscred), it
	// may be one the caller may see but not open, and "belongs to uid N"
	// says why better than "permission denied".
	if own != nil && !strings.Contains(rel, "/") {
		var st unix.Stat_t
		if unix.Fstatat(d.fd(), rel, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR &&
			int(st.Uid) != own.UID {
			return nil, &OwnerError{Path: d.join(rel), UID: int(st.Uid), Want: own.UID}
		}
	}
	f, err := d.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.IsDir() { // O_DIRECTORY makes this impossible; checked all the same
		err = &FileTypeError{Path: f.Name(), Is: fileKind(fi.Mode()), Want: "directory"}
	}
	if err == nil {
		err = own.check(f.Name(), fi)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &fsDir{f: f, path: f.Name()}, nil
}

// mkdir makes the directory name in d (mode 0700, given to own) if it is
// not there, and opens it; one that is there must be a directory (not a
// symlink to one) belonging to own. created says whether it was made.
func (d *fsDir) mkdir(name string, own *Owner) (sub *fsDir, created bool, err error) {
	err = unix.Mkdirat(d.fd(), name, dirMode)
	switch {
	case err == nil:
		created = true
	case err == unix.EEXIST:
	default:
		return nil, false, &fs.PathError{Op: "mkdir", Path: d.join(name), Err: err}
	}
	if !created {
		sub, err = d.openDir(name, own)
		return sub, false, err
	}
	// Made by this process, 0700: nobody else can have replaced it yet.
	if sub, err = d.openDir(name, nil); err != nil {
		return nil, true, err
	}
	if err := own.chown(sub.f); err != nil {
		sub.close()
		return nil, true, err
	}
	return sub, true, nil
}

// create makes the new file name in d (O_EXCL: never an existing one, nor
// through a symlink), mode 0600, given to own.
func (d *fsDir) create(name string, flags int, own *Owner) (*os.File, error) {
	f, err := d.open(name, flags|unix.O_CREAT|unix.O_EXCL, fileMode)
	if err != nil {
		return nil, err
	}
	if err := own.chown(f); err != nil {
		f.Close()
		_ = unix.Unlinkat(d.fd(), name, 0)
		return nil, err
	}
	return f, nil
}

// fileID identifies a file this process created, so that it removes that
// file and not one put under the same name since. (An inode number can be
// reused once its file is gone; only the image's owner, or root, can
// replace files in the owner's 0700 directories, and then loses at most
// its own file.)
type fileID struct{ dev, ino uint64 }

func idOf(f *os.File) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileID{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return fileID{uint64(st.Dev), st.Ino}, nil
}

// lstat is fstatat of name in d, the last component not followed.
func (d *fsDir) lstat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return st, &fs.PathError{Op: "stat", Path: d.join(name), Err: err}
	}
	return st, nil
}

// removeOwn removes name from d if it is still the file id says (one this
// process created); a file put there since stays.
func (d *fsDir) removeOwn(name string, id fileID) error {
	st, err := d.lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if (fileID{uint64(st.Dev), st.Ino}) != id {
		return nil
	}
	if err := unix.Unlinkat(d.fd(), name, 0); err != nil && err != unix.ENOENT {
		return &fs.PathError{Op: "remove", Path: d.join(name), Err: err}
	}
	return nil
}

// rename moves old in d to new in to (neither followed: rename replaces
// the entry new, whatever it is, and never writes through it).
func (d *fsDir) rename(old string, to *fsDir, new string) error {
	if err := unix.Renameat(d.fd(), old, to.fd(), new); err != nil {
		return &os.LinkError{Op: "rename", Old: d.join(old), New: to.join(new), Err: err}
	}
	return nil
}
