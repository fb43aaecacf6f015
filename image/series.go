package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Latest finds the newest restorable image among the subdirectories of
// base, a series of checkpoints such as base/1, base/2, ... (the parent an
// incremental checkpoint of the series takes: `gpucr checkpoint
// --auto-parent`). skip names a directory not to take (the one the next
// image goes into). An image counts if its manifest is committed and
// valid and it can be read by itself: not pruned by gc, every ancestor its
// chunks are in still there (the image it was written against), every
// chunk file there with its size. So an image that lost an ancestor (an
// image written before images were self-contained, whose ancestor was
// deleted) or chunk files is passed over for the newest one that has not.
// The newest is the one taken last (the manifest's origin time), ties
// broken by name. It returns "" when base holds none or does not exist yet.
func Latest(base, skip string) (string, error) { return latest(base, skip, nil) }

// LatestOwned is Latest among the images of one user: the caller (for root:
// the owner of base itself, as base is seen, a symlink's own owner). In a
// series directory others may write (a shared 1777 one), another user's
// newer image is not taken, nor is base reached through another user's
// symlink (ErrOwner).
func LatestOwned(base, skip string) (string, error) {
	uid, err := pathOwner(base)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("image series %s: %w", base, err)
	}
	real, err := ownedPath(base, uid)
	if err != nil {
		return "", fmt.Errorf("image series %s: %w", base, err)
	}
	return latest(real, skip, &Owner{UID: uid})
}

// latest is Latest of own's images (nil: anyone's).
func latest(base, skip string, own *Owner) (string, error) {
	cands, err := committed(base, skip, own)
	if err != nil {
		return "", err
	}
	// Only as many are opened as are found broken.
	for _, c := range cands {
		if readable(c.Dir, own) {
			return c.Dir, nil
		}
	}
	return "", nil
}

// SeriesImage is one committed image of a series directory.
type SeriesImage struct {
	Dir string
	// Taken: when the checkpoint was taken (its manifest's origin time).
	Taken time.Time
}

// SeriesOwned lists the committed, unpruned images among base's
// subdirectories, newest first, of one user as LatestOwned takes them.
func SeriesOwned(base string) ([]SeriesImage, error) {
	uid, err := pathOwner(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image series %s: %w", base, err)
	}
	real, err := ownedPath(base, uid)
	if err != nil {
		return nil, fmt.Errorf("image series %s: %w", base, err)
	}
	return committed(real, "", &Owner{UID: uid})
}

// committed is base's committed images (of own's, if set), but skip, newest
// first; a tie in time goes to the later name.
func committed(base, skip string, own *Owner) ([]SeriesImage, error) {
	entries, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // the series starts here
	}
	if err != nil {
		return nil, fmt.Errorf("image series %s: %w", base, err)
	}
	skipReal := ""
	if skip != "" {
		skipReal, _ = realDir(skip)
	}
	var cands []SeriesImage
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(base, e.Name())
		if real, err := realDir(dir); err != nil || real == skipReal {
			continue
		}
		if t, ok := committedAt(dir, own); ok {
			cands = append(cands, SeriesImage{dir, t})
		}
	}
	sort.Slice(cands, func(a, b int) bool {
		if !cands[a].Taken.Equal(cands[b].Taken) {
			return cands[a].Taken.After(cands[b].Taken)
		}
		return cands[a].Dir > cands[b].Dir // the same folder: the later name
	})
	return cands, nil
}

// readable says whether the image in dir opens (its ancestors resolve) and
// has every chunk file it names.
func readable(dir string, own *Owner) bool {
	im, err := openImage(dir, ReadOptions{Owner: own}, false, own)
	if err != nil {
		return false
	}
	defer im.Close()
	return im.CheckFiles() == nil
}

// committedAt is when the image in dir was taken, if it has a valid,
// unpruned manifest (of own's, if set).
func committedAt(dir string, own *Owner) (time.Time, bool) {
	top, err := openDirPath(dir)
	if err != nil {
		return time.Time{}, false
	}
	defer top.close()
	g, err := openSubDir(top, own)
	if err != nil {
		return time.Time{}, false
	}
	defer g.close()
	m, err := loadManifestAt(g, own)
	if err != nil || m.GetPruned() {
		return time.Time{}, false
	}
	return time.Unix(0, m.GetOrigin().GetTimeUnixNano()), true
}
