package image

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The newest committed image of a series is the parent of the next one:
// unfinished, pruned, damaged and foreign directories are passed over, and
// so is the directory the next image goes into.
func TestLatestOfSeries(t *testing.T) {
	base := t.TempDir()
	if got, err := Latest(base, filepath.Join(base, "1")); err != nil || got != "" {
		t.Fatalf("empty series: %q, %v", got, err)
	}
	at := func(name string, when time.Time) string {
		dir := filepath.Join(base, name)
		w, err := Create(dir, Origin{Host: "h", Time: when}, Options{ChunkSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		bw, err := w.AddBuffer(BufferInfo{Address: 0x1000, Size: 4096})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bw.Write(fxRand(uint64(when.Unix()), 4096)); err != nil {
			t.Fatal(err)
		}
		if err := bw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	at("1", t0)
	two := at("2", t0.Add(time.Minute))
	at("10", t0.Add(30*time.Second)) // sorts after "1", taken before "2"
	if got, _ := Latest(base, filepath.Join(base, "3")); got != two {
		t.Fatalf("latest %q, want %q", got, two)
	}
	// The directory being written is never its own parent.
	if got, _ := Latest(base, two); got != filepath.Join(base, "10") {
		t.Fatalf("latest skipping 2: %q", got)
	}
	// A newer image whose manifest is damaged, an unfinished write and a
	// plain directory are passed over.
	bad := at("4", t0.Add(time.Hour))
	m := filepath.Join(bad, SubDir, manifestName)
	b, err := os.ReadFile(m)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(m, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(base, "5", SubDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "notes"), 0o700); err != nil {
		t.Fatal(err)
	}
	if got, _ := Latest(base, filepath.Join(base, "6")); got != two {
		t.Fatalf("latest with damaged and unfinished ones: %q, want %q", got, two)
	}
	if got, err := Latest(filepath.Join(base, "missing"), ""); err != nil || got != "" {
		t.Fatalf("a series not started yet: %q, %v", got, err)
	}
	if _, err := Latest(filepath.Join(base, "2", SubDir, manifestName), ""); err == nil {
		t.Fatal("a file taken for a series directory is no error")
	}
}
