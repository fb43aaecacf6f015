package image

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/zeebo/xxh3"
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
// The content hash is xxh3-128 (github.com/zeebo/xxh3), not a cryptographic
// hash such as BLAKE3: it runs at tens of GB/s per core where BLAKE3 does a
// few, and the checkpoint must keep up with the GPU. The threat model allows
// it: the hash names chunks for dedup of our own writes and catches
// accidental corruption; nobody adversarial chooses chunk contents to collide
// (an attacker who can write the image directory can write anything there).
// Storage damage is caught by the CRC32C of the stored bytes in any case.
const hashLen = 16

// chunkHash is a chunk's xxh3-128, big-endian (high half first).
type chunkHash [hashLen]byte

func hashOf(raw []byte) chunkHash { return xxh3.Hash128(raw).Bytes() }

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

func manifestPath(dir string) string { return filepath.Join(dir, SubDir, manifestName) }

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
