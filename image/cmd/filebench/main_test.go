package main

import (
	"os"
	"strings"
	"testing"
)

// TestEveryWayRoundTrips: each way writes and reads back through its files
// at two thread counts, prints a row with both rates, and leaves nothing in
// the directory.
func TestEveryWayRoundTrips(t *testing.T) {
	dir := t.TempDir()
	var out, errOut strings.Builder
	ways := "files,falloc,big,bigfalloc,writev,mmap"
	if rc := run([]string{"-dir", dir, "-size", "24", "-chunk", "1", "-threads", "1,3", "-runs", "1", "-ways", ways}, &out, &errOut); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errOut.String())
	}
	for _, w := range strings.Split(ways, ",") {
		for _, n := range []string{"| 1 |", "| 3 |"} {
			row := "| " + w + " " + n
			i := strings.Index(out.String(), row)
			if i < 0 {
				t.Errorf("no row %q:\n%s", row, out.String())
				continue
			}
			line := out.String()[i:]
			line = line[:strings.IndexByte(line, '\n')]
			if strings.Count(line, ".") != 2 {
				t.Errorf("row without two rates: %s", line)
			}
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("%d entries left in the directory", len(left))
	}
	if rc := run([]string{"-dir", dir, "-ways", "nosuch"}, &out, &errOut); rc != 2 {
		t.Errorf("an unknown way: exit %d, want 2", rc)
	}
}
