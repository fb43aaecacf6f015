package image

// Removing an image directory: how a series of checkpoints is rotated
// (`gpucr image rm`, for a user who keeps the last N). An image written
// self-contained (Options.SelfContained: all of gpucr's) holds hard links
// of the chunk files it shares with its ancestors, so removing any image
// of a series leaves the others restorable, and frees what no other image
// links. Remove is rm -rf made safe for that:
//
//   - it removes only an image directory (CRIU's images or a GPU image in
//     it), whole, beneath descriptors, following no symlink and crossing
//     no mount;
//   - not while the image is restored (LockImage), written, collected or
//     read as a parent by a checkpoint being written (DIR/gpucr/.lock);
//   - not while another image of its series (a sibling directory) still
//     reads chunks from it (an image written before images were
//     self-contained, or by a library caller without SelfContained): that
//     one would lose them;
//   - confined like gc: as root, only an image of the user the path
//     belongs to, reached through no other user's symlink.

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// RemoveOptions are Remove's settings.
type RemoveOptions struct {
	// Confined: as GCOptions.Confined; the image directory must belong to
	// the owner of the path (the caller, for a process other than root).
	Confined bool
	// DryRun: only check and count, remove nothing.
	DryRun bool
}

// RemoveReport says what Remove removed (or, dry run, would remove).
type RemoveReport struct {
	Dir   string // resolved
	Files int
	// BytesFreed: regular files no other image links; BytesShared: those
	// other images still link (the chunks a series shares), which stay.
	BytesFreed, BytesShared int64
}

// DependentError: another image still reads chunks from the image to be
// removed.
type DependentError struct {
	Dir, Dependent string
}

func (e *DependentError) Error() string {
	return fmt.Sprintf("%s is not removed: the image in %s still reads chunks from it (it refers to its ancestors' chunk files, as images written before they were self-contained do); remove %s too, or keep both",
		e.Dir, e.Dependent, e.Dependent)
}

// Remove removes the image directory dir whole (see the file's comment).
// Nothing is removed when it refuses.
func Remove(dir string, opts RemoveOptions) (*RemoveReport, error) {
	real, own, err := removalTarget(dir, opts.Confined)
	if err != nil {
		return nil, err
	}
	parentPath, name := filepath.Split(real)
	if name == "" || parentPath == "" {
		return nil, fmt.Errorf("%s: not an image directory", dir)
	}
	pd, err := openDirPath(parentPath)
	if err != nil {
		return nil, err
	}
	defer pd.close()
	d, err := pd.openDir(name, own) // no symlink: real has none, and a swap since is refused
	if err != nil {
		return nil, err
	}
	defer d.close()
	rep := &RemoveReport{Dir: real}
	top, err := idOf(d.f)
	if err != nil {
		return nil, err
	}
	if err := isImageDir(d); err != nil {
		return nil, err
	}
	// Not while it is restored: the restore holds DIR's lock throughout.
	// LockImage wants a descriptor of its own (an flock goes with the open
	// file), which d is.
	if err := LockImage(d.f, real); err != nil {
		return nil, err
	}
	// Not while it is written or collected, or read as a parent by a
	// checkpoint being written (shared): DIR/gpucr/.lock.
	if g, err := d.openDir(SubDir, own); err == nil {
		lock, err := lockDir(g, own)
		g.close()
		if err != nil {
			return nil, fmt.Errorf("%s is not removed: %w", real, err)
		}
		defer lock.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if dep := dependentOf(pd, name, real, own); dep != "" {
		return nil, &DependentError{Dir: real, Dependent: dep}
	}
	if err := removeTree(d, top.dev, rep, opts.DryRun); err != nil {
		return rep, fmt.Errorf("remove %s: %w", real, err)
	}
	if opts.DryRun {
		return rep, nil
	}
	// The name must still be the directory emptied: rmdir removes only an
	// empty directory, so what a race could remove instead is an empty one.
	st, err := pd.lstat(name)
	if err != nil {
		return rep, err
	}
	if (fileID{uint64(st.Dev), st.Ino}) != top {
		return rep, fmt.Errorf("%s was replaced while it was removed: left as it is", real)
	}
	if err := unix.Unlinkat(pd.fd(), name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return rep, &fs.PathError{Op: "remove", Path: real, Err: err}
	}
	return rep, pd.sync()
}

// removalTarget resolves dir as gc does (confined: through no other user's
// symlink) and says whose it must be (nil: anyone's).
func removalTarget(dir string, confined bool) (string, *Owner, error) {
	if !confined {
		real, err := realDir(dir)
		return real, nil, err
	}
	uid, err := pathOwner(dir)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", dir, err)
	}
	real, err := ownedPath(dir, uid)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", dir, err)
	}
	return real, &Owner{UID: uid}, nil
}

// isImageDir refuses a directory that holds neither a GPU image (gpucr/)
// nor CRIU's images (inventory.img): Remove is not rm -rf of anything.
func isImageDir(d *fsDir) error {
	for _, n := range []string{SubDir, "inventory.img"} {
		if _, err := d.lstat(n); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s holds neither a GPU image (%s/) nor CRIU's images (inventory.img): not an image directory, not removed",
		d.path, SubDir)
}

// dependentOf finds an image among the siblings of real (the other images
// of its series, in pd) whose chunks are still read from real: one whose
// chain, as far as its chunks reach, goes through real. "" if none.
func dependentOf(pd *fsDir, name, real string, own *Owner) string {
	ents, err := readDir(pd)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		if !e.IsDir() || e.Name() == name {
			continue
		}
		sib := pd.join(e.Name())
		im, err := openImage(sib, ReadOptions{Owner: own}, true, own)
		if err != nil {
			continue // no image, or one that cannot be read anyway
		}
		chain := im.Chain()
		im.Close()
		for _, c := range chain[1:] {
			if c == real {
				return sib
			}
		}
	}
	return ""
}

