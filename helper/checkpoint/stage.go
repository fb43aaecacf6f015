package checkpoint

// CRIU runs as root, and opens its images and its log in the directory it
// works in by name, following symlinks: run on an image directory someone
// else may write (a user's, or a shared 1777 one), it would write through a
// symlink planted there into any file on the system, and restore from files
// it did not write. So CRIU never works in the image directory DIR itself:
//
//   - its work directory (its log and statistics) is the session's private
//     directory; they are placed into DIR afterwards (placeFile), by a
//     rename, which replaces whatever has that name and follows nothing;
//   - its images directory is a private directory made inside DIR (0700,
//     this process's; "stage" below). A dump's images are renamed from there
//     into DIR once the dump has succeeded, so a failed dump leaves the
//     images DIR held as they were. A restore's are hard links to DIR's
//     files that belong to the caller: a file someone else put into DIR is
//     not among them, and none can be swapped while CRIU reads.
//   - The GPU image is DIR's own: the helper writes and reads it beneath the
//     descriptor it is given, under its own rules (docs/security.md). The
//     plugin gets DIR as descriptor 4 (GPUCR_IMAGE_DIR_FD).

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/image"
)

// stagePrefix starts the name of the private directory CRIU works in.
const stagePrefix = ".gpucr-criu-"

// criuDir is an image directory prepared for one CRIU run.
type criuDir struct {
	dir   *os.File // DIR
	path  string   // DIR's path, for messages
	stage *os.File // DIR/<name>: CRIU's images directory
	name  string
	ino   uint64
	// linked: a restore's links of DIR's files into the stage.
	linked map[string]bool
}

// newStage makes the private directory inside dir.
func newStage(dir *os.File, path string) (*criuDir, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	name := stagePrefix + hex.EncodeToString(b[:])
	fd := int(dir.Fd())
	if err := unix.Mkdirat(fd, name, 0o700); err != nil {
		return nil, fmt.Errorf("image directory %s: a private directory for CRIU: %w", path, err)
	}
	sfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: a private directory for CRIU: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		unix.Close(sfd)
		return nil, err
	}
	// Whoever may write DIR may have put another directory in its place
	// between the two calls: only this process's own is used.
	if int(st.Uid) != os.Geteuid() || st.Mode&0o777 != 0o700 {
		unix.Close(sfd)
		return nil, fmt.Errorf("image directory %s: the private directory %s was replaced while it was made", path, name)
	}
	return &criuDir{dir: dir, path: path, stage: os.NewFile(uintptr(sfd), filepath.Join(path, name)), name: name,
		ino: st.Ino, linked: map[string]bool{}}, nil
}

// entries lists the names in the directory d is open on.
func entries(d *os.File) ([]os.DirEntry, error) {
	fd, err := unix.Openat(int(d.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), d.Name())
	defer f.Close()
	ents, err := f.ReadDir(-1)
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	return ents, err
}

// stageDump prepares DIR for a dump: CRIU writes into the stage.
func stageDump(dir *os.File, path string) (*criuDir, error) { return newStage(dir, path) }

// stageRestore prepares DIR for a restore: every regular file of DIR that
// belongs to the caller is linked into the stage, where CRIU reads it. DIR's
// inventory.img must be among them: CRIU's images are restored only as the
// user who wrote them (as root: root's), whatever else DIR holds.
func stageRestore(dir *os.File, path string) (*criuDir, error) {
	cd, err := newStage(dir, path)
	if err != nil {
		return nil, err
	}
	uid := uint32(os.Geteuid())
	ents, err := entries(dir)
	if err != nil {
		cd.remove()
		return nil, fmt.Errorf("image directory %s: %w", path, err)
	}
	dfd, sfd := int(dir.Fd()), int(cd.stage.Fd())
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".gpucr-") || n == image.SubDir || n == dumpRecordName {
			continue // stages, gpucr's own files, the GPU image, the dump's record
		}
		if !regularOf(dfd, n, uid) {
			continue
		}
		if err := unix.Linkat(dfd, n, sfd, n, 0); err != nil {
			cd.remove()
			return nil, fmt.Errorf("image directory %s: cannot link %s into CRIU's private directory (gpucr restore needs a file system with hard links): %w",
				path, n, err)
		}
		// Linked is what counts: the name may have been swapped since the
		// look above.
		if !regularOf(sfd, n, uid) {
			_ = unix.Unlinkat(sfd, n, 0)
			continue
		}
		cd.linked[n] = true
	}
	if !cd.linked["inventory.img"] {
		cd.remove()
		return nil, inventoryProblem(dir, path, uid)
	}
	return cd, nil
}

// regularOf says whether name, in the directory open as dfd, is a regular
// file (not followed: a symlink is not) that belongs to uid.
func regularOf(dfd int, name string, uid uint32) bool {
	var st unix.Stat_t
	return unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Uid == uid
}

