package image

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// Writer writes one image into DIR/gpucr. Create it, add buffers (from any
// number of goroutines), write and close each, then Commit; or Abort.
type Writer struct {
	dir     string // DIR, symlinks resolved
	gdir    string // DIR/gpucr
	top     *fsDir // DIR, open: nothing is opened by path beneath it
	g       *fsDir // DIR/gpucr, open
	opts    Options
	origin  Origin
	id      []byte
	parent  *imagepb.Parent
	lock    *os.File   // exclusive, on DIR
	shared  []*os.File // shared, on the ancestors chunks may refer to
	pim     *Image     // the parent, open: its chain's gpucr/ are where links are made from
	store   *chunkStore
	budget  *budget
	pool    sync.Pool // *[]byte of ChunkSize: chunk buffers reused across chunks
	scratch sync.Pool // *[]byte: compression output of WriteChunk callers
	jobs    chan job
	wg      sync.WaitGroup

	// sendMu is read-held while sending on jobs (which may block until a
	// worker takes the chunk) and write-held to close jobs, so that no send
	// meets a closed channel. Nothing else is locked while it is held: the
	// workers, which unblock senders, never take it.
	sendMu     sync.RWMutex
	jobsClosed bool // guarded by sendMu

	// mu guards what follows; it is only held briefly, never while blocking.
	mu      sync.RWMutex
	state   writerState
	err     error // first failure
	buffers []*BufferWriter
	spans   map[int][]span  // per pid, sorted by address: overlap check in AddBuffer
	procs   map[int]procRec // AddProcess: by pid
	scripts []createdFile   // AddTemplateScript: removed by an abort
	bytesIn atomic.Int64

	partsMu sync.Mutex // guards parts; never held with mu
	parts   parts
}

type writerState int

const (
	stateOpen writerState = iota
	stateCommitted
	stateAborted
	stateFailed
)

type span struct{ addr, size uint64 }

// job is one full chunk handed to the workers.
type job struct {
	bw     *BufferWriter
	index  int
	buf    *[]byte // chunk buffer; data is (*buf)[:n]
	n      int
	charge int64 // budget taken for buf
	pooled bool  // buf goes back to the pool
}

var errAborted = fmt.Errorf("%w: writer aborted", ErrIncomplete)

// Create starts writing an image into dir (created 0700 if missing). The
// image DIR held before, if any, stays the visible one until Commit; its
// chunk files are reused for identical chunks. With opts.Parent the image
// is incremental: chunks the parent chain already holds are only
// referenced. Symlinks on the path to dir are followed (the caller's
// path); beneath it nothing is: a symlink, FIFO or other non-directory
// where DIR/gpucr or its subdirectories should be is refused, and so is
// anything but a regular file where a file should be.
func Create(dir string, origin Origin, opts Options) (*Writer, error) {
	if err := normalizeOptions(&opts); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("create image in %s: %w", dir, err)
	}
	real, err := realDir(dir)
	if err != nil {
		return nil, err
	}
	top, err := openDirPath(real)
	if err != nil {
		return nil, fmt.Errorf("create image in %s: %w", dir, err)
	}
	return create(top, origin, opts)
}

// CreateAt is Create into the image directory d is open on (a descriptor
// another process passed: it opened the directory, so it could reach it);
// d stays the caller's. Everything is created beneath d.
func CreateAt(d *os.File, origin Origin, opts Options) (*Writer, error) {
	if err := normalizeOptions(&opts); err != nil {
		return nil, err
	}
	top, err := dirOf(d)
	if err != nil {
		return nil, fmt.Errorf("create image: %w", err)
	}
	return create(top, origin, opts)
}

