package checkpoint

// CRIU's own statistics of a dump or a restore (the stats-dump and
// stats-restore files it writes into the image directory): how long it
// froze the tree and wrote its memory, how long it forked and restored the
// tasks, and how many pages. They say where a checkpoint's stop and a
// restore's seconds go on the CPU side.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/stats"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// CRIUDumpStats is CRIU's account of a dump (times in seconds).
type CRIUDumpStats struct {
	// FreezingSeconds: stopping the tree; FrozenSeconds: how long it stayed
	// frozen (CRIU's whole dump, the plugin's GPU steps included).
	FreezingSeconds float64 `json:"freezing_seconds"`
	FrozenSeconds   float64 `json:"frozen_seconds"`
	// MemdumpSeconds: collecting the tree's memory; MemwriteSeconds:
	// writing it into the image.
	MemdumpSeconds  float64 `json:"memdump_seconds"`
	MemwriteSeconds float64 `json:"memwrite_seconds"`
	PagesScanned    uint64  `json:"pages_scanned"`
	PagesWritten    uint64  `json:"pages_written"`
}

// CRIURestoreStats is CRIU's account of a restore (times in seconds).
type CRIURestoreStats struct {
	// ForkingSeconds: making the tasks; RestoreSeconds: from then until
	// they were restored (their memory read back included).
	ForkingSeconds float64 `json:"forking_seconds"`
	RestoreSeconds float64 `json:"restore_seconds"`
	PagesRestored  uint64  `json:"pages_restored"`
}

// maxStatsFile bounds a statistics file (a few dozen bytes).
const maxStatsFile = 64 << 10

// The layout of a statistics file, as CRIU writes it (criu/include/magic.h,
// criu/stats.c): two magics, the entry's size, then the entry.
const (
	statsDump       = "stats-dump"
	statsRestore    = "stats-restore"
	imgServiceMagic = 0x55105940 // "Zlatoust"
	statsMagic      = 0x57093306 // "Ostashkov"
	statsHeader     = 12
)

// readCRIUStats reads the statistics file name in dir, if it was written
// since since (an older one is another run's). The directory is the user's:
// nothing is followed, a non-regular file is refused without being read,
// and a short or damaged file is an error, not a crash.
func readCRIUStats(dir, name string, since time.Time) (*stats.StatsEntry, error) {
	path := filepath.Join(dir, name)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > maxStatsFile {
		return nil, fmt.Errorf("%s: not a CRIU statistics file (%v, %d bytes)", path, fi.Mode().Type(), fi.Size())
	}
	if fi.ModTime().Before(since) {
		return nil, fmt.Errorf("%s: written before this run (%v)", path, fi.ModTime())
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	le := binary.LittleEndian
	if len(b) < statsHeader || le.Uint32(b) != imgServiceMagic || le.Uint32(b[4:]) != statsMagic {
		return nil, fmt.Errorf("%s: %w", path, errNotStats)
	}
	n := uint64(le.Uint32(b[8:]))
	if n > uint64(len(b)-statsHeader) {
		return nil, fmt.Errorf("%s: %w (entry of %d bytes, %d there)", path, errNotStats, n, len(b)-statsHeader)
	}
	st := &stats.StatsEntry{}
	if err := proto.Unmarshal(b[statsHeader:statsHeader+int(n)], st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

var errNotStats = errors.New("not a CRIU statistics file")

func usToSeconds(us uint32) float64 { return float64(us) / 1e6 }

// dumpStats is CRIU's account of the dump into dir begun at since (nil:
// none).
func dumpStats(dir string, since time.Time) *CRIUDumpStats {
	st, err := readCRIUStats(dir, statsDump, since)
	if err != nil || st.GetDump() == nil {
		return nil
	}
	d := st.GetDump()
	return &CRIUDumpStats{FreezingSeconds: usToSeconds(d.GetFreezingTime()), FrozenSeconds: usToSeconds(d.GetFrozenTime()),
		MemdumpSeconds: usToSeconds(d.GetMemdumpTime()), MemwriteSeconds: usToSeconds(d.GetMemwriteTime()),
		PagesScanned: d.GetPagesScanned(), PagesWritten: d.GetPagesWritten()}
}

// restoreStats is CRIU's account of the restore from dir begun at since
// (nil: none).
func restoreStats(dir string, since time.Time) *CRIURestoreStats {
	st, err := readCRIUStats(dir, statsRestore, since)
	if err != nil || st.GetRestore() == nil {
		return nil
	}
	r := st.GetRestore()
	return &CRIURestoreStats{ForkingSeconds: usToSeconds(r.GetForkingTime()), RestoreSeconds: usToSeconds(r.GetRestoreTime()),
		PagesRestored: r.GetPagesRestored()}
}
