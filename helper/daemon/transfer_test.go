package daemon

import (
	"errors"
	"slices"
	"testing"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

func TestTransferLog(t *testing.T) {
	var l transferLog
	dir := t.TempDir()
	tr := l.begin(dir+"/", true, 100, []int64{7})
	tr.progress(60)
	tr.progress(40) // a slower lane's older count must not lower it
	got := l.snapshot(dir, 0)
	if len(got) != 1 || got[0].BytesDone != 60 || got[0].Finished || got[0].Direction != helperpb.Transfer_DIRECTION_DUMP ||
		got[0].ImageDir != dir || got[0].Pids[0] != 7 {
		t.Fatalf("running transfer: %+v", got)
	}
	tr.progress(100)
	tr.finish(errors.New("disk full"))
	if got = l.snapshot("", 0); len(got) != 1 || !got[0].Finished || got[0].Error != "disk full" || got[0].BytesDone != 100 {
		t.Fatalf("finished transfer: %+v", got)
	}
	if got = l.snapshot(t.TempDir(), 0); len(got) != 0 {
		t.Fatalf("another directory's transfers: %+v", got)
	}
	// Only the last keepFinished finished ones are kept; running ones stay.
	running := l.begin(dir, false, 1, nil)
	for i := 0; i < 2*keepFinished; i++ {
		l.begin(dir, false, 1, nil).finish(nil)
	}
	got = l.snapshot(dir, 0)
	if len(got) != keepFinished+2 { // one more finished than kept: trimmed at the next begin
		t.Fatalf("%d transfers kept", len(got))
	}
	found := false
	for _, x := range got {
		found = found || (!x.Finished && x.Direction == helperpb.Transfer_DIRECTION_LOAD)
	}
	if !found {
		t.Error("the running transfer was dropped")
	}
	_ = running
}

// A user sees only the transfers it asked for; root sees all.
func TestTransferLogPerUser(t *testing.T) {
	var l transferLog
	a, b := t.TempDir(), t.TempDir()
	l.beginFor(1001, a, true, 1, []int64{11})
	l.beginFor(1002, b, true, 1, []int64{12})
	l.begin(a, false, 1, []int64{13}) // a restore: root's
	for _, tc := range []struct {
		uid  uint32
		dir  string
		pids []int64
	}{
		{1001, "", []int64{11}}, {1002, "", []int64{12}}, {1001, b, nil}, {1003, "", nil},
		{0, "", []int64{11, 12, 13}}, {0, a, []int64{11, 13}},
	} {
		var pids []int64
		for _, x := range l.snapshot(tc.dir, tc.uid) {
			pids = append(pids, x.Pids...)
		}
		if !slices.Equal(pids, tc.pids) {
			t.Errorf("uid %d, dir %q: transfers of pids %v, want %v", tc.uid, tc.dir, pids, tc.pids)
		}
	}
}
