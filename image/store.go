package image

import (
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

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
	linked     bool // LOCAL: a hard link of the parent chain's file (Options.SelfContained)
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
	g      *fsDir                       // DIR/gpucr
	chunks *fsDir                       // DIR/gpucr/chunks
	own    *Owner                       // nil: the process's own
	old    map[chunkHash]*imagepb.Chunk // LOCAL chunks of the manifest DIR held at Create
	parent map[chunkHash]storedChunk    // chunks of the parent chain, ancestor as seen from here
	// ancestors are the gpucr/ of the parent chain, open ([0]: the
	// parent); linkFrom[i] says whether chunks of ancestors[i] are linked
	// into DIR rather than referred to (Options.SelfContained: those
	// outside DIR). nil: every parent chunk is referred to.
	ancestors []*fsDir
	linkFrom  []bool
	// salvage: the chunk files a dropped write into DIR left (salvage.go),
	// reused like old's; set before any chunk, read-only afterwards.
	salvage map[chunkHash]storedChunk
	// replaces: chunks/ was there before this write (an image it
	// replaces, a dropped write's files): once committed, the files the
	// new image does not name are removed (sweepUnnamed).
	replaces bool
	enc      *zstd.Encoder // nil: no compression
	stored   atomic.Int64  // bytes written to new files
	seq      atomic.Uint64 // temporary names
	tmpTag   string        // this write's, in its temporary names: a dead writer's leftovers never clash

	mu      sync.Mutex
	local   map[chunkHash]*localChunk
	subdirs [256]*fsDir // chunks/HH, open once made or found
	touched [256]bool   // chunks/HH that got a new entry: fsynced at Commit
	created []ownFile   // files renamed into chunks/ by this write: Abort removes them
}

