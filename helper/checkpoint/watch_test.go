package checkpoint

import (
	"strings"
	"testing"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

func TestCombineTransfers(t *testing.T) {
	a := &helperpb.Transfer{BytesDone: 100, BytesTotal: 100, StartedUnixMs: 1000, ElapsedUs: 500_000, Finished: true, Pids: []int64{1},
		Direction: helperpb.Transfer_DIRECTION_DUMP, BytesMoved: 40}
	b := &helperpb.Transfer{BytesDone: 50, BytesTotal: 200, StartedUnixMs: 1200, ElapsedUs: 800_000, Pids: []int64{2}, Error: "disk full",
		Direction: helperpb.Transfer_DIRECTION_DUMP, BytesMoved: 2}
	c := combine([]*helperpb.Transfer{a, b})
	if c.BytesDone != 150 || c.BytesTotal != 300 || c.StartedUnixMs != 1000 || c.ElapsedUs != 1_000_000 ||
		c.Finished || len(c.Pids) != 2 || c.Error != "disk full" {
		t.Fatalf("combined: %+v", c)
	}
	g := gpuCopyOf(c)
	if line := g.String(); g.Bytes != 150 || g.BytesMoved != 42 || !strings.Contains(line, "42 B of it over PCIe") ||
		!strings.Contains(line, "failed: disk full") {
		t.Errorf("summary %+v / %q", g, line)
	}
	// Nothing is said of a parent image where none supplied a byte.
	full := gpuCopyOf(&helperpb.Transfer{BytesDone: 100, BytesMoved: 100, Finished: true, Direction: helperpb.Transfer_DIRECTION_DUMP})
	if strings.Contains(full.String(), "parent") {
		t.Errorf("full copy: %q", full.String())
	}
	if g := gpuCopyOf(nil); g != nil || g.String() != "" {
		t.Errorf("no copy: %+v %q", g, g.String())
	}
}
