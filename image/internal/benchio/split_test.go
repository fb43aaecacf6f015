package benchio

import "testing"

func TestSplitAligned(t *testing.T) {
	got := SplitAligned(10<<20, 4, 4<<20) // 3 units over 4 parts: 3 ranges
	want := [][2]int{{0, 4 << 20}, {4 << 20, 8 << 20}, {8 << 20, 10 << 20}}
	if len(got) != len(want) {
		t.Fatalf("SplitAligned = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("SplitAligned = %v, want %v", got, want)
		}
	}
}
