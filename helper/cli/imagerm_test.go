package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/image"
)

// A self-contained incremental image's linked chunks are the parent's in
// inspect, and not stored here.
func TestImageInspectLinkedChunks(t *testing.T) {
	root := t.TempDir()
	parent, child := filepath.Join(root, "1"), filepath.Join(root, "2")
	p := chunks(1, "rrr0")
	writeImage(t, parent, "", testBuf{pid: 4242, addr: 0x7f0000000000, data: p})
	c := append(p[:3*testChunk:3*testChunk], chunks(9, "r")...)
	w, err := image.Create(child, testOrigin, image.Options{ChunkSize: testChunk, Parent: parent, SelfContained: true})
	if err != nil {
		t.Fatal(err)
	}
	writeBuf(t, w, testBuf{pid: 4242, addr: 0x7f0000000000, data: c})
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "image", "inspect", child, "--json")
	if code != ExitOK {
		t.Fatalf("inspect: exit %d, %s", code, errOut)
	}
	var doc inspectDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if got, want := doc.Totals.Chunks, (chunkCounts{Total: 4, Here: 1, Parent: 3}); got != want || doc.Totals.StoredBytes != testChunk {
		t.Errorf("chunks %+v, stored %d; want %+v and one chunk stored", got, doc.Totals.StoredBytes, want)
	}
}

// gpucr image rm removes images whole, an old series (images that read
// their ancestors' files) in any order, and says what it freed; it refuses
// what is no image.
func TestImageRm(t *testing.T) {
	parent, child := parentAndChild(t) // child reads chunks from parent
	code, out, errOut := runCLI(t, "image", "rm", parent)
	if code == ExitOK || !strings.Contains(errOut, "still reads chunks from it") {
		t.Fatalf("rm of a parent another image reads: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "image", "rm", parent, child)
	if code != ExitOK || strings.Count(out, "removed ") != 2 {
		t.Fatalf("rm of both: exit %d\n%s%s", code, out, errOut)
	}
	for _, d := range []string{parent, child} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s is still there", d)
		}
	}
	plain := t.TempDir()
	code, _, errOut = runCLI(t, "image", "rm", plain)
	if code == ExitOK || !strings.Contains(errOut, "not an image directory") {
		t.Errorf("rm of a directory that is no image: exit %d, %s", code, errOut)
	}
}
