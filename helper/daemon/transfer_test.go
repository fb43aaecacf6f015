package daemon

import (
	"errors"
	"testing"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

func TestTransferLog(t *testing.T) {
	var l transferLog
	dir := t.TempDir()
	tr := l.begin(dir+"/", true, 100, []int64{7})
	tr.progress(60)
	tr.progress(40) // a slower lane's older count must not lower it
	got := l.snapshot(dir)
	if len(got) != 1 || got[0].BytesDone != 60 || got[0].Finished || got[0].Direction != helperpb.Transfer_DIRECTION_DUMP ||
		got[0].ImageDir != dir || got[0].Pids[0] != 7 {
		t.Fatalf("running transfer: %+v", got)
	}
	tr.progress(100)
	tr.finish(errors.New("disk full"))
	if got = l.snapshot(""); len(got) != 1 || !got[0].Finished || got[0].Error != "disk full" || got[0].BytesDone != 100 {
		t.Fatalf("finished transfer: %+v", got)
	}
	if got = l.snapshot(t.TempDir()); len(got) != 0 {
		t.Fatalf("another directory's transfers: %+v", got)
	}
	// Only the last keepFinished finished ones are kept; running ones stay.
	running := l.begin(dir, false, 1, nil)
	for i := 0; i < 2*keepFinished; i++ {
		l.begin(dir, false, 1, nil).finish(nil)
	}
	got = l.snapshot(dir)
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
