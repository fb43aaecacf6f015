package daemon

import (
	"os"
	"testing"
)

// procStat reads this process's state and start time; a pid that is gone
// is an error.
func TestProcStat(t *testing.T) {
	ps, err := procStat(int32(os.Getpid()))
	if err != nil || !ps.alive() || ps.start == 0 {
		t.Fatalf("procStat(self) = %+v, %v", ps, err)
	}
	if _, err := procStat(1 << 30); err == nil {
		t.Error("procStat of a pid that cannot exist succeeded")
	}
}
