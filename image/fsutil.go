package image

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// syncFS flushes the whole file system holding d in one call: cheaper than
// an fsync per chunk file, which would put a device flush on the hot path of
// every 4 MiB written. Since Linux 5.8 it also reports writeback errors.
func syncFS(d *fsDir) error {
	if err := unix.Syncfs(d.fd()); err != nil {
		return fmt.Errorf("syncfs %s: %w", d.path, err)
	}
	return nil
}

// openLock opens DIR/gpucr/.lock, made (0600, given to own) if missing. A
// lock file that is there must be a regular file of own's.
func openLock(g *fsDir, own *Owner) (*os.File, error) {
	f, err := g.create(lockName, unix.O_RDWR, own)
	if errors.Is(err, fs.ErrExist) {
		f, err = g.openFile(lockName, unix.O_RDWR, own)
	}
	return f, err
}

// lockDir takes DIR/gpucr/.lock exclusively, without waiting: two writers (or
// a writer and gc) on one image directory would remove each other's files.
// The lock goes with the returned file.
func lockDir(g *fsDir, own *Owner) (*os.File, error) {
	path := g.join(lockName)
	for tries := 0; ; tries++ {
		f, err := openLock(g, own)
		if err != nil {
			return nil, lockError(path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("%s: %w (another writer or gc holds %s)", g.path, ErrBusy, path)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if lockStillNamed(g, f) {
			return f, nil
		}
		f.Close() // removed (or replaced) while it was locked: lock the one there now
		if tries == 2 {
			return nil, fmt.Errorf("%s: %w (%s is replaced again and again)", g.path, ErrBusy, path)
		}
	}
}

// lockStillNamed says whether the lock file f is still DIR/gpucr/.lock: a
// lock taken on a file the name no longer leads to (removed by whoever held
// it last, an unfinished write's leftovers being cleaned up) excludes
// nobody who opens the name now.
func lockStillNamed(g *fsDir, f *os.File) bool {
	id, err := idOf(f)
	if err != nil {
		return false
	}
	st, err := g.lstat(lockName)
	return err == nil && (fileID{uint64(st.Dev), st.Ino}) == id
}

// lockShared takes DIR/gpucr/.lock shared, without waiting: a Writer holds
// it on the ancestors whose chunk files its new image refers to, so that gc
// (which takes it exclusively) cannot delete them before the new image is
// committed and names them. An ancestor on read-only storage without a lock
// file cannot be gc'd either, and is not locked.
func lockShared(g *fsDir, own *Owner) (*os.File, error) {
	for tries := 0; ; tries++ {
		f, err := lockSharedOnce(g, own)
		if f == nil || err != nil || lockStillNamed(g, f) {
			return f, err
		}
		f.Close() // removed (or replaced) while it was locked: lock the one there now
		if tries == 2 {
			return nil, fmt.Errorf("%s: %w (%s is replaced again and again)", g.path, ErrBusy, g.join(lockName))
		}
	}
}

// lockSharedOnce is lockShared's one attempt.
func lockSharedOnce(g *fsDir, own *Owner) (*os.File, error) {
	path := g.join(lockName)
	f, err := openLock(g, own)
	if err != nil {
		var fte *FileTypeError
		var oe *OwnerError
		if errors.As(err, &fte) || errors.As(err, &oe) {
			return nil, lockError(path, err)
		}
		if f, err = g.openFile(lockName, unix.O_RDONLY, own); err != nil {
			if errors.As(err, &fte) || errors.As(err, &oe) {
				return nil, lockError(path, err)
			}
			return nil, nil
		}
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w (gc or a writer holds %s)", g.path, ErrBusy, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// lockError says that the lock file path could not be used; err names it
// already when it is about what the file is or whose.
func lockError(path string, err error) error {
	var fte *FileTypeError
	var oe *OwnerError
	if errors.As(err, &fte) || errors.As(err, &oe) {
		return fmt.Errorf("lock: %w", err)
	}
	return fmt.Errorf("lock %s: %w", path, err)
}

// tmpName returns a fresh temporary name; tag says what it is for.
func tmpName(tag string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return tmpPrefix + tag + "-" + hex.EncodeToString(b[:])
}

// removeTemps removes every leftover temporary file in g (gc only: a Writer
// removes its own temporary files and nothing else), returning the paths
// removed (or, when dryRun, that would be). Only regular files are
// candidates; unlinkat never follows a symlink.
func removeTemps(g *fsDir, dryRun bool) ([]string, int64, error) {
	ents, err := readDir(g)
	if err != nil {
		return nil, 0, err
	}
	var names []string
	var size int64
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), tmpPrefix) || !e.Type().IsRegular() {
			continue
		}
		p := g.join(e.Name())
		if info, err := e.Info(); err == nil {
			size += info.Size()
		}
		if !dryRun {
			if err := unix.Unlinkat(g.fd(), e.Name(), 0); err != nil && err != unix.ENOENT {
				errs = append(errs, &fs.PathError{Op: "remove", Path: p, Err: err})
				continue
			}
		}
		names = append(names, p)
	}
	return names, size, errors.Join(errs...)
}

// readDir lists d (through a descriptor of its own: d's offset is untouched).
func readDir(d *fsDir) ([]fs.DirEntry, error) {
	f, err := d.open(".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("read directory %s: %w", d.path, err)
	}
	return ents, nil
}

// writeFileAtomic puts data at name in g so that it holds either its old
// content or all of data after a crash: temporary file (0600, given to own),
// fsync, rename, fsync of the directory. renamed says whether name now
// shows data (so an error after it is about durability only, and the
// caller must not undo what the new content refers to).
func writeFileAtomic(g *fsDir, name string, data []byte, own *Owner) (renamed bool, err error) {
	_, renamed, err = writeFileAtomicID(g, name, data, own)
	return renamed, err
}

// writeFileAtomicID is writeFileAtomic that also says which file name is
// now (for removeOwn).
func writeFileAtomicID(g *fsDir, name string, data []byte, own *Owner) (id fileID, renamed bool, err error) {
	path := g.join(name)
	tmp := tmpName("manifest")
	f, err := g.create(tmp, unix.O_WRONLY, own)
	if err != nil {
		return id, false, fmt.Errorf("write %s: %w", path, err)
	}
	id, err = idOf(f)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = g.rename(tmp, g, name)
	}
	if err != nil {
		_ = g.removeOwn(tmp, id)
		return id, false, fmt.Errorf("write %s: %w", path, err)
	}
	return id, true, g.sync()
}
