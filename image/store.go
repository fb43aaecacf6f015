package image

import (
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// zeroBlock is compared against to find all-zero chunks (read only).
var zeroBlock [64 << 10]byte

// isZero reports whether p is all zero. memequal is vectorized, and ordinary
// data differs within the first bytes, so the check is free for them.
func isZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroBlock))
		if string(p[:n]) != string(zeroBlock[:n]) { // no allocation: compiler-recognized
			return false
		}
		p = p[n:]
	}
	return true
}

// storedChunk is what the manifest says about a chunk file.
type storedChunk struct {
	loc        imagepb.Location // LOCAL or PARENT
	ancestor   uint32           // PARENT: parent links up
	crc        uint32
	comp       imagepb.Compression
	storedSize uint32
}

// localChunk is one content hash met by this write. The first worker to meet
// it (the owner) decides where its bytes live and fills meta; every chunk of
// the image with the same hash points here. Commit reads meta only after all
// workers are done.
type localChunk struct {
	meta    storedChunk
	written bool // the owner wrote a new file (stats: new, not dedup)
}

// chunkStore is the content-addressed store of the image being written:
// dedup within the image, against the image DIR held before (its files are
// reused, never overwritten) and against the parent chain (referenced).
type chunkStore struct {
	gdir   string
	old    map[chunkHash]*imagepb.Chunk // LOCAL chunks of the manifest DIR held at Create
	parent map[chunkHash]storedChunk    // chunks of the parent chain, ancestor as seen from here
	enc    *zstd.Encoder                // nil: no compression
	stored atomic.Int64                 // bytes written to new files
	seq    atomic.Uint64                // temporary names

	mu      sync.Mutex
	local   map[chunkHash]*localChunk
	subdirs [256]bool // chunks/HH known to exist
	touched [256]bool // chunks/HH that got a new entry: fsynced at Commit
	created []string  // files renamed into chunks/ by this write: Abort removes them
}

// claim returns the entry for h and whether the caller is its owner.
func (s *chunkStore) claim(h chunkHash) (*localChunk, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lc, ok := s.local[h]; ok {
		return lc, false
	}
	lc := new(localChunk)
	s.local[h] = lc
	return lc, true
}

// resolve is the owner's job for a new hash: reuse, reference or write.
// scratch is the worker's compression buffer. It returns the file involved
// (for error messages).
func (s *chunkStore) resolve(lc *localChunk, h chunkHash, raw []byte, scratch *[]byte) (string, error) {
	final := chunkPath(filepath.Dir(s.gdir), h)
	if oc, ok := s.old[h]; ok {
		// Reuse the previous image's file only if it is still there with the
		// size that manifest promised; its CRC is checked on every read.
		if info, err := os.Lstat(final); err == nil && info.Mode().IsRegular() && info.Size() == int64(oc.GetStoredSize()) {
			lc.meta = storedChunk{loc: imagepb.Location_LOCATION_LOCAL, crc: oc.GetCrc32C(),
				comp: oc.GetCompression(), storedSize: oc.GetStoredSize()}
			return final, nil
		}
	}
	if pc, ok := s.parent[h]; ok {
		lc.meta = pc
		return "", nil
	}
	stored, comp := raw, imagepb.Compression_COMPRESSION_NONE
	if s.enc != nil {
		out := s.enc.EncodeAll(raw, (*scratch)[:0])
		*scratch = out[:0]
		if len(out) < len(raw) { // incompressible data is stored raw
			stored, comp = out, imagepb.Compression_COMPRESSION_ZSTD
		}
	}
	var crc uint32 // format 2: uncompressed chunks are covered by their hash alone
	if comp != imagepb.Compression_COMPRESSION_NONE {
		crc = crc32.Checksum(stored, castagnoli)
	}
	if err := s.writeFile(h, final, stored); err != nil {
		return final, err
	}
	lc.meta = storedChunk{loc: imagepb.Location_LOCATION_LOCAL, crc: crc, comp: comp, storedSize: uint32(len(stored))}
	lc.written = true
	s.stored.Add(int64(len(stored)))
	return final, nil
}

// writeFile puts data at final: a temporary file, renamed into place. No
// fsync here (Commit syncs the file system once): a file in chunks/ may be
// incomplete after a crash, but then no committed manifest names it with the
// metadata of this write, and the next write to DIR replaces it.
func (s *chunkStore) writeFile(h chunkHash, final string, data []byte) error {
	if err := s.ensureSubdir(h); err != nil {
		return err
	}
	tmp := filepath.Join(s.gdir, fmt.Sprintf("%sc-%s-%d", tmpPrefix, h, s.seq.Add(1)))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data) // one large write; os.File loops over short writes
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Replaces only a file no committed manifest of DIR refers to with
		// this content's metadata (those are reused above).
		err = os.Rename(tmp, final)
	}
	if err != nil {
		os.Remove(tmp)
		return err // *PathError / *LinkError: names the file
	}
	s.mu.Lock()
	s.created = append(s.created, final)
	s.touched[h[0]] = true
	s.mu.Unlock()
	return nil
}

func (s *chunkStore) ensureSubdir(h chunkHash) error {
	s.mu.Lock()
	made := s.subdirs[h[0]]
	s.mu.Unlock()
	if made {
		return nil
	}
	d := filepath.Join(s.gdir, chunksName, hex.EncodeToString(h[:1]))
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	s.mu.Lock()
	if !s.subdirs[h[0]] {
		s.subdirs[h[0]] = true
		s.touched[h[0]] = true // a new directory entry in chunks/ as well
	}
	s.mu.Unlock()
	return nil
}

// sync makes every file and directory entry this write created durable:
// one syncfs for the data, then the directories whose entries changed.
func (s *chunkStore) sync(dir string) error {
	if err := syncFS(s.gdir); err != nil {
		return err
	}
	for i, t := range s.touched {
		if t {
			if err := fsyncDir(filepath.Join(s.gdir, chunksName, hex.EncodeToString([]byte{byte(i)}))); err != nil {
				return err
			}
		}
	}
	for _, d := range []string{filepath.Join(s.gdir, chunksName), s.gdir, dir} {
		if err := fsyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

// removeCreated deletes the chunk files this write put in place (Abort):
// none of them is referenced by the manifest DIR held before.
func (s *chunkStore) removeCreated() error {
	s.mu.Lock()
	created := s.created
	s.created = nil
	s.mu.Unlock()
	var errs []error
	for _, p := range created {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
