package ptx

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"testing"
)

// Splitmix64 bytes: the test data every implementation can make alike (the
// GPU check, tests/gpu/ptx-check.py, makes the same with numpy).
func testBytes(seed uint64, n int) []byte {
	b := make([]byte, (n+7)&^7)
	s := seed
	for i := 0; i < len(b); i += 8 {
		s += 0x9E3779B97F4A7C15
		z := s
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		binary.LittleEndian.PutUint64(b[i:], z^z>>31)
	}
	return b[:n]
}

// The hash's values are part of every image written since: pinned here, so
// that a change to the definition cannot pass unnoticed (the simulated
// driver's and the GPU's kernels are checked against this function).
func TestChunkHashVectors(t *testing.T) {
	for _, tc := range []struct {
		seed uint64
		n    int
		want string
	}{
		{0, 0, "81adc468b4e0a4153ca8e496557f3c52"},
		{1, 1, "c709dfd599be85361ec3eb2740114d17"},
		{2, 15, "4110e5f346026b5d7a0afad4b811964e"},
		{3, 16, "bb9ee02860d6e23af689997989d3b34e"},
		{4, 17, "6ee1e74ba7c883e8dcb55a25fd775932"},
		{5, 4095, "22b6ffc0331f37460dcd8f0cac2540f0"},
		{6, 4096, "b214349dc8252558777d28954b270914"},
		{7, 4104, "9d1baa305c2fa42479a132fc957289ef"},
		{8, 1048576, "8b1df726be415cf203fba9575bdad9fc"},
		{9, 4194304, "f056aebbf84c7595a740aa081504d810"},
		{10, 4194288, "fdb880207b331c30f8938f6eae291c0c"},
	} {
		got := ChunkHash(testBytes(tc.seed, tc.n))
		if hex.EncodeToString(got[:]) != tc.want {
			t.Errorf("seed %d, %d bytes: %x, want %s", tc.seed, tc.n, got, tc.want)
		}
	}
}

// Every single-bit flip, word swap and length change gives another hash.
func TestChunkHashSensitive(t *testing.T) {
	base := testBytes(42, 64<<10+5)
	h0 := ChunkHash(base)
	seen := map[[16]byte]string{h0: "original"}
	add := func(what string, b []byte) {
		t.Helper()
		h := ChunkHash(b)
		if prev, dup := seen[h]; dup {
			t.Fatalf("%s hashes like %s: %x", what, prev, h)
		}
		seen[h] = what
	}
	for _, bit := range []int{0, 1, 63, 64, 127, 128, 8 * 4096, 8*(16*256) + 3, 8*len(base) - 1} {
		b := bytes.Clone(base)
		b[bit/8] ^= 1 << (bit % 8)
		add("bit "+itoa(bit), b)
	}
	// Words of one lane (j and j+256) and of neighbouring lanes swapped.
	for _, pair := range [][2]int{{0, 256}, {0, 1}, {5, 261}, {1000, 1001}} {
		b := bytes.Clone(base)
		x, y := b[16*pair[0]:16*pair[0]+16], b[16*pair[1]:16*pair[1]+16]
		tmp := bytes.Clone(x)
		copy(x, y)
		copy(y, tmp)
		add("swap "+itoa(pair[0])+","+itoa(pair[1]), b)
	}
	// Zero padding is not the same as zero bytes.
	z := make([]byte, 33)
	add("33 zero bytes", z)
	add("32 zero bytes", z[:32])
	add("48 zero bytes", make([]byte, 48))
	add("no bytes", nil)
}

func itoa(i int) string { return strconv.Itoa(i) }

func BenchmarkChunkHash(b *testing.B) {
	buf := testBytes(1, 4<<20)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		ChunkHash(buf)
	}
}