// removeTree removes everything d holds (as removeBeneath does), counting
// what it frees; with dryRun it only counts.
func removeTree(d *fsDir, dev uint64, rep *RemoveReport, dryRun bool) error {
	files := map[fileID]*linkCount{}
	err := removeTreeIn(d, dev, files, dryRun)
	// A file is freed once every name it has is removed: those of other
	// images (their shared chunks) keep it.
	for _, f := range files {
		rep.Files++
		if f.seen >= f.nlink {
			rep.BytesFreed += f.size
		} else {
			rep.BytesShared += f.size
		}
	}
	return err
}

type linkCount struct {
	size        int64
	nlink, seen uint64
}

// removeTreeIn empties d: each file unlinked and counted in files by
// identity (how many of its links were seen), each directory (on device
// dev: a mount is not crossed) emptied through its own descriptor and
// removed; with dryRun nothing is removed.
func removeTreeIn(d *fsDir, dev uint64, files map[fileID]*linkCount, dryRun bool) error {
	names, err := d.f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", d.path, err)
	}
	for _, name := range names {
		st, err := d.lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		flag := 0
		switch {
		case statMode(st.Mode).IsDir():
			if uint64(st.Dev) != dev {
				return fmt.Errorf("%s is on another file system (a mount): not removed", d.join(name))
			}
			sub, err := d.openDir(name, nil)
			if err != nil {
				return err
			}
			err = removeTreeIn(sub, dev, files, dryRun)
			sub.close()
			if err != nil {
				return err
			}
			flag = unix.AT_REMOVEDIR
		case st.Mode&unix.S_IFMT == unix.S_IFREG:
			id := fileID{uint64(st.Dev), st.Ino}
			f := files[id]
			if f == nil {
				f = &linkCount{size: st.Size, nlink: uint64(st.Nlink)}
				files[id] = f
			}
			f.seen++
		}
		if dryRun {
			continue
		}
		if err := unix.Unlinkat(d.fd(), name, flag); err != nil && err != unix.ENOENT {
			return &fs.PathError{Op: "remove", Path: d.join(name), Err: err}
		}
	}
	return nil
}

// ErrUnfinishedWaited: an unfinished image holds the part of a process that
// may still wait for its GPU memory in it (RemoveUnfinished).
var ErrUnfinishedWaited = errors.New("a process may still wait for its GPU memory in it")

// RemoveUnfinished removes the unfinished GPU image in dir (DIR/gpucr with
// no committed manifest: a write that died, or a dump whose helper died),
// unless a process may still wait for its memory in it: waits is asked of
// each process whose part the image holds (DIR/gpucr/parts: sealed before
// a process gives its memory up, removed by the helper that gives it back
// from it) and says whether that process may still wait (it runs, is the
// process the part names, and has not got its memory back). A part that
// cannot be read names nobody a helper could give anything back to. Not
// while a writer holds the image (it may still commit), and confined as
// Remove. Only DIR/gpucr goes; the rest of DIR stays.
func RemoveUnfinished(dir string, opts RemoveOptions, waits func(ProcessInfo) bool) (*RemoveReport, error) {
	real, own, err := removalTarget(dir, opts.Confined)
	if err != nil {
		return nil, err
	}
	top, err := openDirPath(real)
	if err != nil {
		return nil, err
	}
	defer top.close()
	g, err := openSubDir(top, own) // gpucr/ must be own's: it is what goes

	if err != nil {
		return nil, err
	}
	defer g.close()
	gid, err := idOf(g.f)
	if err != nil {
		return nil, err
	}
	lock, err := lockDir(g, own)
	if err != nil {
		return nil, fmt.Errorf("%s is not removed: %w", g.path, err)
	}
	defer lock.Close()
	if _, err := g.lstat(manifestName); err == nil {
		return nil, fmt.Errorf("%s holds a committed image: not an unfinished one", g.path)
	}
	if pd, err := g.openDir(partsName, own); err == nil {
		ents, err := readDir(pd)
		if err != nil {
			pd.close()
			return nil, err
		}
		for _, e := range ents {
			m, err := loadManifestFile(pd, e.Name(), own)
			if err != nil || len(m.GetProcesses()) != 1 {
				continue
			}
			p := m.GetProcesses()[0]
			pi := ProcessInfo{Pid: int(p.GetPid()), NsPid: int(p.GetNsPid()), StartTime: p.GetStartTime()}
			if waits(pi) {
				pd.close()
				return nil, fmt.Errorf("the unfinished image in %s is kept: pid %d may still wait for its GPU memory in it (its part is sealed there); the gpucr helper gives it back from it and then removes the part: start it if none runs: %w",
					g.path, pi.Pid, ErrUnfinishedWaited)
			}
		}
		pd.close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	rep := &RemoveReport{Dir: g.path}
	if err := removeTree(g, gid.dev, rep, opts.DryRun); err != nil {
		return rep, fmt.Errorf("remove %s: %w", g.path, err)
	}
	if opts.DryRun {
		return rep, nil
	}
	st, err := top.lstat(SubDir)
	if err != nil {
		return rep, err
	}
	if (fileID{uint64(st.Dev), st.Ino}) != gid {
		return rep, fmt.Errorf("%s was replaced while it was removed: left as it is", g.path)
	}
	if err := unix.Unlinkat(top.fd(), SubDir, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return rep, &fs.PathError{Op: "remove", Path: g.path, Err: err}
	}
	return rep, top.sync()
}
