package checkpoint

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/stats"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// statsFile lays a statistics entry out as CRIU writes it.
func statsFile(t *testing.T, st *stats.StatsEntry) []byte {
	t.Helper()
	body, err := proto.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, statsHeader, statsHeader+len(body))
	binary.LittleEndian.PutUint32(b, imgServiceMagic)
	binary.LittleEndian.PutUint32(b[4:], statsMagic)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(body)))
	return append(b, body...)
}

// CRIU's statistics are read as it writes them; a damaged, foreign, stale
// or non-regular file gives none (and no crash, and no wait on a FIFO).
func TestCRIUStats(t *testing.T) {
	dir := t.TempDir()
	start := time.Now().Add(-time.Second)
	good := statsFile(t, &stats.StatsEntry{Restore: &stats.RestoreStatsEntry{PagesCompared: proto.Uint64(0),
		PagesSkippedCow: proto.Uint64(0), ForkingTime: proto.Uint32(1500), RestoreTime: proto.Uint32(820000),
		PagesRestored: proto.Uint64(4096)}})
	if err := os.WriteFile(filepath.Join(dir, statsRestore), good, 0o600); err != nil {
		t.Fatal(err)
	}
	r := restoreStats(dir, start)
	if r == nil || r.ForkingSeconds != 0.0015 || r.RestoreSeconds != 0.82 || r.PagesRestored != 4096 {
		t.Fatalf("restoreStats: %+v", r)
	}
	if r := restoreStats(dir, time.Now().Add(time.Hour)); r != nil {
		t.Errorf("a file written before the run: %+v, want none", r)
	}
	if d := dumpStats(dir, start); d != nil {
		t.Errorf("dumpStats with no stats-dump: %+v", d)
	}
	dump := statsFile(t, &stats.StatsEntry{Dump: &stats.DumpStatsEntry{FreezingTime: proto.Uint32(2000),
		FrozenTime: proto.Uint32(1200000), MemdumpTime: proto.Uint32(300000), MemwriteTime: proto.Uint32(250000),
		PagesScanned: proto.Uint64(9), PagesSkippedParent: proto.Uint64(0), PagesWritten: proto.Uint64(7),
		PagesLazy: proto.Uint64(0)}})
	if err := os.WriteFile(filepath.Join(dir, statsDump), dump, 0o600); err != nil {
		t.Fatal(err)
	}
	if d := dumpStats(dir, start); d == nil || d.FrozenSeconds != 1.2 || d.MemwriteSeconds != 0.25 || d.PagesWritten != 7 {
		t.Errorf("dumpStats: %+v", d)
	}
	for name, b := range map[string][]byte{
		"short":     good[:5],
		"magic":     append([]byte{1, 2, 3, 4}, good[4:]...),
		"too long":  append(append([]byte{}, good[:8]...), append([]byte{0xff, 0xff, 0, 0}, good[12:]...)...),
		"truncated": good[:len(good)-2],
	} {
		p := filepath.Join(dir, statsRestore)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if r := restoreStats(dir, start); r != nil {
			t.Errorf("%s file: %+v, want none", name, r)
		}
	}
	p := filepath.Join(dir, statsRestore)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan *CRIURestoreStats)
	go func() { done <- restoreStats(dir, start) }()
	select {
	case r := <-done:
		if r != nil {
			t.Errorf("a FIFO: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reading a FIFO named stats-restore blocked")
	}
}
