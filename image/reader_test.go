package image

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// fxRewrite changes the committed manifest of dir with edit, keeping its
// checksum valid: what a buggy or malicious writer could produce.
func fxRewrite(t testing.TB, dir string, edit func(m *imagepb.Manifest)) {
	t.Helper()
	m, err := loadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	edit(m)
	data, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ManifestPath(dir), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadAtRandomRanges(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		dir := t.TempDir()
		data := fxRand(20, 50*1000+123)
		copy(data[9000:], make([]byte, 5000)) // a zero chunk inside
		copy(data[20000:], bytes.Repeat([]byte{1, 2, 3}, 3000))
		bufs := []fxBuf{{BufferInfo{Address: 0x10000000, Size: uint64(len(data))}, data}}
		fxWrite(t, dir, Options{ChunkSize: 1000, Compression: comp}, bufs)
		im, err := OpenWith(dir, ReadOptions{Workers: 3, Prefetch: 2})
		if err != nil {
			t.Fatal(err)
		}
		r, _ := im.OpenBuffer(0)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < 300; i++ {
			off := rng.IntN(len(data) + 10)
			p := make([]byte, rng.IntN(6000))
			n, err := r.ReadAt(p, int64(off))
			want := data[min(off, len(data)):min(off+len(p), len(data))]
			if n != len(want) || !bytes.Equal(p[:n], want) {
				t.Fatalf("ReadAt(%d, %d) = %d bytes, want %d (equal %v)", len(p), off, n, len(want), bytes.Equal(p[:n], want))
			}
			if (n < len(p)) != errors.Is(err, io.EOF) || (err != nil && !errors.Is(err, io.EOF)) {
				t.Fatalf("ReadAt(%d, %d): n %d, err %v", len(p), off, n, err)
			}
		}
		// Sequential reads with odd sizes, then WriteTo for the rest.
		var got bytes.Buffer
		p := make([]byte, 777)
		for got.Len() < 25000 {
			n, err := r.Read(p)
			if err != nil {
				t.Fatal(err)
			}
			got.Write(p[:n])
		}
		if _, err := io.Copy(&got, r); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), data) {
			t.Fatal("Read + WriteTo differ from the data")
		}
		if n, err := r.Read(p); n != 0 || err != io.EOF {
			t.Fatalf("Read at end: %d, %v", n, err)
		}
		r.Close()
	}
}

// Buffers can be read in any order, from several goroutines at once.
func TestReadBuffersAnyOrder(t *testing.T) {
	dir := t.TempDir()
	var bufs []fxBuf
	for i := 0; i < 6; i++ {
		bufs = append(bufs, fxBuf{BufferInfo{Pid: 1, Address: uint64(i+1) << 32, Size: 20000}, fxRand(uint64(30+i), 20000)})
	}
	fxWrite(t, dir, Options{ChunkSize: 4096}, bufs)
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error)
	for _, i := range []int{5, 2, 0, 3, 1, 4} {
		go func() {
			r, err := im.OpenBuffer(i)
			if err == nil {
				var got []byte
				got, err = io.ReadAll(r)
				if err == nil && !bytes.Equal(got, bufs[i].data) {
					err = errors.New("data differs")
				}
			}
			errs <- err
		}()
	}
	for range bufs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := im.OpenBuffer(6); err == nil {
		t.Error("OpenBuffer past the end")
	}
}