// ownFile is a file this write created: the name in its directory, and
// which file it was (one put under that name since is not removed).
type ownFile struct {
	dir  *fsDir
	name string
	id   fileID
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

// claimKnown claims h if its bytes need not be written: this write met it
// already (a reference to that chunk), the image DIR held before has its
// file (reused) or the parent chain has it (referenced). ok is false if the
// bytes are needed; nothing is claimed then.
func (s *chunkStore) claimKnown(h chunkHash) (lc *localChunk, owner, ok bool) {
	s.mu.Lock()
	lc, ok = s.local[h]
	s.mu.Unlock()
	if ok {
		return lc, false, true
	}
	var meta storedChunk
	if oc, found := s.old[h]; found && s.reusable(h, int64(oc.GetStoredSize())) {
		meta = storedChunk{loc: imagepb.Location_LOCATION_LOCAL, crc: oc.GetCrc32C(), comp: oc.GetCompression(),
			storedSize: oc.GetStoredSize()}
	} else if sc, found := s.salvage[h]; found {
		meta = sc
	} else if pc, found := s.parent[h]; found {
		if meta, found = s.fromParent(h, pc); !found {
			return nil, false, false // not linked: the bytes are stored again
		}
	} else {
		return nil, false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if lc, ok := s.local[h]; ok { // claimed meanwhile
		return lc, false, true
	}
	lc = &localChunk{meta: meta}
	s.local[h] = lc
	return lc, true, true
}

// resolve is the owner's job for a new hash: reuse, reference or write.
// scratch is the worker's compression buffer. It returns the file involved
// (for error messages).
func (s *chunkStore) resolve(lc *localChunk, h chunkHash, raw []byte, scratch *[]byte) (string, error) {
	final := s.g.join(chunkRel(h))
	if oc, ok := s.old[h]; ok {
		// Reuse the previous image's file only if it is still there with the
		// size that manifest promised (and is the owner's); its CRC is
		// checked on every read.
		if s.reusable(h, int64(oc.GetStoredSize())) {
			lc.meta = storedChunk{loc: imagepb.Location_LOCATION_LOCAL, crc: oc.GetCrc32C(),
				comp: oc.GetCompression(), storedSize: oc.GetStoredSize()}
			return final, nil
		}
	}
	if sc, ok := s.salvage[h]; ok {
		lc.meta = sc
		return final, nil
	}
	if pc, ok := s.parent[h]; ok {
		if meta, ok := s.fromParent(h, pc); ok {
			lc.meta = meta
			if meta.linked {
				return final, nil
			}
			return "", nil
		}
		// It could not be linked (another file system, the ancestor
		// deleted since): written again, the image stays self-contained.
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
	if err := s.writeFile(h, stored); err != nil {
		return final, err
	}
	lc.meta = storedChunk{loc: imagepb.Location_LOCATION_LOCAL, crc: crc, comp: comp, storedSize: uint32(len(stored))}
	lc.written = true
	s.stored.Add(int64(len(stored)))
	return final, nil
}

// fromParent is how the image gets chunk h, which the parent chain holds
// (pc): a reference to the ancestor's file, or (linkFrom) a hard link of it
// in DIR. ok is false if it was to be linked and could not be: its bytes
// must be stored.
func (s *chunkStore) fromParent(h chunkHash, pc storedChunk) (storedChunk, bool) {
	i := int(pc.ancestor) - 1
	if s.linkFrom == nil || i < 0 || i >= len(s.linkFrom) || !s.linkFrom[i] {
		return pc, true
	}
	if !s.link(h, pc, s.ancestors[i]) {
		return storedChunk{}, false
	}
	return storedChunk{loc: imagepb.Location_LOCATION_LOCAL, crc: pc.crc, comp: pc.comp, storedSize: pc.storedSize,
		linked: true}, true
}

// link puts a hard link of the chunk file of h in the ancestor whose
// gpucr/ is src at chunks/HH/HASH of DIR, through a temporary name (as
// writeFile does): the same file, its bytes stored once. The file is
// opened beneath src following no symlink and checked (a regular file of
// the size the ancestor's manifest says, the owner's) before it is linked
// through that descriptor: what is linked is what was checked. It says
// whether the link was made; nothing is left behind when not.
func (s *chunkStore) link(h chunkHash, pc storedChunk, src *fsDir) bool {
	fd, err := openat2(src.fd(), chunkRel(h), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(pc.storedSize) ||
		(s.own != nil && int(st.Uid) != s.own.UID) {
		return false
	}
	sub, err := s.subdir(h)
	if err != nil {
		return false
	}
	tmp := fmt.Sprintf("%sl-%s-%s-%d", tmpPrefix, s.tmpTag, h, s.seq.Add(1))
	if linkFD(fd, s.g.fd(), tmp) != nil {
		return false
	}
	id := fileID{uint64(st.Dev), st.Ino}
	name := h.String()
	// Replaces, as writeFile does, only a file no committed manifest of
	// DIR refers to with this content's metadata (those are reused first).
	if err := s.g.rename(tmp, sub, name); err != nil {
		_ = s.g.removeOwn(tmp, id)
		return false
	}
	s.mu.Lock()
	s.created = append(s.created, ownFile{dir: sub, name: name, id: id})
	s.touched[h[0]] = true
	s.mu.Unlock()
	return true
}

// linkFD makes name in dirfd a hard link of the file fd is open on (an
// O_PATH descriptor will do). linkat with AT_EMPTY_PATH needs
// CAP_DAC_READ_SEARCH (the helper, as root, has it); without it the
// descriptor's magic link in /proc links the same file.
func linkFD(fd, dirfd int, name string) error {
	err := unix.Linkat(fd, "", dirfd, name, unix.AT_EMPTY_PATH)
	if err == nil || err == unix.EXDEV || err == unix.EEXIST {
		return err
	}
	if perr := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), dirfd, name, unix.AT_SYMLINK_FOLLOW); perr != nil {
		return err
	}
	return nil
}

// reusable says whether chunks/HH/HASH of h is a regular file of size bytes
// (and the owner's): looked at without opening it for I/O.
func (s *chunkStore) reusable(h chunkHash, size int64) bool {
	fd, err := openat2(s.g.fd(), chunkRel(h), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
		return false
	}
	return s.own == nil || int(st.Uid) == s.own.UID
}

// writeFile puts data at chunks/HH/HASH: a temporary file (0600, the
// owner's), renamed into place. No fsync here (Commit syncs the file system
// once): a file in chunks/ may be incomplete after a crash, but then no
// committed manifest names it with the metadata of this write, and the next
// write to DIR replaces it.
func (s *chunkStore) writeFile(h chunkHash, data []byte) error {
	sub, err := s.subdir(h)
	if err != nil {
		return err
	}
	tmp := fmt.Sprintf("%sc-%s-%s-%d", tmpPrefix, s.tmpTag, h, s.seq.Add(1))
	f, err := s.g.create(tmp, unix.O_WRONLY, s.own)
	if err != nil {
		return err
	}
	id, err := idOf(f)
	if err == nil {
		_, err = f.Write(data) // one large write; os.File loops over short writes
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	name := h.String()
	if err == nil {
		// Replaces only a file no committed manifest of DIR refers to with
		// this content's metadata (those are reused above).
		err = s.g.rename(tmp, sub, name)
	}
	if err != nil {
		_ = s.g.removeOwn(tmp, id)
		return err // *PathError / *LinkError: names the file
	}
	s.mu.Lock()
	s.created = append(s.created, ownFile{dir: sub, name: name, id: id})
	s.touched[h[0]] = true
	s.mu.Unlock()
	return nil
}

// subdir returns chunks/HH of h, made (0700, the owner's) or opened the
// first time; one that is there must be a directory of the owner's.
func (s *chunkStore) subdir(h chunkHash) (*fsDir, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.subdirs[h[0]]; d != nil {
		return d, nil
	}
	d, created, err := s.chunks.mkdir(hex.EncodeToString(h[:1]), s.own)
	if err != nil {
		return nil, err
	}
	s.subdirs[h[0]] = d
	if created {
		s.touched[h[0]] = true // a new directory entry in chunks/ as well
	}
	return d, nil
}

// sync makes every file and directory entry this write created durable:
// one syncfs for the data, then the directories whose entries changed.
func (s *chunkStore) sync(top *fsDir) error {
	if err := syncFS(s.g); err != nil {
		return err
	}
	for i, t := range s.touched {
		if t {
			if err := s.subdirs[i].sync(); err != nil {
				return err
			}
		}
	}
	for _, d := range []*fsDir{s.chunks, s.g, top} {
		if err := d.sync(); err != nil {
			return err
		}
	}
	return nil
}

// close closes the directories the store holds open.
func (s *chunkStore) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, d := range s.subdirs {
		d.close()
		s.subdirs[i] = nil
	}
	s.chunks.close()
}

// removeCreated deletes the chunk files this write put in place (Abort):
// none of them is referenced by the manifest DIR held before. A file put
// under one of those names since is not this write's, and stays.
func (s *chunkStore) removeCreated() error {
	s.mu.Lock()
	created := s.created
	s.created = nil
	s.mu.Unlock()
	var errs []error
	for _, c := range created {
		if err := c.dir.removeOwn(c.name, c.id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
