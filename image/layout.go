package image

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/gpucr/gpucr/ptx"
)

// Names inside DIR/gpucr. Temporary files all start with tmpPrefix so that
// the next write and gc can remove leftovers of a crash without knowing more.
const (
	manifestName = "manifest.pb"
	chunksName   = "chunks"
	lockName     = ".lock"
	tmpPrefix    = ".tmp-"
)

// hashLen is the size of a chunk's content hash.
//
// The content hash is not a cryptographic hash such as BLAKE3: the threat
// model does not need one (it names chunks for dedup of our own writes and
// catches accidental damage; an attacker who can write the image directory
// can write anything there, docs/security.md), and the checkpoint must keep
// up with the GPU. Format 3 uses gpucr's chunk hash (ptx.ChunkHash), which
// the GPU computes where the bytes lie, at memory bandwidth, so that a
// checkpoint copies only chunks the image does not have yet and a restore
// checks every chunk after it reached the GPU. Formats 1 and 2 used
// xxh3-128, which only the CPU computes; they are still read.
const hashLen = 16

// chunkHash is a chunk's content hash, big-endian (high half first).
type chunkHash [hashLen]byte

// hashFor is the content hash of raw in manifest format version format.
func hashFor(format uint32, raw []byte) chunkHash {
	if format >= 3 {
		return ptx.ChunkHash(raw)
	}
	return xxh3.Hash128(raw).Bytes()
}

// hashOf is the content hash this package writes (FormatVersion).
func hashOf(raw []byte) chunkHash { return hashFor(FormatVersion, raw) }

// zeroHashCache holds the hash of n zero bytes in format 3, by n: a chunk
// the GPU hashed is zero if its hash is that (chunk sizes are few).
var zeroHashCache sync.Map // uint64 -> chunkHash

// ZeroChunkHash is the content hash (format 3: ptx.ChunkHash) of n zero
// bytes.
func ZeroChunkHash(n int) [16]byte {
	if h, ok := zeroHashCache.Load(uint64(n)); ok {
		return h.(chunkHash)
	}
	h := chunkHash(ptx.ChunkHash(make([]byte, n)))
	zeroHashCache.Store(uint64(n), h)
	return h
}

func (h chunkHash) String() string { return hex.EncodeToString(h[:]) }

// hashFromBytes checks a hash taken from a manifest. Only the exact length is
// accepted; the file name is then our own hex encoding of it, so nothing a
// manifest says can put a path separator or ".." into a chunk path.
func hashFromBytes(b []byte) (chunkHash, error) {
	var h chunkHash
	if len(b) != hashLen {
		return h, corruptf("chunk hash has %d bytes, want %d", len(b), hashLen)
	}
	copy(h[:], b)
	return h, nil
}

// parseHashName parses a chunk file name found on disk: exactly 32 lowercase
// hex digits. gc deletes only files whose names pass this, so it never
// touches something it did not write.
func parseHashName(name string) (chunkHash, bool) {
	var h chunkHash
	if len(name) != 2*hashLen {
		return h, false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return h, false
		}
	}
	if _, err := hex.Decode(h[:], []byte(name)); err != nil {
		return h, false
	}
	return h, true
}

// ManifestPath is DIR/gpucr/manifest.pb, the file a committed image has
// (a write renames it into place last).
func ManifestPath(dir string) string { return filepath.Join(dir, SubDir, manifestName) }

// PartsPath is DIR/gpucr/parts, where a process's sealed part waits for
// its tree's commit.
func PartsPath(dir string) string { return filepath.Join(dir, SubDir, partsName) }

// PartPath is the sealed part of process pid in DIR.
func PartPath(dir string, pid int) string { return filepath.Join(PartsPath(dir), partName(pid)) }

// chunkPath is DIR/gpucr/chunks/HH/HASH.
func chunkPath(dir string, h chunkHash) string {
	s := h.String()
	return filepath.Join(dir, SubDir, chunksName, s[:2], s)
}

// chunkRel is chunks/HH/HASH, relative to DIR/gpucr.
func chunkRel(h chunkHash) string {
	s := h.String()
	return chunksName + "/" + s[:2] + "/" + s
}

// maxParentPath bounds a parent reference; real ones are a few dozen bytes.
const maxParentPath = 4096

// checkParentPath accepts only what Create writes: a clean relative path
// (filepath.Rel's output), resolved exactly once against the directory of
// the image that names it. Absolute paths, empty or "." references (the image
// itself), unclean forms ("a/../b", "a//b", "./a", trailing "/") and NUL are
// refused rather than normalized, so that what is checked is what is opened.
func checkParentPath(p string) error {
	switch {
	case p == "" || p == ".":
		return errors.New("parent path is empty or the image itself")
	case len(p) > maxParentPath:
		return fmt.Errorf("parent path is %d bytes long", len(p))
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("parent path contains NUL")
	case filepath.IsAbs(p):
		return fmt.Errorf("parent path %q is absolute", p)
	case filepath.Clean(p) != p:
		return fmt.Errorf("parent path %q is not clean", p)
	}
	return nil
}