func TestOpenRefuses(t *testing.T) {
	root := t.TempDir()
	parent, child := filepath.Join(root, "p"), filepath.Join(root, "c")
	bufs := []fxBuf{{BufferInfo{Address: 0x100000, Size: 4 * 4096}, fxRand(40, 4*4096)}}
	fxWrite(t, parent, Options{ChunkSize: 4096}, bufs)
	fxWrite(t, child, Options{ChunkSize: 4096, Parent: parent}, bufs)
	pristine := filepath.Join(t.TempDir(), "pristine")
	fxCopyTree(t, root, pristine)
	reset := func() {
		os.RemoveAll(root)
		fxCopyTree(t, pristine, root)
	}

	if _, err := Open(filepath.Join(root, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no image: %v", err)
	}

	cases := []struct {
		name string
		edit func(m *imagepb.Manifest)
		want error
	}{
		{"absolute parent", func(m *imagepb.Manifest) { m.Parent.Path = parent }, ErrCorrupt},
		{"unclean parent", func(m *imagepb.Manifest) { m.Parent.Path = "../c/../p" }, ErrCorrupt},
		{"self parent", func(m *imagepb.Manifest) { m.Parent.Path = "." }, ErrCorrupt},
		{"loop", func(m *imagepb.Manifest) { m.Parent.Path = "../c" }, ErrCorrupt},
		{"missing parent", func(m *imagepb.Manifest) { m.Parent.Path = "../gone" }, ErrMissingParent},
		{"replaced parent", func(m *imagepb.Manifest) { m.Parent.ImageId = make([]byte, 16) }, ErrMissingParent},
		{"short hash", func(m *imagepb.Manifest) { m.Buffers[0].Chunks[0].Hash = m.Buffers[0].Chunks[0].Hash[:15] }, ErrCorrupt},
		{"no location", func(m *imagepb.Manifest) { m.Buffers[0].Chunks[1].Location = 0 }, ErrCorrupt},
		{"deep ancestor", func(m *imagepb.Manifest) { m.Buffers[0].Chunks[1].Ancestor = 2 }, ErrMissingParent},
		{"huge ancestor", func(m *imagepb.Manifest) { m.Buffers[0].Chunks[1].Ancestor = 1 << 30 }, ErrCorrupt},
		{"missing chunk", func(m *imagepb.Manifest) { m.Buffers[0].Chunks = m.Buffers[0].Chunks[:3] }, ErrCorrupt},
		{"size lie", func(m *imagepb.Manifest) { m.Buffers[0].Size++ }, ErrCorrupt},
		{"chunk size", func(m *imagepb.Manifest) { m.ChunkSize = 0 }, ErrCorrupt},
		{"stored size", func(m *imagepb.Manifest) { m.Buffers[0].Chunks[0].StoredSize = 1 }, ErrCorrupt},
		{"kind", func(m *imagepb.Manifest) { m.Buffers[0].Kind = 77 }, ErrCorrupt},
		{"overlap", func(m *imagepb.Manifest) {
			b := proto.Clone(m.Buffers[0]).(*imagepb.Buffer)
			b.Address += 4096
			m.Buffers = append(m.Buffers, b)
		}, ErrCorrupt},
	}
	for _, c := range cases {
		reset()
		fxRewrite(t, child, c.edit)
		_, err := Open(child)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Open = %v, want %v", c.name, err, c.want)
			continue
		}
		var me *ManifestError
		if !errors.As(err, &me) {
			t.Errorf("%s: %v is no *ManifestError", c.name, err)
		}
	}

	// A hash never becomes a path, whatever bytes it has.
	reset()
	fxRewrite(t, child, func(m *imagepb.Manifest) {
		m.Buffers[0].Chunks[0].Location = imagepb.Location_LOCATION_LOCAL
		m.Buffers[0].Chunks[0].Ancestor = 0
		m.Buffers[0].Chunks[0].Hash = []byte("../../../../etc/")
	})
	if _, err := fxReadAll(child); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "2e2e2f") {
		t.Errorf("hash with slashes: %v", err)
	}

	reset()
	data, _ := os.ReadFile(ManifestPath(child))
	var file imagepb.ManifestFile
	proto.Unmarshal(data, &file)
	file.FormatVersion = FormatVersion + 1
	data, _ = proto.Marshal(&file)
	os.WriteFile(ManifestPath(child), data, 0o644)
	if _, err := Open(child); !errors.Is(err, ErrVersion) {
		t.Errorf("version 2: %v", err)
	}

	reset()
	os.RemoveAll(parent)
	if _, err := Open(child); !errors.Is(err, ErrMissingParent) {
		t.Errorf("parent deleted: %v", err)
	}

	reset()
	fxWrite(t, parent, Options{ChunkSize: 4096}, bufs) // a new image in the parent's place
	if _, err := Open(child); !errors.Is(err, ErrMissingParent) || !strings.Contains(err.Error(), "another image") {
		t.Errorf("parent replaced: %v", err)
	}

	reset()
	if _, err := Create(filepath.Join(root, "c2"), fxOrigin(), Options{Parent: filepath.Join(root, "none")}); err == nil {
		t.Error("Create with a missing parent succeeded")
	}
	if _, err := Create(child, fxOrigin(), Options{Parent: child}); err == nil {
		t.Error("Create with itself as parent succeeded")
	}
}

