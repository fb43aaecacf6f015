package ptx

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// fatbinEntry lays out one entry as a toolkit does (see fatbin.go).
func fatbinEntry(kind, arch int, payload []byte, flags, rawSize uint64, hlen int) []byte {
	padded := (len(payload) + 7) &^ 7
	e := make([]byte, hlen+padded)
	le := binary.LittleEndian
	le.PutUint16(e, uint16(kind))
	le.PutUint16(e[2:], 0x0101)
	le.PutUint32(e[4:], uint32(hlen))
	le.PutUint32(e[8:], uint32(padded))
	le.PutUint32(e[16:], uint32(len(payload)))
	le.PutUint32(e[28:], uint32(arch))
	le.PutUint64(e[40:], flags)
	le.PutUint64(e[56:], rawSize)
	copy(e[hlen:], payload)
	return e
}

func fatbinContainer(entries ...[]byte) []byte {
	var body []byte
	for _, e := range entries {
		body = append(body, e...)
	}
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h, FatbinMagic)
	binary.LittleEndian.PutUint16(h[4:], 1)
	binary.LittleEndian.PutUint16(h[6:], 16)
	binary.LittleEndian.PutUint64(h[8:], uint64(len(body)))
	return append(h, body...)
}

// Containers one after another, PTX plain and zstd-compressed (the
// kernels analysed), SASS (said to be unanalysable), an extended entry
// header; damage is refused.
func TestParseFatbin(t *testing.T) {
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	ptxText := []byte(Kernels + "\x00")
	compressed := enc.EncodeAll(ptxText, nil)
	fb := append(fatbinContainer(
		fatbinEntry(FatbinPTX, 90, ptxText, 0, 0, 64),
		fatbinEntry(FatbinELF, 90, []byte("\x7fELF not really"), 0, 0, 112),
	), fatbinContainer(
		fatbinEntry(FatbinPTX, 120, compressed, 0x8000, uint64(len(ptxText)), 80),
		fatbinEntry(FatbinPTX, 80, []byte("lz-something"), 0x2000, 100, 64),
	)...)
	fb = append(fb, 0, 0, 0, 0) // what follows the last container in a section
	entries, err := ParseFatbin(fb)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 4 {
		t.Fatalf("%d entries, want 4: %+v", len(entries), entries)
	}
	for _, i := range []int{0, 2} {
		e := entries[i]
		if e.Kind != FatbinPTX || e.Module == nil || len(e.Module.Entries) != 2 || e.NotAnalysed != "" {
			t.Fatalf("entry %d: %+v", i, e)
		}
		if got := writes(entry(t, e.Module, ChunkHashKernel)); !strings.HasSuffix(got, "gpucr_chunk_hash_out:W") {
			t.Errorf("entry %d: %s", i, got)
		}
	}
	if e := entries[1]; e.Kind != FatbinELF || e.Arch != 90 || !strings.Contains(e.NotAnalysed, "SASS for sm_90") {
		t.Errorf("SASS entry: %+v", e)
	}
	if e := entries[3]; e.Module != nil || !strings.Contains(e.NotAnalysed, "other than zstd") {
		t.Errorf("entry compressed otherwise: %+v", e)
	}

	for _, bad := range [][]byte{
		nil,
		[]byte("\x7fELF"),
		fb[:40],                           // truncated container
		fatbinContainer(make([]byte, 10)), // stray bytes
		fatbinContainer(fatbinEntry(FatbinPTX, 90, ptxText, 0, 0, 200)[:70]),
	} {
		if _, err := ParseFatbin(bad); err == nil {
			t.Errorf("damaged fat binary of %d bytes parsed", len(bad))
		}
	}
}

// A few compressed bytes may claim gigabytes: WriteSetsWithin asks for the
// size an entry says before decompressing it, decompresses no more than
// that, and a refusal ends the analysis with no kernels at all (a kernel
// is not decided on the entries that fit alone).
func TestWriteSetsWithinBoundsDecompression(t *testing.T) {
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	ptxText := []byte(Kernels + "\x00")
	small := enc.EncodeAll(ptxText, nil)
	bomb := enc.EncodeAll(make([]byte, 64<<20), nil) // zeros: 64 MiB in a few KiB
	if len(bomb) > 64<<10 {
		t.Fatalf("the bomb is %d bytes", len(bomb))
	}
	fb := fatbinContainer(
		fatbinEntry(FatbinPTX, 90, small, 0x8000, uint64(len(ptxText)), 64),
		fatbinEntry(FatbinPTX, 120, bomb, 0x8000, 64<<20, 64),
	)
	var asked []uint64
	take := func(room uint64) func(n uint64) bool {
		return func(n uint64) bool {
			asked = append(asked, n)
			if n > room {
				return false
			}
			room -= n
			return true
		}
	}
	sets, err := WriteSetsWithin(fb, take(1<<20))
	if !errors.Is(err, ErrNoRoom) || len(sets) != 0 {
		t.Fatalf("a 64 MiB entry within 1 MiB: %d kernels, %v; want none and ErrNoRoom", len(sets), err)
	}
	if len(asked) != 2 || asked[0] != uint64(len(ptxText)) || asked[1] != 64<<20 {
		t.Errorf("asked for %v", asked)
	}
	// An entry that says less than it holds stops at what it said.
	liar := fatbinContainer(fatbinEntry(FatbinPTX, 120, bomb, 0x8000, 4096, 64))
	entries, err := parseFatbin(liar, take(1<<30))
	if err != nil || len(entries) != 1 || entries[0].Module != nil || entries[0].NotAnalysed == "" {
		t.Fatalf("an entry past its stated size: %+v, %v", entries, err)
	}
	// With room, the kernels are there.
	if sets, err := WriteSetsWithin(fatbinContainer(fatbinEntry(FatbinPTX, 90, small, 0x8000, uint64(len(ptxText)), 64)),
		take(1<<20)); err != nil || len(sets) == 0 {
		t.Fatalf("a small compressed entry with room: %d kernels, %v", len(sets), err)
	}
}