// inventoryProblem says why DIR's inventory.img is not one to restore.
func inventoryProblem(dir *os.File, path string, uid uint32) error {
	var st unix.Stat_t
	err := unix.Fstatat(int(dir.Fd()), "inventory.img", &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err != nil:
		var gst unix.Stat_t
		if unix.Fstatat(int(dir.Fd()), "gpucr", &gst, unix.AT_SYMLINK_NOFOLLOW) == nil && gst.Mode&unix.S_IFMT == unix.S_IFDIR {
			return fmt.Errorf("image directory %s holds a GPU-only image (`gpucr checkpoint --gpu-only`), not a whole process: "+
				"gpucr restore needs CRIU's images too. A process that checkpoint left waiting gets this memory back with "+
				"`gpucr resume PID`; `gpucr image inspect %s` describes it", path, path)
		}
		return fmt.Errorf("image directory %s holds no CRIU images (no inventory.img): not the directory of a `gpucr checkpoint`, or that checkpoint failed", path)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("image directory %s: inventory.img is not a regular file", path)
	}
	return fmt.Errorf("image directory %s: inventory.img belongs to uid %d, not to uid %d, who restores: CRIU's images are restored only as the user who wrote them",
		path, st.Uid, uid)
}

// publish moves a successful dump's images from the stage into DIR, each
// replacing whatever DIR held under its name. What cannot be moved stays in
// the stage, which is kept then; the error says where.
func (cd *criuDir) publish() error {
	ents, err := entries(cd.stage)
	if err != nil {
		return fmt.Errorf("CRIU's images in %s: %w", cd.stage.Name(), err)
	}
	var errs []error
	for _, e := range ents {
		if err := makePrivate(cd.stage, e.Name()); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
			continue
		}
		if err := unix.Renameat(int(cd.stage.Fd()), e.Name(), int(cd.dir.Fd()), e.Name()); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
		}
	}
	if len(errs) > 0 {
		cd.keep()
		return fmt.Errorf("CRIU's images could not all be moved into %s; they are in %s: %w", cd.path, cd.stage.Name(), errors.Join(errs...))
	}
	return nil
}

// keepNew moves the files a restore made in the stage (its statistics)
// into DIR.
func (cd *criuDir) keepNew() {
	ents, _ := entries(cd.stage)
	for _, e := range ents {
		if !cd.linked[e.Name()] && makePrivate(cd.stage, e.Name()) == nil {
			_ = unix.Renameat(int(cd.stage.Fd()), e.Name(), int(cd.dir.Fd()), e.Name())
		}
	}
}

// makePrivate gives name, a file or directory CRIU made in the stage, the
// GPU image's modes (files 0600, directories 0700) before it goes into DIR:
// CRIU creates its images 0644, and DIR may be a directory others can
// enter, where pages-*.img would show them the process's memory. It is
// changed through a descriptor of what was opened, not followed: anything
// but a file or a directory is refused (CRIU makes nothing else).
func makePrivate(stage *os.File, name string) error {
	fd, err := unix.Openat(int(stage.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("making it private: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("making it private: %w", err)
	}
	mode := uint32(0o600)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		mode = 0o700
	default:
		return fmt.Errorf("not a file or a directory (mode %o)", st.Mode)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("making it private: %w", err)
	}
	return nil
}

// keep leaves the stage in place (remove does nothing then).
func (cd *criuDir) keep() { cd.name = "" }

// remove empties and removes the stage (a dump that failed: its partial
// images; a restore: its links), unless kept.
func (cd *criuDir) remove() {
	if cd == nil || cd.stage == nil {
		return
	}
	defer func() { cd.stage.Close(); cd.stage = nil }()
	if cd.name == "" {
		return
	}
	ents, _ := entries(cd.stage)
	for _, e := range ents {
		_ = unix.Unlinkat(int(cd.stage.Fd()), e.Name(), 0)
	}
	// By name in DIR, which others may write: only if it is still ours.
	var st unix.Stat_t
	if unix.Fstatat(int(cd.dir.Fd()), cd.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Ino == cd.ino {
		_ = unix.Unlinkat(int(cd.dir.Fd()), cd.name, unix.AT_REMOVEDIR)
	}
}

// placeFile copies the file at src (CRIU's log or statistics, in the private
// directory) into DIR as name: written under a new name there, then renamed
// over name, so that nothing DIR held under that name (a symlink, a FIFO) is
// followed or opened. The copy is the caller's, 0600. A missing src is an
// fs.ErrNotExist.
func placeFile(dir *os.File, path, src, name string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	tmp := ".gpucr-log-" + hex.EncodeToString(b[:])
	fd, err := unix.Openat(int(dir.Fd()), tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(path, name), err)
	}
	out := os.NewFile(uintptr(fd), filepath.Join(path, tmp))
	_, err = io.Copy(out, in)
	err = errors.Join(err, out.Close())
	if err == nil {
		err = unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), name)
	}
	if err != nil {
		_ = unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return fmt.Errorf("%s: %w", filepath.Join(path, name), err)
	}
	return nil
}