func TestVerifyNamesDamagedChunk(t *testing.T) {
	dir := t.TempDir()
	bufs := []fxBuf{
		{BufferInfo{Address: 0x100000, Size: 3 * 4096}, fxRand(50, 3*4096)},
		{BufferInfo{Address: 0x900000, Size: 3 * 4096}, fxRand(51, 3*4096)},
	}
	fxWrite(t, dir, Options{ChunkSize: 4096}, bufs)
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Verify(); err != nil {
		t.Fatal(err)
	}
	file := im.ChunkFile(1, 2)
	data, _ := os.ReadFile(file)
	data[100] ^= 0x10
	os.WriteFile(file, data, 0o644)
	err = im.Verify()
	var ce *ChunkError
	if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) || ce.Buffer != 1 || ce.Chunk != 2 || ce.File != file || ce.Address != 0x900000 {
		t.Fatalf("Verify: %v (%+v)", err, ce)
	}
	if !strings.Contains(err.Error(), "buffer 1 (0x900000) chunk 2") || !strings.Contains(err.Error(), "content hash") {
		t.Errorf("message: %v", err)
	}
	r, _ := im.OpenBuffer(1)
	if _, err := io.ReadAll(r); !errors.As(err, &ce) || ce.Chunk != 2 {
		t.Errorf("Read of the damaged buffer: %v", err)
	}
	os.Remove(file)
	if err := im.Verify(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Verify with a missing chunk: %v", err)
	}
}

func TestDiff(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	d1, d2 := fxRand(60, 4*4096), fxRand(61, 2*4096)
	d1b := append([]byte(nil), d1...)
	d1b[4096+5] ^= 1
	zero := make([]byte, 4096)
	fxWrite(t, a, Options{ChunkSize: 4096}, []fxBuf{
		{BufferInfo{Pid: 1, Address: 0x1000000, Size: uint64(len(d1))}, d1},
		{BufferInfo{Pid: 1, Address: 0x2000000, Size: uint64(len(d2))}, d2},
		{BufferInfo{Pid: 1, Address: 0x3000000, Size: 4096}, zero},
	})
	fxWrite(t, b, Options{ChunkSize: 4096, Parent: a}, []fxBuf{
		{BufferInfo{Pid: 1, Address: 0x1000000, Size: uint64(len(d1))}, d1b},
		{BufferInfo{Pid: 1, Address: 0x3000000, Size: 4096}, zero},
		{BufferInfo{Pid: 2, Address: 0x2000000, Size: uint64(len(d2))}, d2},
	})
	ia, _ := Open(a)
	ib, _ := Open(b)
	rep, err := Diff(ia, ib)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unchanged != 1 || len(rep.OnlyA) != 1 || len(rep.OnlyB) != 1 || len(rep.Changed) != 1 {
		t.Fatalf("report %+v", rep)
	}
	c := rep.Changed[0]
	if c.IndexA != 0 || c.IndexB != 0 || c.InfoChanged || len(c.ChunksChanged) != 1 || c.ChunksChanged[0] != 1 || c.BytesChanged != 4096 {
		t.Fatalf("changed %+v", c)
	}
	if rep, _ := Diff(ia, ia); rep.Unchanged != 3 || len(rep.Changed)+len(rep.OnlyA)+len(rep.OnlyB) != 0 {
		t.Fatalf("self diff %+v", rep)
	}
}

