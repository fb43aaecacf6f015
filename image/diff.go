package image

import (
	"github.com/gpucr/gpucr/protocol/imagepb"
)

// DiffReport compares two images buffer by buffer. Buffers are matched by
// process and address (what restore maps them by); content is compared by
// the chunks' hashes, so no chunk file is read.
type DiffReport struct {
	OnlyA, OnlyB []BufferInfo // buffers of one image with no match in the other
	Changed      []BufferDiff // matched buffers whose description or content differ
	Unchanged    int          // matched buffers equal in both
	BytesChanged uint64       // sum of Changed[i].BytesChanged
}

// BufferDiff is a buffer present in both images that differs.
type BufferDiff struct {
	IndexA, IndexB int // buffer indexes in a and b
	A, B           BufferInfo
	InfoChanged    bool // size, device, GPU or allocation kind differ
	// ChunksChanged lists the chunk indexes (in b's layout) whose content
	// differs; all of them when the images' chunk sizes differ.
	ChunksChanged []int
	BytesChanged  uint64 // raw bytes of those chunks (in b; in a for chunks b lacks)
}

type bufKey struct {
	pid  int64
	addr uint64
}

// Diff reports how b differs from a.
func Diff(a, b *Image) (*DiffReport, error) {
	rep := &DiffReport{}
	inB := map[bufKey]int{}
	for i, bb := range b.m.GetBuffers() {
		inB[bufKey{bb.GetPid(), bb.GetAddress()}] = i
	}
	matched := make([]bool, len(b.m.GetBuffers()))
	zeros := zeroHashes{format: b.m.GetFormatVersion(), m: map[uint32]chunkHash{}}
	// Chunks hashed with different functions (formats 1-2 against 3) cannot
	// be compared by hash: every chunk counts as changed, as with different
	// chunk sizes.
	sameHash := a.HashesOnGPU() == b.HashesOnGPU()
	for ia, ba := range a.m.GetBuffers() {
		ib, ok := inB[bufKey{ba.GetPid(), ba.GetAddress()}]
		if !ok {
			rep.OnlyA = append(rep.OnlyA, bufferInfoOf(ba))
			continue
		}
		matched[ib] = true
		bb := b.m.GetBuffers()[ib]
		d := BufferDiff{IndexA: ia, IndexB: ib, A: bufferInfoOf(ba), B: bufferInfoOf(bb)}
		d.InfoChanged = d.A != d.B
		sameLayout := a.m.GetChunkSize() == b.m.GetChunkSize() && sameHash
		na, nb := len(ba.GetChunks()), len(bb.GetChunks())
		for ci := 0; ci < max(na, nb); ci++ {
			switch {
			case ci >= nb:
				d.BytesChanged += uint64(ba.GetChunks()[ci].GetSize())
			case ci >= na || !sameLayout || !zeros.sameContent(ba.GetChunks()[ci], bb.GetChunks()[ci]):
				d.ChunksChanged = append(d.ChunksChanged, ci)
				d.BytesChanged += uint64(bb.GetChunks()[ci].GetSize())
			}
		}
		if d.InfoChanged || d.BytesChanged > 0 {
			rep.Changed = append(rep.Changed, d)
			rep.BytesChanged += d.BytesChanged
		} else {
			rep.Unchanged++
		}
	}
	for ib, bb := range b.m.GetBuffers() {
		if !matched[ib] {
			rep.OnlyB = append(rep.OnlyB, bufferInfoOf(bb))
		}
	}
	return rep, nil
}

// zeroHashes caches the hash of n zero bytes in one format, to compare a
// zero chunk with a stored one.
type zeroHashes struct {
	format uint32
	m      map[uint32]chunkHash
}

func (z zeroHashes) hash(n uint32) chunkHash {
	if z.format >= 3 {
		return ZeroChunkHash(int(n)) // cached for the whole process
	}
	h, ok := z.m[n]
	if !ok {
		h = hashFor(z.format, make([]byte, n))
		z.m[n] = h
	}
	return h
}

// sameContent compares two chunks of the same size by hash.
func (z zeroHashes) sameContent(x, y *imagepb.Chunk) bool {
	if x.GetSize() != y.GetSize() {
		return false
	}
	hx, hy := x.GetHash(), y.GetHash()
	xz := x.GetLocation() == imagepb.Location_LOCATION_ZERO
	yz := y.GetLocation() == imagepb.Location_LOCATION_ZERO
	switch {
	case xz && yz:
		return true
	case xz:
		h := z.hash(x.GetSize())
		hx = h[:]
	case yz:
		h := z.hash(y.GetSize())
		hy = h[:]
	}
	return string(hx) == string(hy)
}