// create starts the write into the open DIR top, which it takes over.
func create(top *fsDir, origin Origin, opts Options) (_ *Writer, err error) {
	w := &Writer{dir: top.path, gdir: top.join(SubDir), top: top, opts: opts, origin: origin,
		id: make([]byte, 16), spans: map[int][]span{}}
	_, _ = rand.Read(w.id)
	defer func() {
		if err != nil {
			if w.store != nil {
				_ = w.store.removeCreated() // salvaged files it adopted
			}
			_ = opts.Salvage.Discard() // not adopted yet: nobody else will take it
			w.release()
		}
	}()
	own := opts.Owner
	if opts.SubDirMustExist {
		w.g, err = top.openDir(SubDir, own)
	} else {
		w.g, _, err = top.mkdir(SubDir, own)
	}
	if err != nil {
		return nil, fmt.Errorf("create image in %s: %w", w.dir, err)
	}
	if w.lock, err = lockDir(w.g, own); err != nil {
		return nil, err
	}
	// Leftover temporary files of a writer that died stay: a Writer removes
	// only what it created itself (gc removes the rest).
	chunks, made, err := w.g.mkdir(chunksName, own)
	if err != nil {
		return nil, fmt.Errorf("create image in %s: %w", w.dir, err)
	}
	w.store = &chunkStore{g: w.g, chunks: chunks, own: own, local: map[chunkHash]*localChunk{}, old: oldChunks(w.g, own),
		tmpTag: hex.EncodeToString(w.id[:4]), replaces: !made}
	if opts.Parent != "" {
		open := func() (err error) {
			w.parent, w.store.parent, w.pim, w.shared, err = parentChunks(w.dir, opts.Parent, own)
			return err
		}
		if opts.Lookup != nil {
			err = opts.Lookup(open)
		} else {
			err = open()
		}
		if err != nil {
			return nil, err
		}
		if opts.SelfContained {
			w.store.ancestors = w.pim.gdirs
			for _, d := range w.pim.chain {
				w.store.linkFrom = append(w.store.linkFrom, !within(d, w.dir))
			}
		}
	}
	// A salvage only saves copying: one that cannot be used (its
	// directory replaced, a file system error) is dropped, not the write.
	_ = w.store.adopt(opts.Salvage)
	if opts.Compression == CompressionZstd {
		// EncodeAll only: no goroutines. The zstd frame checksum is off:
		// our CRC32C and xxh3 already cover every chunk.
		w.store.enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderCRC(false), zstd.WithEncoderConcurrency(opts.Workers), zstd.WithLowerEncoderMem(false))
		if err != nil {
			return nil, fmt.Errorf("zstd encoder: %w", err)
		}
	}
	cs := opts.ChunkSize
	w.pool.New = func() any { b := make([]byte, cs); return &b }
	w.scratch.New = func() any { b := []byte(nil); return &b }
	w.budget = newBudget(opts.MaxBuffered)
	w.jobs = make(chan job, opts.Workers)
	for i := 0; i < opts.Workers; i++ {
		w.wg.Add(1)
		go w.worker()
	}
	return w, nil
}

// Dir is the image directory the Writer writes into (absolute, symlinks
// resolved).
func (w *Writer) Dir() string { return w.dir }

func normalizeOptions(o *Options) error {
	if o.ChunkSize == 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if o.ChunkSize < 0 || o.ChunkSize > MaxChunkSize {
		return fmt.Errorf("chunk size %d out of range 1..%d", o.ChunkSize, MaxChunkSize)
	}
	if o.Compression != CompressionNone && o.Compression != CompressionZstd {
		return fmt.Errorf("unknown compression %d", int(o.Compression))
	}
	if o.Workers < 0 {
		return fmt.Errorf("workers %d < 0", o.Workers)
	}
	if o.Workers == 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.MaxBuffered == 0 {
		o.MaxBuffered = 2 * int64(o.Workers) * int64(o.ChunkSize)
	}
	if o.MaxBuffered < int64(o.ChunkSize) {
		return fmt.Errorf("MaxBuffered %d is less than one chunk (%d)", o.MaxBuffered, o.ChunkSize)
	}
	return nil
}

// realDir is dir made absolute with symlinks resolved: parent references are
// relative to where the image really is, whichever path reached it.
func realDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", fmt.Errorf("image dir %s: %w", dir, err)
	}
	return abs, nil
}

