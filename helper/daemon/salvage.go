package daemon

// Salvaged chunks: a concurrent checkpoint whose copy-on-write window found
// memory changed behind its back makes no image, and is taken again at
// once with the process stopped (the caller does that: the CLI, the
// library). Every chunk the window did save is sound (checked against the
// quiesce point), so the dropped image keeps its chunk files
// (image.Writer.AbortSalvage), and the next image written into the same
// directory reuses them where the memory still hashes the same: the
// checkpoint taken again copies only what changed.

import (
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// salvageKeep is how long a salvage waits for the checkpoint taken again
// before its files are removed.
const salvageKeep = 10 * time.Minute

type salvageKey struct{ dev, ino uint64 }

type salvageEntry struct {
	sv   *image.Salvage
	kept time.Time
}

// isChangedWindow says whether err (a background copy's, possibly joined
// with others) is a copy-on-write window that found memory changed.
func isChangedWindow(err error) bool {
	var se stepErr
	return errors.As(err, &se) && se.code == helperpb.ErrorCode_ERROR_CHANGED
}

// salvages are the chunk files of dropped concurrent checkpoints, kept by
// the directory (device and inode) they were written into until the
// checkpoint taken again there takes them, or salvageKeep passes. It has
// its own lock: nothing else is read or written with it.
type salvages struct {
	log  *zap.Logger
	mu   sync.Mutex
	kept map[salvageKey]salvageEntry
}

func newSalvages(log *zap.Logger) *salvages {
	return &salvages{log: log, kept: map[salvageKey]salvageEntry{}}
}

// keep drops w, keeping its chunk files for the next image written into
// its directory.
func (v *salvages) keep(w *image.Writer) {
	sv, err := w.AbortSalvage()
	if err != nil {
		v.log.Warn("dropping the image of a window that found memory changed", zap.String("image", w.Dir()), zap.Error(err))
	}
	if sv == nil {
		return
	}
	dev, ino := sv.Dir()
	v.mu.Lock()
	old := v.kept[salvageKey{dev, ino}]
	v.kept[salvageKey{dev, ino}] = salvageEntry{sv, time.Now()}
	expired := v.expiredLocked()
	v.mu.Unlock()
	v.discard(append(expired, old.sv)...)
	v.log.Info("kept the chunks a dropped concurrent checkpoint saved, for the checkpoint taken again",
		zap.String("image", w.Dir()), zap.Int("chunks", sv.Chunks()), zap.Int64("bytes", sv.Bytes()))
}

// take hands the salvage of the directory dev/ino over, if one is kept
// (nil: none).
func (v *salvages) take(dev, ino uint64) *image.Salvage {
	v.mu.Lock()
	expired := v.expiredLocked()
	e := v.kept[salvageKey{dev, ino}]
	delete(v.kept, salvageKey{dev, ino})
	v.mu.Unlock()
	v.discard(expired...)
	return e.sv
}

// expiredLocked removes and returns the salvages kept too long.
func (v *salvages) expiredLocked() []*image.Salvage {
	var out []*image.Salvage
	for k, e := range v.kept {
		if time.Since(e.kept) > salvageKeep {
			out = append(out, e.sv)
			delete(v.kept, k)
		}
	}
	return out
}

// dropAll removes every salvage kept (the helper stops).
func (v *salvages) dropAll() {
	v.mu.Lock()
	var all []*image.Salvage
	for _, e := range v.kept {
		all = append(all, e.sv)
	}
	v.kept = map[salvageKey]salvageEntry{}
	v.mu.Unlock()
	v.discard(all...)
}

// discard removes the files of svs (nil ones are none).
func (v *salvages) discard(svs ...*image.Salvage) {
	for _, sv := range svs {
		if err := sv.Discard(); err != nil {
			v.log.Warn("salvaged chunk files could not all be removed (gpucr image gc removes them)", zap.Error(err))
		}
	}
}