// asFormat1 rewrites the committed image in dir (uncompressed, no parent)
// as format 1 wrote it: chunk files named by their xxh3-128, and a CRC32C
// for every stored chunk (crcOf gives it).
func asFormat1(t *testing.T, dir string, crcOf func(c *imagepb.Chunk, file string) uint32) {
	t.Helper()
	m, err := loadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.FormatVersion = 1
	renamed := map[string]bool{}
	for _, b := range m.GetBuffers() {
		for _, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_ZERO {
				continue
			}
			if c.GetLocation() != imagepb.Location_LOCATION_LOCAL || c.GetCompression() != imagepb.Compression_COMPRESSION_NONE {
				t.Fatal("asFormat1: only uncompressed images without a parent")
			}
			h, _ := hashFromBytes(c.GetHash())
			old := chunkPath(dir, h)
			data, err := os.ReadFile(old)
			if err != nil {
				t.Fatal(err)
			}
			x := hashFor(1, data)
			c.Hash = x[:]
			file := chunkPath(dir, x)
			if !renamed[old] {
				renamed[old] = true
				if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(old, file); err != nil {
					t.Fatal(err)
				}
			}
			c.Crc32C = crcOf(c, file)
		}
	}
	data, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ManifestPath(dir), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Images written before format 2 stay readable, and Verify still checks the
// CRC32C they carry for uncompressed chunks.
func TestReadsFormat1(t *testing.T) {
	dir := t.TempDir()
	bufs := []fxBuf{{BufferInfo{Address: 0x100000, Size: 3 * 4096}, fxRand(60, 3*4096)}}
	fxWrite(t, dir, Options{ChunkSize: 4096}, bufs)
	fileCRC := func(c *imagepb.Chunk, file string) uint32 {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return crc32.Checksum(data, castagnoli)
	}
	asFormat1(t, dir, fileCRC)
	fxCheck(t, dir, bufs)
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if v := im.Manifest().GetFormatVersion(); v != 1 {
		t.Fatalf("format %d after rewriting as 1", v)
	}
	if err := im.Verify(); err != nil {
		t.Fatalf("Verify of an intact format 1 image: %v", err)
	}

	// A wrong CRC on an uncompressed chunk: reads (hash-checked) still work,
	// Verify names the CRC.
	asFormat1(t, dir, func(c *imagepb.Chunk, file string) uint32 { return fileCRC(c, file) ^ 1 })
	fxCheck(t, dir, bufs)
	if im, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	if err := im.Verify(); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "CRC32C") {
		t.Fatalf("Verify with wrong format 1 CRCs: %v", err)
	}
}

// Format 2 writes no CRC for uncompressed chunks and one for compressed ones.
func TestFormat2CRCOnlyForCompressed(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		dir := t.TempDir()
		data := make([]byte, 4*4096)
		copy(data, fxRand(61, 4096)) // one incompressible chunk, then zeros...
		for i := 4096; i < len(data); i++ {
			data[i] = byte(i / 7) // ...and compressible ones
		}
		fxWrite(t, dir, Options{ChunkSize: 4096, Compression: comp}, []fxBuf{{BufferInfo{Address: 0x100000, Size: uint64(len(data))}, data}})
		im, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if v := im.Manifest().GetFormatVersion(); v != FormatVersion {
			t.Fatalf("wrote format %d", v)
		}
		compressed := 0
		for _, c := range im.Manifest().GetBuffers()[0].GetChunks() {
			isComp := c.GetCompression() == imagepb.Compression_COMPRESSION_ZSTD
			if isComp {
				compressed++
			}
			if isComp != (c.GetCrc32C() != 0) {
				t.Errorf("compression %v with CRC %08x", c.GetCompression(), c.GetCrc32C())
			}
		}
		if (comp == CompressionZstd) != (compressed > 0) {
			t.Errorf("compression %v: %d compressed chunks", comp, compressed)
		}
		if err := im.Verify(); err != nil {
			t.Error(err)
		}
	}
}

