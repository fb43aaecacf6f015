package image

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// fsyncDir makes the entries of dir (creations, renames, removals) durable.
func fsyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// syncFS flushes the whole file system holding dir in one call: cheaper than
// an fsync per chunk file, which would put a device flush on the hot path of
// every 4 MiB written. Since Linux 5.8 it also reports writeback errors.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// lockDir takes DIR/gpucr/.lock exclusively, without waiting: two writers (or
// a writer and gc) on one image directory would remove each other's files.
// The lock goes with the returned file.
func lockDir(gdir string) (*os.File, error) {
	path := filepath.Join(gdir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w (another writer or gc holds %s)", gdir, ErrBusy, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// lockShared takes DIR/gpucr/.lock shared, without waiting: a Writer holds
// it on the ancestors whose chunk files its new image refers to, so that gc
// (which takes it exclusively) cannot delete them before the new image is
// committed and names them. An ancestor on read-only storage without a lock
// file cannot be gc'd either, and is not locked.
func lockShared(gdir string) (*os.File, error) {
	path := filepath.Join(gdir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		if f, err = os.Open(path); err != nil {
			return nil, nil
		}
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w (gc or a writer holds %s)", gdir, ErrBusy, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// tmpName returns a fresh temporary name in gdir; tag says what it is for.
func tmpName(gdir, tag string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return filepath.Join(gdir, tmpPrefix+tag+"-"+hex.EncodeToString(b[:]))
}

// removeTemps removes every leftover temporary file in gdir, returning the
// names removed (or, when dryRun, that would be).
func removeTemps(gdir string, dryRun bool) ([]string, int64, error) {
	ents, err := os.ReadDir(gdir)
	if err != nil {
		return nil, 0, err
	}
	var names []string
	var size int64
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), tmpPrefix) || e.IsDir() {
			continue
		}
		p := filepath.Join(gdir, e.Name())
		if info, err := e.Info(); err == nil {
			size += info.Size()
		}
		if !dryRun {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
		}
		names = append(names, p)
	}
	return names, size, errors.Join(errs...)
}

// writeFileAtomic puts data at path so that path holds either its old
// content or all of data after a crash: temporary file, fsync, rename,
// fsync of the directory. renamed says whether path now shows data (so an
// error after it is about durability only, and the caller must not undo
// what the new content refers to).
func writeFileAtomic(path string, data []byte) (renamed bool, err error) {
	dir := filepath.Dir(path)
	tmp := tmpName(dir, "manifest")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return false, err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	return true, fsyncDir(dir)
}
