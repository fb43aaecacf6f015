package ptx

import (
	"encoding/binary"
	"math/bits"
)

// ChunkHash is gpucr's chunk hash, version 1: a 128-bit, non-cryptographic
// hash of a chunk of device memory, made to run at memory bandwidth on a
// GPU (one thread block per chunk, kernel gpucr_chunk_hash in
// kernels.ptx) and to give the same bits there, in the simulated driver
// (tests/sim/kernels/gpucr.c) and here. This file is its definition:
//
//   - The chunk's n bytes are read as 16-byte words, two little-endian
//     uint64s (lo, hi); a last partial word is padded with zero bytes.
//   - Word j goes to lane j mod HashLanes (a GPU thread); each lane folds its
//     words in increasing j into two 64-bit accumulators that both see every
//     input, each with its own multiplier chain (so a change must collide in
//     both: 128 bits, not 2 x 64).
//   - The lanes' accumulators are folded in lane order, then the length,
//     then a final avalanche of each half that also mixes in the other.
//
// The output is 16 bytes, big-endian, high half first (the manifest's order
// for chunk hashes). It detects damage and names content; it is no defence
// against someone who chooses the bytes (docs/security.md).
func ChunkHash(b []byte) [16]byte {
	var lanes [HashLanes]laneState
	for l := range lanes {
		lanes[l] = laneInit(l)
	}
	full := len(b) / 16
	// A row of HashLanes words at a time, each lane's state in registers
	// for its word (the same order as word j going to lane j mod HashLanes).
	for row := 0; row < full; row += HashLanes {
		n := min(HashLanes, full-row)
		words := b[16*row : 16*(row+n)]
		for l := range n {
			w := words[16*l : 16*l+16]
			s := &lanes[l]
			lo, hi := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
			a := bits.RotateLeft64(s.a+lo*k2, 31) * k1
			bb := bits.RotateLeft64(s.b^lo*k4, 27) * k3
			s.a = bits.RotateLeft64(a+hi*k2, 31) * k1
			s.b = bits.RotateLeft64(bb^hi*k4, 27) * k3
		}
	}
	if rest := b[16*full:]; len(rest) > 0 {
		var pad [16]byte
		copy(pad[:], rest)
		lanes[full%HashLanes].word(binary.LittleEndian.Uint64(pad[:]), binary.LittleEndian.Uint64(pad[8:]))
	}
	return fold(&lanes, uint64(len(b)))
}

// HashLanes is the number of lanes (threads of the kernel's block): part of
// the hash's definition, not a tuning knob.
const HashLanes = 256

// The multipliers: odd 64-bit constants with well-spread bits (those of
// xxHash64; any such set would do, but all three implementations must agree).
const (
	k1 = 0x9E3779B185EBCA87
	k2 = 0xC2B2AE3D27D4EB4F
	k3 = 0x165667B19E3779F9
	k4 = 0x85EBCA77C2B2AE63
	k5 = 0x27D4EB2F165667C5
	// The final avalanche's (MurmurHash3's fmix64).
	m1 = 0xFF51AFD7ED558CCD
	m2 = 0xC4CEB9FE1A85EC53
)

type laneState struct{ a, b uint64 }

func laneInit(l int) laneState {
	return laneState{a: k5 + uint64(l)*k1, b: k4 ^ uint64(l)*k2}
}

// in folds one 64-bit input into both accumulators.
func (s *laneState) in(v uint64) {
	s.a = bits.RotateLeft64(s.a+v*k2, 31) * k1
	s.b = bits.RotateLeft64(s.b^v*k4, 27) * k3
}

func (s *laneState) word(lo, hi uint64) {
	s.in(lo)
	s.in(hi)
}

func fmix(x uint64) uint64 {
	x ^= x >> 33
	x *= m1
	x ^= x >> 33
	x *= m2
	x ^= x >> 33
	return x
}

func fold(lanes *[HashLanes]laneState, n uint64) [16]byte {
	h := laneState{a: k3, b: k5}
	for l := range lanes {
		h.a = bits.RotateLeft64(h.a+lanes[l].a*k2, 31) * k1
		h.b = bits.RotateLeft64(h.b^lanes[l].b*k4, 27) * k3
	}
	h.in(n)
	hi := fmix(h.a + bits.RotateLeft64(h.b, 32))
	lo := fmix(h.b ^ bits.RotateLeft64(h.a, 23) ^ n)
	var out [16]byte
	binary.BigEndian.PutUint64(out[:8], hi)
	binary.BigEndian.PutUint64(out[8:], lo)
	return out
}
