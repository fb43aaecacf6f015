package level

// Pruning a series' local images once they are safe at a level: after a
// drain (`gpucr checkpoint --drain URL --keep K`), the images of the series
// beyond its newest K go, each only if a finished drain of it is on record.

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gpucr/gpucr/image"
)

// Pruned is what PruneSeries did to one older image of the series.
type Pruned struct {
	Dir string `json:"images_dir"`
	// Removed, with BytesFreed; else Kept says why it stays.
	Removed    bool   `json:"removed"`
	BytesFreed int64  `json:"bytes_freed,omitempty"`
	Kept       string `json:"kept,omitempty"`
}

// PruneSeries removes the images of dir's series (the committed images
// beside dir of the caller's, or for root of the series directory's owner:
// those --auto-parent takes, image.SeriesOwned) past the newest keep, dir
// among them: each one that a drain recorded as done after the image was
// taken (a drain of the directory's earlier image does not count), unless
// an image that stays still reads its chunks. dir itself is never removed.
// Only the caller's drain records are read: a series is pruned by the user
// who drains it.
func PruneSeries(dir string, keep int) ([]Pruned, error) {
	if keep < 1 {
		return nil, fmt.Errorf("prune: keep %d images: at least the newest must stay", keep)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	series, err := image.SeriesOwned(filepath.Dir(abs))
	if err != nil {
		return nil, err
	}
	drains, err := Drains()
	if err != nil {
		return nil, err
	}
	self, _ := filepath.EvalSymlinks(abs)
	var out []Pruned
	kept := 0
	for _, s := range series {
		real, err := filepath.EvalSymlinks(s.Dir)
		if real == self || kept < keep {
			kept++
			continue
		}
		p := Pruned{Dir: s.Dir}
		if err != nil || !drained(drains, real, s.Taken) {
			p.Kept = "no finished drain of it is on record: it is on no level"
			out = append(out, p)
			continue
		}
		rep, err := image.Remove(s.Dir, image.RemoveOptions{Confined: true})
		var de *image.DependentError
		switch {
		case errors.As(err, &de):
			p.Kept = fmt.Sprintf("the image in %s still reads chunks from it", de.Dependent)
		case err != nil:
			p.Kept = err.Error()
		default:
			p.Removed, p.BytesFreed = true, rep.BytesFreed
		}
		out = append(out, p)
	}
	return out, nil
}

// drained: a drain of the image directory real (symlinks resolved)
// finished ("done") and started after its image was taken, so it pushed
// this image and not one the directory held before.
func drained(drains []Drain, real string, taken time.Time) bool {
	for _, d := range drains {
		if d.State != "done" || d.Started.Before(taken) {
			continue
		}
		if dr, err := filepath.EvalSymlinks(d.Dir); err == nil && dr == real {
			return true
		}
	}
	return false
}