// oldChunks indexes the local chunk files of the image DIR holds now, if it
// has a valid one (of own's, if set): their files may be reused but must
// never be overwritten.
func oldChunks(g *fsDir, own *Owner) map[chunkHash]*imagepb.Chunk {
	m, err := loadManifestAt(g, own)
	if err != nil || m.GetFormatVersion() != FormatVersion {
		return nil // nothing valid to keep intact or to reuse (another format: other hashes)
	}
	idx := map[chunkHash]*imagepb.Chunk{}
	for _, b := range m.GetBuffers() {
		for _, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_LOCAL {
				h, _ := hashFromBytes(c.GetHash()) // validated by loadManifest
				idx[h] = c
			}
		}
	}
	return idx
}

// parentChunks opens the parent image (it must be restorable, and with own
// set every image of its chain must be own's: the new image will use their
// chunk files), locks its chain against gc (shared) and indexes every
// stored chunk reachable through it, as seen from the new image in dir.
// The parent image it returns stays open (its chain's gpucr/ are where
// links are made from): the Writer closes it.
func parentChunks(dir, parent string, own *Owner) (_ *imagepb.Parent, _ map[chunkHash]storedChunk, _ *Image, _ []*os.File, err error) {
	pim, err := openImage(parent, ReadOptions{}, false, own)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("parent image: %w", err)
	}
	defer func() {
		if err != nil {
			pim.Close()
		}
	}()
	rel, err := filepath.Rel(dir, pim.chain[0])
	if err == nil {
		err = checkParentPath(rel)
	}
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("parent image %s as seen from %s: %w", parent, dir, err)
	}
	var locks []*os.File
	for _, g := range pim.gdirs {
		l, err := lockShared(g, own)
		if err != nil {
			for _, l := range locks {
				l.Close()
			}
			return nil, nil, nil, nil, fmt.Errorf("parent image: %w", err)
		}
		if l != nil {
			locks = append(locks, l)
		}
	}
	idx := map[chunkHash]storedChunk{}
	bufs := pim.m.GetBuffers()
	if pim.m.GetFormatVersion() != FormatVersion {
		bufs = nil // its chunks are named by another hash: none can be referenced
	}
	for _, b := range bufs {
		for _, c := range b.GetChunks() {
			var depth uint32
			switch c.GetLocation() {
			case imagepb.Location_LOCATION_LOCAL:
				depth = 1
			case imagepb.Location_LOCATION_PARENT:
				depth = c.GetAncestor() + 1
			default:
				continue
			}
			if depth > MaxChainDepth {
				continue // written again, to bound the chain a reader resolves
			}
			h, _ := hashFromBytes(c.GetHash())
			if old, ok := idx[h]; ok && old.ancestor <= depth {
				continue
			}
			idx[h] = storedChunk{loc: imagepb.Location_LOCATION_PARENT, ancestor: depth,
				crc: c.GetCrc32C(), comp: c.GetCompression(), storedSize: c.GetStoredSize()}
		}
	}
	return &imagepb.Parent{Path: rel, ImageId: pim.m.GetImageId()}, idx, pim, locks, nil
}

