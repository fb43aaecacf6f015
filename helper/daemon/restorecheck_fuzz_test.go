package daemon

import (
	"encoding/binary"
	"testing"
)

// FuzzRestoreMismatch feeds the check a restored process gets before it may
// run (matchRestored) with images that are well formed but changed against
// the process's record: buffers moved, shrunk, grown, dropped, added,
// duplicated. The check must accept exactly the images that give the process
// what it had, and refuse, with a reason, every other one.
func FuzzRestoreMismatch(f *testing.F) {
	f.Add([]byte{3, 0}, []byte{})                             // unchanged
	f.Add([]byte{4, 1}, []byte{0, 1, 0, 0, 0})                // moved
	f.Add([]byte{4, 1}, []byte{1, 2, 0, 0, 0})                // shrunk
	f.Add([]byte{5, 7}, []byte{3, 0, 0, 0, 0})                // dropped
	f.Add([]byte{2, 3}, []byte{4, 9, 1, 0, 0})                // added
	f.Add([]byte{6, 2}, []byte{5, 1, 0, 0, 0, 6, 2, 0, 0, 0}) // duplicated, then moved back
	f.Fuzz(func(t *testing.T, seed []byte, ops []byte) {
		if len(seed) < 2 {
			return
		}
		n := int(seed[0]%16) + 1
		// The process's allocations: disjoint, granular, in increasing order.
		had := make([]memSpan, n)
		addr := uint64(0x7f0000000000) + uint64(seed[1])<<21
		for i := range had {
			size := uint64(1+(int(seed[1])+i*7)%5) << 21
			had[i] = memSpan{addr, size}
			addr += size + 2<<21
		}
		got := append([]memSpan(nil), had...)
		// Each op: kind, index, and a 3-byte amount.
		for len(ops) >= 5 {
			kind, idx := ops[0]%7, int(ops[1])
			amount := uint64(binary.LittleEndian.Uint16(ops[2:4]))<<21 | uint64(ops[4])
			ops = ops[5:]
			if len(got) == 0 && kind != 4 {
				continue
			}
			i := 0
			if len(got) > 0 {
				i = idx % len(got)
			}
			switch kind {
			case 0: // move
				got[i].addr += amount
			case 1: // shrink
				if amount < got[i].size {
					got[i].size -= amount
				}
			case 2: // grow
				got[i].size += amount
			case 3: // drop
				got = append(got[:i], got[i+1:]...)
			case 4: // add one the process never had
				got = append(got, memSpan{0x100000000000 + amount, 2 << 21})
			case 5: // duplicate
				got = append(got, got[i])
			case 6: // move back to where the process had it
				if i < len(had) {
					got[i].addr = had[i].addr
				}
			}
		}
		err := matchRestored(had, got)
		same := len(got) == len(had)
		if same {
			want := map[memSpan]int{}
			for _, h := range had {
				want[h]++
			}
			for _, g := range got {
				want[g]--
			}
			for _, c := range want {
				same = same && c == 0
			}
		}
		if same && err != nil {
			t.Fatalf("an image giving the process exactly what it had was refused: %v\nhad %v\ngot %v", err, had, got)
		}
		if !same && err == nil {
			t.Fatalf("an image that does not match the process was accepted\nhad %v\ngot %v", had, got)
		}
	})
}