// CheckFiles finds missing, truncated and replaced chunk files without
// reading them; damage inside a file is left to the reads.
func TestCheckFiles(t *testing.T) {
	dir := t.TempDir()
	bufs := []fxBuf{{BufferInfo{Address: 0x100000, Size: 4 * 4096}, fxRand(62, 4*4096)}}
	fxWrite(t, dir, Options{ChunkSize: 4096}, bufs)
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := im.CheckFiles(); err != nil {
		t.Fatalf("intact image: %v", err)
	}
	file := im.ChunkFile(0, 1)
	data, _ := os.ReadFile(file)

	data[7] ^= 1 // same size: not CheckFiles' business
	os.WriteFile(file, data, 0o644)
	if err := im.CheckFiles(); err != nil {
		t.Errorf("flipped bit: %v", err)
	}
	for _, tc := range []struct {
		name, want string
		damage     func()
	}{
		{"truncated", "has 4095 bytes", func() { os.WriteFile(file, data[:4095], 0o644) }},
		{"missing", "missing", func() { os.Remove(file) }},
		{"symlink", "symlink", func() { os.Remove(file); os.Symlink(im.ChunkFile(0, 0), file) }},
	} {
		tc.damage()
		err := im.CheckFiles()
		var ce *ChunkError
		if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) || ce.Chunk != 1 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
		os.Remove(file)
		os.WriteFile(file, data, 0o644)
	}
}

// The manifest lists every process the image was taken of, those without
// buffers too; older manifests (no list) give the buffers' pids.
func TestProcesses(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, fxOrigin(), Options{ChunkSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]int{{30, 3}, {10, 0}, {30, 0}} { // a later 0 does not erase a known ns pid
		if err := w.AddProcess(p[0], p[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.AddProcess(0, 0); err == nil {
		t.Error("AddProcess(0) accepted")
	}
	gpus := []string{"GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"}
	imports := []ImportInfo{{Address: 0x7000, Size: 4096, OwnerPid: 20, OwnerAddress: 0x1000}}
	if err := w.AddProcessInfo(ProcessInfo{Pid: 10, GPUs: gpus, Imports: imports, Served: true}); err != nil {
		t.Fatal(err)
	}
	bw, err := w.AddBuffer(BufferInfo{Pid: 20, NsPid: 2, Address: 0x1000, Size: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := bw.WriteChunk(0, fxRand(63, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := w.AddProcess(40, 0); err == nil {
		t.Error("AddProcess after Commit accepted")
	}
	im, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []ProcessInfo{{10, 0, gpus, imports, 0, true, false}, {20, 2, nil, nil, 0, false, false}, {30, 3, nil, nil, 0, false, false}}
	if got := im.Processes(); !reflect.DeepEqual(got, want) {
		t.Errorf("Processes() = %v, want %v", got, want)
	}

	// Written before the list existed: the buffers' owners.
	m, err := loadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.Processes = nil
	writeManifestForTest(t, dir, m)
	if im, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	if got := im.Processes(); !reflect.DeepEqual(got, []ProcessInfo{{20, 2, nil, nil, 0, false, false}}) {
		t.Errorf("without a process list: %v", got)
	}

	// A list that is not sorted, or repeats a pid, is damage.
	for _, bad := range [][]*imagepb.Process{{{Pid: 5}, {Pid: 4}}, {{Pid: 5}, {Pid: 5}}, {{Pid: -1}}} {
		m.Processes = bad
		writeManifestForTest(t, dir, m)
		if _, err := Open(dir); !errors.Is(err, ErrCorrupt) {
			t.Errorf("process list %v: Open: %v", bad, err)
		}
	}
}

func writeManifestForTest(t *testing.T, dir string, m *imagepb.Manifest) {
	t.Helper()
	data, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ManifestPath(dir), data, 0o644); err != nil {
		t.Fatal(err)
	}
}