// within says whether the directory d lies inside dir (both absolute,
// symlinks resolved).
func within(d, dir string) bool {
	rel, err := filepath.Rel(dir, d)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// AddProcess records a process the image is taken of, whether or not it
// has buffers (AddBuffer records its own process too). nsPid is its pid in
// its pid namespace, 0 if unknown.
func (w *Writer) AddProcess(pid, nsPid int) error {
	return w.AddProcessInfo(ProcessInfo{Pid: pid, NsPid: nsPid})
}

// procRec is what the image records of a process besides its buffers.
type procRec struct {
	ns      int
	gpus    []string
	imports []ImportInfo
	start   uint64
	served  bool
	script  *TemplateScript
}

// AddProcessInfo is AddProcess with the GPUs the process could see.
func (w *Writer) AddProcessInfo(p ProcessInfo) error {
	if p.Pid <= 0 || p.NsPid < 0 {
		return fmt.Errorf("process %d (ns pid %d): invalid pid", p.Pid, p.NsPid)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != stateOpen {
		return w.stateErrLocked()
	}
	if w.procs == nil {
		w.procs = map[int]procRec{}
	}
	r := w.procs[p.Pid]
	if p.NsPid != 0 || r.ns == 0 {
		r.ns = p.NsPid
	}
	if p.GPUs != nil {
		r.gpus = slices.Clone(p.GPUs)
	}
	if p.Imports != nil {
		r.imports = slices.Clone(p.Imports)
	}
	if p.StartTime != 0 {
		r.start = p.StartTime
	}
	r.served = r.served || p.Served
	w.procs[p.Pid] = r
	return nil
}

// ID is the image id the manifest will carry (Manifest.image_id): who keeps
// it can tell later whether the manifest in DIR is this write's.
func (w *Writer) ID() []byte { return append([]byte(nil), w.id...) }

// AddBuffer adds a buffer to the image; safe from many goroutines. The
// buffers appear in the manifest in the order of AddBuffer. Two buffers of
// one process may not overlap.
func (w *Writer) AddBuffer(info BufferInfo) (*BufferWriter, error) {
	if info.Address+info.Size < info.Address {
		return nil, fmt.Errorf("buffer 0x%x: size %d wraps the address space", info.Address, info.Size)
	}
	if info.Kind < AllocMemAlloc || info.Kind > AllocOther {
		return nil, fmt.Errorf("buffer 0x%x: unknown allocation kind %d", info.Address, int(info.Kind))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != stateOpen {
		return nil, w.stateErrLocked()
	}
	if err := w.reserveSpan(info); err != nil {
		return nil, err
	}
	n := chunkCount(info.Size, uint32(w.opts.ChunkSize))
	b := &BufferWriter{w: w, index: len(w.buffers), info: info, chunks: make([]chunkRecord, n),
		taken: make([]atomic.Bool, n)}
	w.buffers = append(w.buffers, b)
	return b, nil
}

// reserveSpan refuses a buffer overlapping one of the same process.
func (w *Writer) reserveSpan(info BufferInfo) error {
	spans := w.spans[info.Pid]
	i := sort.Search(len(spans), func(k int) bool { return spans[k].addr >= info.Address })
	clash := -1
	if i < len(spans) && (spans[i].addr == info.Address || info.Address+info.Size > spans[i].addr) {
		clash = i
	}
	if i > 0 && spans[i-1].addr+spans[i-1].size > info.Address {
		clash = i - 1
	}
	if clash >= 0 {
		return fmt.Errorf("buffer 0x%x+%d of pid %d overlaps buffer 0x%x+%d", info.Address, info.Size,
			info.Pid, spans[clash].addr, spans[clash].size)
	}
	spans = append(spans, span{})
	copy(spans[i+1:], spans[i:])
	spans[i] = span{info.Address, info.Size}
	w.spans[info.Pid] = spans
	return nil
}

func (w *Writer) stateErrLocked() error {
	switch w.state {
	case stateCommitted:
		return fmt.Errorf("image %s: already committed", w.dir)
	case stateAborted:
		return fmt.Errorf("image %s: %w", w.dir, errAborted)
	}
	return fmt.Errorf("write failed, commit impossible: %w", w.err)
}

// fail records the first failure: every later Write, AddBuffer and Commit
// returns it, and writers waiting for memory wake up.
func (w *Writer) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
		if w.state == stateOpen {
			w.state = stateFailed
		}
	}
	w.mu.Unlock()
	w.budget.fail(err)
}

func (w *Writer) failed() error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.state == stateOpen {
		return nil
	}
	return w.stateErrLocked()
}

// send hands a full chunk to the workers, unless the write is over.
func (w *Writer) send(j job) error {
	w.sendMu.RLock()
	defer w.sendMu.RUnlock()
	if err := w.failed(); err != nil {
		return err
	}
	if w.jobsClosed {
		return fmt.Errorf("image %s: buffer %d (0x%x): write after Commit", w.dir, j.bw.index, j.bw.info.Address)
	}
	w.budget.submit(j.charge)
	w.jobs <- j
	return nil
}

func (w *Writer) worker() {
	defer w.wg.Done()
	var scratch []byte // compression output, reused
	for j := range w.jobs {
		w.process(j, &scratch)
	}
}

