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
	entries, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil // the series starts here
	}
	if err != nil {
		return "", fmt.Errorf("image series %s: %w", base, err)
	}
	skipReal, _ := realDir(skip)
	type candidate struct {
		dir string
		t   time.Time
		i   int
	}
	var cands []candidate
	for i, e := range entries { // sorted by name
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(base, e.Name())
		if real, err := realDir(dir); err != nil || real == skipReal {
			continue
		}
		if t, ok := committedAt(dir, own); ok {
			cands = append(cands, candidate{dir, t, i})
		}
	}
	// Newest first; only as many are opened as are found broken.
	sort.Slice(cands, func(a, b int) bool {
		if !cands[a].t.Equal(cands[b].t) {
			return cands[a].t.After(cands[b].t)
		}
		return cands[a].i > cands[b].i
	})
	for _, c := range cands {
		if readable(c.dir, own) {
			return c.dir, nil
		}
	}
	return "", nil
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
