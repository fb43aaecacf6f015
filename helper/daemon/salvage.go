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

// salvageImage drops w, keeping its chunk files for the next image written
// into its directory.
func (s *Server) salvageImage(w *image.Writer) {
	sv, err := w.AbortSalvage()
	if err != nil {
		s.log.Warn("dropping the image of a window that found memory changed", zap.String("image", w.Dir()), zap.Error(err))
	}
	if sv == nil {
		return
	}
	dev, ino := sv.Dir()
	s.mu.Lock()
	if s.salvage == nil {
		s.salvage = map[salvageKey]salvageEntry{}
	}
	old := s.salvage[salvageKey{dev, ino}]
	s.salvage[salvageKey{dev, ino}] = salvageEntry{sv, time.Now()}
	expired := s.expiredSalvageLocked()
	s.mu.Unlock()
	s.discardSalvage(append(expired, old.sv)...)
	s.log.Info("kept the chunks a dropped concurrent checkpoint saved, for the checkpoint taken again",
		zap.String("image", w.Dir()), zap.Int("chunks", sv.Chunks()), zap.Int64("bytes", sv.Bytes()))
}

// takeSalvage hands the salvage of the directory dev/ino over, if one is
// kept (nil: none).
func (s *Server) takeSalvage(dev, ino uint64) *image.Salvage {
	s.mu.Lock()
	expired := s.expiredSalvageLocked()
	e := s.salvage[salvageKey{dev, ino}]
	delete(s.salvage, salvageKey{dev, ino})
	s.mu.Unlock()
	s.discardSalvage(expired...)
	return e.sv
}

// expiredSalvageLocked removes and returns the salvages kept too long.
func (s *Server) expiredSalvageLocked() []*image.Salvage {
	var out []*image.Salvage
	for k, e := range s.salvage {
		if time.Since(e.kept) > salvageKeep {
			out = append(out, e.sv)
			delete(s.salvage, k)
		}
	}
	return out
}

// dropAllSalvage removes every salvage kept (the helper stops).
func (s *Server) dropAllSalvage() {
	s.mu.Lock()
	var all []*image.Salvage
	for _, e := range s.salvage {
		all = append(all, e.sv)
	}
	s.salvage = nil
	s.mu.Unlock()
	s.discardSalvage(all...)
}

func (s *Server) discardSalvage(svs ...*image.Salvage) {
	for _, sv := range svs {
		if err := sv.Discard(); err != nil {
			s.log.Warn("salvaged chunk files could not all be removed (gpucr image gc removes them)", zap.Error(err))
		}
	}
}