func (w *Writer) process(j job, scratch *[]byte) {
	defer w.recycle(j.buf, j.charge, j.pooled, true)
	if w.failed() != nil {
		return // the write is lost anyway; drain quickly
	}
	w.storeChunk(j.bw, j.index, (*j.buf)[:j.n], scratch)
}

// storeChunk records chunk index of bw, whose bytes are raw: a zero flag, a
// reference to an equal chunk, or a new chunk file. A failure fails the
// Writer (naming the chunk) and is returned.
func (w *Writer) storeChunk(bw *BufferWriter, index int, raw []byte, scratch *[]byte) error {
	rec := &bw.chunks[index]
	if isZero(raw) {
		rec.zero = true
		return nil
	}
	return w.storeHashed(bw, index, raw, hashOf(raw), scratch)
}

// storeHashed is storeChunk of a chunk whose content hash h is known.
func (w *Writer) storeHashed(bw *BufferWriter, index int, raw []byte, h chunkHash, scratch *[]byte) error {
	rec := &bw.chunks[index]
	lc := rec.local
	if lc == nil || !rec.owner || rec.hash != h { // else RecordChunk claimed it for these bytes
		var owner bool
		lc, owner = w.store.claim(h)
		rec.hash, rec.local, rec.owner = h, lc, false
		if !owner {
			return nil
		}
		rec.owner = true
	}
	if file, err := w.store.resolve(lc, h, raw, scratch); err != nil {
		err = &ChunkError{Image: w.dir, Buffer: bw.index, Address: bw.info.Address,
			Chunk: index, File: file, Err: err}
		w.fail(err)
		return err
	}
	return nil
}

// recycle gives a chunk buffer back to the pool and its bytes to the budget.
func (w *Writer) recycle(buf *[]byte, charge int64, pooled, queued bool) {
	if pooled {
		w.pool.Put(buf)
	}
	w.budget.release(charge, queued)
}

// closeJobs stops the workers and waits for them; safe to call twice.
func (w *Writer) closeJobs() {
	w.sendMu.Lock()
	if !w.jobsClosed {
		w.jobsClosed = true
		close(w.jobs)
	}
	w.sendMu.Unlock()
	w.wg.Wait()
}

// release frees what the Writer holds once it is over (also a Writer that
// create gave up on half-made).
func (w *Writer) release() {
	if w.store != nil {
		if w.store.enc != nil {
			w.store.enc.Close()
		}
		w.store.close()
	}
	for _, l := range w.shared {
		l.Close()
	}
	if w.pim != nil {
		w.pim.Close()
	}
	if w.lock != nil {
		w.lock.Close()
	}
	w.g.close()
	w.top.close()
}

// Stats reports what the write did so far; exact after Commit.
func (w *Writer) Stats() WriteStats {
	w.mu.RLock()
	defer w.mu.RUnlock()
	s := WriteStats{Buffers: len(w.buffers), BytesIn: w.bytesIn.Load(), BytesStored: w.store.stored.Load()}
	if w.state == stateCommitted {
		for _, b := range w.buffers {
			for i := range b.chunks {
				countChunk(&s, &b.chunks[i])
			}
		}
	}
	return s
}

// Abort drops the unfinished write: temporary files and the chunk files
// this write created are removed; the image DIR held before (if any) stays
// intact and visible. Abort after Commit does nothing.
func (w *Writer) Abort() error {
	w.mu.Lock()
	if w.state == stateCommitted || w.state == stateAborted {
		w.mu.Unlock()
		return nil
	}
	w.state = stateAborted
	w.mu.Unlock()
	w.budget.fail(errAborted)
	w.closeJobs()
	defer w.release()
	return w.cleanup()
}

// cleanup removes the chunk files this write created. Its temporary files
// are gone already: each is renamed into place or removed by the worker
// that made it, and every worker has ended.
func (w *Writer) cleanup() error {
	w.removeParts()
	w.removeScripts()
	if err := w.store.removeCreated(); err != nil {
		return fmt.Errorf("image %s: clean up: %w", w.dir, err)
	}
	return nil
}
