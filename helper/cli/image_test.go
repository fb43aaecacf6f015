package cli

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/image"
)

// testChunk is the chunk size of the test images: small, so a buffer of a
// few chunks stays tiny.
const testChunk = 4 << 10

// testBuf is one buffer of a test image.
type testBuf struct {
	pid  int
	addr uint64
	data []byte
}

var testOrigin = image.Origin{
	Host: "node7", GPUModel: "NVIDIA H100 80GB HBM3", GPUUUID: "GPU-0d1c5e3a",
	DriverVersion: "580.159.04", Pid: 4242, Time: time.Date(2025, 11, 25, 21, 55, 0, 0, time.UTC),
}

// writeImage commits an image of bufs in dir (with parent, if not "").
func writeImage(t *testing.T, dir, parent string, bufs ...testBuf) {
	t.Helper()
	w, err := image.Create(dir, testOrigin, image.Options{ChunkSize: testChunk, Parent: parent})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bufs {
		writeBuf(t, w, b)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
}

func writeBuf(t *testing.T, w *image.Writer, b testBuf) {
	t.Helper()
	bw, err := w.AddBuffer(image.BufferInfo{Pid: b.pid, Device: 0, GPUUUID: testOrigin.GPUUUID,
		Address: b.addr, Size: uint64(len(b.data)), Kind: image.AllocVMM})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bw.Write(b.data); err != nil {
		t.Fatal(err)
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
}

// chunks builds buffer data chunk by chunk: 'r' a random chunk (seeded by
// its position and seed), '0' a zero chunk, 'a' always the same chunk.
func chunks(seed uint64, pattern string) []byte {
	out := make([]byte, 0, len(pattern)*testChunk)
	for i, c := range pattern {
		chunk := make([]byte, testChunk)
		switch c {
		case 'r':
			r := rand.New(rand.NewPCG(seed, uint64(i)))
			for j := range chunk {
				chunk[j] = byte(r.Uint32())
			}
		case 'a':
			for j := range chunk {
				chunk[j] = byte(j * 7)
			}
		}
		out = append(out, chunk...)
	}
	return out
}

// oneLineErr checks a failed command: the exit code, nothing on stdout, and
// exactly one line on stderr that contains every want.
func oneLineErr(t *testing.T, code int, out, errOut string, wantCode int, want ...string) {
	t.Helper()
	if code != wantCode {
		t.Fatalf("exit code %d, want %d (stdout %q, stderr %q)", code, wantCode, out, errOut)
	}
	if out != "" {
		t.Errorf("stdout not empty on error: %q", out)
	}
	if strings.Count(errOut, "\n") != 1 || !strings.HasSuffix(errOut, "\n") {
		t.Errorf("error is not one line: %q", errOut)
	}
	for _, w := range want {
		if !strings.Contains(errOut, w) {
			t.Errorf("error %q does not contain %q", errOut, w)
		}
	}
}

// parentAndChild writes a parent image and a child that keeps some of its
// chunks, the shapes inspect must classify:
//
//	parent: buffer 0x7f0000000000 = r a 0 a r  (a stored once, then dedup; one zero)
//	child:  buffer 0x7f0000000000 = r a 0 a R  (first four chunks as in the parent)
//	        buffer 0x7f0000100000 = r          (new)
func parentAndChild(t *testing.T) (parent, child string) {
	root := t.TempDir()
	parent, child = filepath.Join(root, "ck1"), filepath.Join(root, "ck2")
	p := chunks(1, "ra0ar")
	writeImage(t, parent, "", testBuf{pid: 4242, addr: 0x7f0000000000, data: p})
	c := append(p[:4*testChunk:4*testChunk], chunks(9, "r")...)
	writeImage(t, child, parent,
		testBuf{pid: 4242, addr: 0x7f0000000000, data: c},
		testBuf{pid: 4243, addr: 0x7f0000100000, data: chunks(5, "r")})
	return parent, child
}

func TestImageInspect(t *testing.T) {
	parent, child := parentAndChild(t)

	code, out, errOut := runCLI(t, "image", "inspect", parent)
	if code != ExitOK {
		t.Fatalf("inspect: exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		fmt.Sprintf("version %d", image.FormatVersion), "host node7", "pid 4242", "2025-11-25T21:55:00Z",
		"NVIDIA H100 80GB HBM3 (GPU-0d1c5e3a), driver 580.159.04", "parent:      none",
		"process 4242, device 0", "0x7f0000000000", "20 KiB", "vmm",
		"chunks:      5: 3 here, 0 in parent, 1 zero, 1 dedup",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}

	// Flags after the directory, as documented.
	code, out, errOut = runCLI(t, "image", "inspect", child, "--json")
	if code != ExitOK {
		t.Fatalf("inspect --json: exit %d, stderr %q", code, errOut)
	}
	var doc inspectDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("inspect --json is not JSON: %v\n%s", err, out)
	}
	if doc.FormatVersion != image.FormatVersion || doc.Origin.Host != "node7" || doc.Origin.Pid != 4242 ||
		doc.Origin.GPUUUID != "GPU-0d1c5e3a" || doc.Origin.DriverVersion != "580.159.04" || doc.ChunkSize != testChunk {
		t.Errorf("inspect --json header: %+v", doc)
	}
	if doc.Parent == "" || doc.ParentPath != parent {
		t.Errorf("parent %q resolved to %q, want %q", doc.Parent, doc.ParentPath, parent)
	}
	if len(doc.Buffers) != 2 || doc.Buffers[0].Address != "0x7f0000000000" || doc.Buffers[1].Pid != 4243 {
		t.Fatalf("buffers: %+v", doc.Buffers)
	}
	// r a 0 a R against the parent: r and both a's from the parent, R new.
	if got, want := doc.Buffers[0].Chunks, (chunkCounts{Total: 5, Here: 1, Parent: 3, Zero: 1}); got != want {
		t.Errorf("buffer 0 chunks %+v, want %+v", got, want)
	}
	if got, want := doc.Totals.Chunks, (chunkCounts{Total: 6, Here: 2, Parent: 3, Zero: 1}); got != want {
		t.Errorf("total chunks %+v, want %+v", got, want)
	}
	if doc.Totals.LogicalBytes != 6*testChunk || doc.Totals.StoredBytes != 2*testChunk || doc.Totals.DedupRatio != 3 {
		t.Errorf("totals %+v, want 24 KiB logical, 8 KiB stored, ratio 3", doc.Totals)
	}
}

func TestImageVerify(t *testing.T) {
	_, child := parentAndChild(t)
	code, out, errOut := runCLI(t, "image", "verify", child)
	if code != ExitOK || !strings.HasPrefix(out, "ok: ") || !strings.Contains(out, "2 buffers, 6 chunks") {
		t.Fatalf("verify of a sound image: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = runCLI(t, "image", "verify", "--json", child)
	var doc verifyDoc
	if code != ExitOK || json.Unmarshal([]byte(out), &doc) != nil || !doc.OK || len(doc.Problems) != 0 {
		t.Fatalf("verify --json of a sound image: exit %d, %s", code, out)
	}
}

// A flipped bit in a chunk file: verify must fail and name the buffer, the
// chunk and the file.
func TestImageVerifyCorruptChunk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	writeImage(t, dir, "",
		testBuf{pid: 1, addr: 0x7f0000000000, data: chunks(1, "rr")},
		testBuf{pid: 1, addr: 0x7f0000200000, data: chunks(2, "r0rr")})
	im, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	file := im.ChunkFile(1, 2)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0x10
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runCLI(t, "image", "verify", dir)
	if code != ExitFailure {
		t.Fatalf("verify of a corrupt image: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	name := filepath.Base(file)
	for _, want := range []string{"buffer 1", "0x7f0000200000", "chunk 2", name} {
		if !strings.Contains(out, want) || !strings.Contains(errOut, want) {
			t.Errorf("verify does not name %q:\nstdout %q\nstderr %q", want, out, errOut)
		}
	}
	if strings.Count(errOut, "\n") != 1 {
		t.Errorf("error is not one line: %q", errOut)
	}

	code, out, _ = runCLI(t, "image", "verify", dir, "--json")
	var doc verifyDoc
	if code != ExitFailure || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("verify --json of a corrupt image: exit %d, %q", code, out)
	}
	if doc.OK || len(doc.Problems) != 1 || doc.Problems[0].Buffer != 1 || doc.Problems[0].Chunk != 2 ||
		!strings.HasSuffix(doc.Problems[0].File, name) {
		t.Errorf("verify --json problems: %+v", doc)
	}
}

func TestImageBadInput(t *testing.T) {
	root := t.TempDir()
	notDir := filepath.Join(root, "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(root, "criu-only")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}

	// A write that never committed: the writer is still open when we look.
	unfinished := filepath.Join(root, "unfinished")
	w, err := image.Create(unfinished, testOrigin, image.Options{ChunkSize: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	writeBuf(t, w, testBuf{pid: 1, addr: 0x1000, data: chunks(1, "rr")})
	t.Cleanup(func() { _ = w.Abort() })

	damaged := filepath.Join(root, "damaged")
	writeImage(t, damaged, "", testBuf{pid: 1, addr: 0x1000, data: chunks(1, "rr")})
	mf := filepath.Join(damaged, image.SubDir, "manifest.pb")
	b, err := os.ReadFile(mf)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(mf, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// A child whose parent directory is gone.
	_, orphan := parentAndChild(t)
	if err := os.RemoveAll(filepath.Join(filepath.Dir(orphan), "ck1")); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		dir  string
		want string
	}{
		{filepath.Join(root, "missing"), "no such directory"},
		{notDir, "not a directory"},
		{empty, "not a gpucr image"},
		{unfinished, "unfinished image write"},
		{damaged, "damaged"},
		{orphan, "parent image missing"},
	}
	for _, c := range cases {
		for _, cmd := range []string{"inspect", "verify"} {
			t.Run(cmd+"/"+filepath.Base(c.dir), func(t *testing.T) {
				code, out, errOut := runCLI(t, "image", cmd, c.dir)
				oneLineErr(t, code, out, errOut, ExitFailure, c.dir, c.want)
			})
		}
	}
	code, out, errOut := runCLI(t, "image", "diff", damaged, empty)
	oneLineErr(t, code, out, errOut, ExitFailure, "damaged")
	code, out, errOut = runCLI(t, "image", "gc", empty)
	oneLineErr(t, code, out, errOut, ExitFailure, "not a gpucr image")
}

func TestImageUsage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ck")
	writeImage(t, dir, "", testBuf{pid: 1, addr: 0x1000, data: chunks(1, "r")})
	for _, args := range [][]string{
		{"image"},
		{"image", "frob"},
		{"image", "inspect"},
		{"image", "inspect", dir, dir},
		{"image", "inspect", "--bogus", dir},
		{"image", "inspect", dir, "--bogus"},
		{"image", "verify"},
		{"image", "diff", dir},
		{"image", "diff", dir, dir, dir},
		{"image", "gc"},
		{"image", "gc", "--dry-run"},
	} {
		code, _, errOut := runCLI(t, args...)
		if code != ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, ExitUsage, errOut)
		}
	}
	if code, out, _ := runCLI(t, "image", "inspect", dir, "-h"); code != ExitOK || !strings.Contains(out, "inspect") {
		t.Errorf("inspect DIR -h: exit %d, %q", code, out)
	}
}

func TestImageDiff(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	kept, changed := chunks(1, "rrrr"), chunks(2, "rr0r")
	writeImage(t, a, "",
		testBuf{pid: 7, addr: 0x7f0000000000, data: kept},
		testBuf{pid: 7, addr: 0x7f0000100000, data: changed},
		testBuf{pid: 7, addr: 0x7f0000200000, data: chunks(3, "r")})
	changed2 := append([]byte(nil), changed...)
	changed2[testChunk+5] ^= 1        // chunk 1
	copy(changed2[2*testChunk:], "x") // chunk 2 (was zero)
	writeImage(t, b, "",
		testBuf{pid: 7, addr: 0x7f0000000000, data: kept},
		testBuf{pid: 7, addr: 0x7f0000100000, data: changed2},
		testBuf{pid: 8, addr: 0x7f0000300000, data: chunks(4, "rr")})

	code, out, errOut := runCLI(t, "image", "diff", a, b)
	if code != ExitOK {
		t.Fatalf("diff: exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"added    pid 8 device 0 0x7f0000300000 8 KiB vmm",
		"removed  pid 7 device 0 0x7f0000200000 4 KiB vmm",
		"changed  pid 7 device 0 0x7f0000100000 16 KiB vmm: 2 of 4 chunks differ (8 KiB)",
		"summary: 1 added, 1 removed, 1 changed (8 KiB), 1 unchanged",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("diff output lacks %q:\n%s", want, out)
		}
	}

	code, out, _ = runCLI(t, "image", "diff", "--json", a, b)
	var doc diffDoc
	if code != ExitOK || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("diff --json: exit %d, %q", code, out)
	}
	if len(doc.Added) != 1 || len(doc.Removed) != 1 || len(doc.Changed) != 1 || doc.Unchanged != 1 {
		t.Fatalf("diff --json: %+v", doc)
	}
	if ch := doc.Changed[0]; ch.ChunksChanged != 2 || ch.Chunks != 4 || ch.BytesChanged != 2*testChunk ||
		len(ch.ChangedChunks) != 2 || ch.ChangedChunks[0] != 1 || ch.ChangedChunks[1] != 2 {
		t.Errorf("changed buffer: %+v", ch)
	}

	// An image against itself: nothing differs.
	code, out, _ = runCLI(t, "image", "diff", a, a)
	if code != ExitOK || !strings.Contains(out, "summary: 0 added, 0 removed, 0 changed (0 B), 3 unchanged") {
		t.Errorf("diff A A: exit %d\n%s", code, out)
	}
}

// Rewriting an image in the same directory leaves none of the old image's
// chunks (the write removes them once it is committed); those of a write
// that died there stay: gc --dry-run lists them, gc removes them, the
// image stays sound.
func TestImageGC(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ck")
	writeImage(t, dir, "", testBuf{pid: 1, addr: 0x1000, data: chunks(3, "rrr")})
	writeImage(t, dir, "", testBuf{pid: 1, addr: 0x1000, data: chunks(2, "rr")})
	countChunks := func() int {
		files, _ := filepath.Glob(filepath.Join(dir, image.SubDir, "chunks", "*", "*"))
		return len(files)
	}
	if n := countChunks(); n != 2 {
		t.Fatalf("%d chunk files after the rewrite, want the new image's 2", n)
	}
	dead := filepath.Join(root, "dead")
	writeImage(t, dead, "", testBuf{pid: 1, addr: 0x1000, data: chunks(1, "rrr")})
	files, _ := filepath.Glob(filepath.Join(dead, image.SubDir, "chunks", "*", "*"))
	for _, f := range files {
		rel, _ := filepath.Rel(dead, f)
		to := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f, to); err != nil {
			t.Fatal(err)
		}
	}
	if n := countChunks(); n != 5 {
		t.Fatalf("%d chunk files before gc, want 5", n)
	}

	code, out, errOut := runCLI(t, "image", "gc", "--dry-run", dir)
	if code != ExitOK || !strings.Contains(out, "dry run") ||
		!strings.Contains(out, "2 chunk files kept, would remove 3 (12 KiB)") ||
		!strings.Contains(out, "would free 12 KiB (12288 bytes)") {
		t.Fatalf("gc --dry-run: exit %d, stderr %q\n%s", code, errOut, out)
	}
	if n := countChunks(); n != 5 {
		t.Fatalf("gc --dry-run removed files: %d left", n)
	}

	code, out, errOut = runCLI(t, "image", "gc", dir, "--json")
	var doc gcDoc
	if code != ExitOK || json.Unmarshal([]byte(out), &doc) != nil {
		t.Fatalf("gc --json: exit %d, stderr %q, %q", code, errOut, out)
	}
	if doc.DryRun || doc.ChunksRemoved != 3 || doc.BytesFreed != 3*testChunk || len(doc.Dirs) != 1 || !doc.Dirs[0].Kept {
		t.Errorf("gc --json: %+v", doc)
	}
	if n := countChunks(); n != 2 {
		t.Errorf("%d chunk files after gc, want 2", n)
	}
	if code, _, errOut := runCLI(t, "image", "verify", dir); code != ExitOK {
		t.Errorf("verify after gc: exit %d, %q", code, errOut)
	}
}
