package checkpoint

import (
	"slices"
	"strings"
	"testing"
)

// TestRestorableOrder: a connection with bytes left unsent one way can be
// restored (its receiver's part first); one with unsent bytes in both
// directions, or a sender whose receiver sends so to a third part, cannot,
// and the error names both hosts. The record's parts split into those
// made first and the senders.
func TestRestorableOrder(t *testing.T) {
	ab := JobConn{Local: "10.0.0.1:29500", Remote: "10.0.0.2:40000"}
	bc := JobConn{Local: "10.0.0.2:41000", Remote: "10.0.0.3:29600"}
	// parts a, b, c; unsent lists each one's connections dumped with unsent bytes
	parts := func(unsent ...[]JobConn) []JobRecordPart {
		ps := []JobRecordPart{{Host: "a", Conns: []JobConn{ab}}, {Host: "b", Conns: []JobConn{ab.Peer(), bc}}, {Host: "c", Conns: []JobConn{bc.Peer()}}}
		for i := range ps {
			ps[i].Unsent = unsent[i]
		}
		return ps
	}
	if err := restorableOrder(parts(nil, []JobConn{ab.Peer()}, nil)); err != nil {
		t.Errorf("b sends unsent bytes to a: %v", err)
	}
	err := restorableOrder(parts([]JobConn{ab}, []JobConn{ab.Peer()}, nil))
	if err == nil || !strings.Contains(err.Error(), "a's connection") || !strings.Contains(err.Error(), "(b)") {
		t.Errorf("unsent both ways between a and b: %v", err)
	}
	if err := restorableOrder(parts(nil, []JobConn{bc}, []JobConn{bc.Peer()})); err == nil {
		t.Errorf("unsent both ways between b and c: no error")
	}
	if err := restorableOrder(parts([]JobConn{ab}, []JobConn{bc}, nil)); err == nil {
		t.Errorf("a sends to b, which sends to c: no error")
	}
	rec := func(part int, unsent []JobConn) *JobRecord {
		r := &JobRecord{ID: "x", Part: part, Parts: make([]JobRecordPart, 3)}
		r.Parts[part].Unsent = unsent
		return r
	}
	first, then := restorePhases([]*JobRecord{rec(2, nil), rec(1, []JobConn{ab.Peer()}), rec(0, nil)})
	if !slices.Equal(first, []int{0, 2}) || !slices.Equal(then, []int{1}) {
		t.Errorf("phases %v then %v, want [0 2] then [1]", first, then)
	}
}
