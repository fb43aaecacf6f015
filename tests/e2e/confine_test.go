package e2e

// gc and --auto-parent act only on the images of the user a path belongs to.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// writeChain writes root's images a -> b into dir (b changes one of a's two
// chunks, so that gc of b alone prunes a) and returns them.
func writeChain(t *testing.T, dir string) (a, b string) {
	t.Helper()
	write := func(d, parent string, second byte) {
		w, err := image.Create(d, image.Origin{Pid: 1, Time: time.Now()}, image.Options{Parent: parent})
		if err != nil {
			t.Fatal(err)
		}
		bw, err := w.AddBuffer(image.BufferInfo{Pid: 1, Address: 0x7f0000000000, Size: 2 * image.DefaultChunkSize})
		if err != nil {
			t.Fatal(err)
		}
		one := make([]byte, image.DefaultChunkSize)
		for i := range one {
			one[i] = byte(i)
		}
		two := make([]byte, image.DefaultChunkSize)
		for i := range two {
			two[i] = second
		}
		if _, err := bw.Write(append(one, two...)); err != nil {
			t.Fatal(err)
		}
		if err := bw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	a, b = filepath.Join(dir, "a"), filepath.Join(dir, "b")
	write(a, "", 1)
	write(b, a, 2)
	return a, b
}

func chunkFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	_ = filepath.Walk(filepath.Join(dir, "gpucr", "chunks"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n++
		}
		return nil
	})
	return n
}

// TestGCThroughAnothersSymlink: the second user's "image" is a symlink to
// root's newest incremental image. Root's `gpucr image gc` of that path is
// refused, saying the path's owner is not the image's, and root's parent
// image is neither pruned nor loses a chunk.
func TestGCThroughAnothersSymlink(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	a, b := writeChain(t, filepath.Join(dir, "root-series"))
	before := chunkFiles(t, a)
	home := userDir(t, u, filepath.Join(dir, "home"))
	link := filepath.Join(home, "img")
	mustAsOther(t, u, "ln", "-s", b, link)

	out, err := runErr(time.Minute, nil, binPath(t, "gpucr"), "image", "gc", link)
	if err == nil || !strings.Contains(out, "belongs to uid 0, not to uid "+strconv.Itoa(int(u.UID))) {
		t.Errorf("gc of the second user's symlink to root's image: %v\n%s", err, out)
	}
	if _, err := image.Open(a); err != nil {
		t.Errorf("root's parent image after gc: %v", err)
	}
	if n := chunkFiles(t, a); n != before {
		t.Errorf("root's parent image has %d chunk files, %d before", n, before)
	}
	// Root's gc of its own image still works, and prunes the parent.
	if out, err := runErr(time.Minute, nil, binPath(t, "gpucr"), "image", "gc", b); err != nil {
		t.Fatalf("gc of root's own image: %v\n%s", err, out)
	}
	if _, err := image.Open(a); err == nil {
		t.Error("root's own gc did not prune the parent")
	}
}

// TestAutoParentSharedSeries: in a shared series directory (1777) the second
// user checkpoints into series/2 after root's series/1. Root's next
// checkpoint with --auto-parent takes root's own series/1 as its parent (the
// second user's newer image cannot be root's parent) and succeeds.
func TestAutoParentSharedSeries(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	series := filepath.Join(dir, "series")
	if err := os.Mkdir(series, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(series, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	mine := startUnder(t, dir, h, env, "ptrchase", "--mib", "8", "--interval-ms", "20")
	mine.waitIter(5, time.Minute)
	if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(mine.pid), "-D", filepath.Join(series, "1"),
		"--gpu-only", "--leave-running"); err != nil {
		t.Fatalf("root's first checkpoint: %v\n%s", err, out)
	}
	theirs := startUnderAs(t, dir, h, env, u, "ptrchase", "--mib", "8", "--interval-ms", "20")
	theirs.waitIter(5, time.Minute)
	mustAsOther(t, u, binPath(t, "gpucr"), "checkpoint", strconv.Itoa(theirs.pid), "-D", filepath.Join(series, "2"),
		"--gpu-only", "--leave-running", "--socket", h.socket)

	out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(mine.pid), "-D", filepath.Join(series, "3"), "--gpu-only",
		"--leave-running", "--auto-parent")
	if err != nil || !strings.Contains(out, "parent: "+filepath.Join(series, "1")) {
		t.Fatalf("root's --auto-parent checkpoint in the shared series: %v\n%s", err, out)
	}
}

// TestErrorsRevealNothing: the second user names, as the parent of a
// checkpoint, paths inside a directory only root may enter: one where root
// keeps an image, one where nothing is. The helper, which runs as root,
// answers both alike, as the kernel would answer that user (permission
// denied), saying neither that an image is there nor whose it is.
func TestErrorsRevealNothing(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	private := filepath.Join(dir, "root-only")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	writeChain(t, private) // root's images private/a and private/b

	a := startUnderAs(t, dir, h, env, u, "ptrchase", "--mib", "8", "--interval-ms", "20")
	a.waitIter(5, time.Minute)
	img := userDir(t, u, filepath.Join(dir, "img"))
	answers := map[string]string{}
	for _, parent := range []string{filepath.Join(private, "b"), filepath.Join(private, "none")} {
		out, err := asOther(t, u, time.Minute, nil, binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", img,
			"--gpu-only", "--leave-running", "--parent", parent, "--socket", h.socket)
		if err == nil {
			t.Fatalf("checkpoint with the parent %s in root's private directory succeeded:\n%s", parent, out)
		}
		answers[parent] = strings.ReplaceAll(out, parent, "PARENT")
		for _, tell := range []string{"belongs to", "uid 0", "no GPU image", "not a directory", "no such file"} {
			if strings.Contains(out, tell) {
				t.Errorf("the answer for %s says %q:\n%s", parent, tell, out)
			}
		}
		if !strings.Contains(out, "permission denied") {
			t.Errorf("the answer for %s is not the user's permission error:\n%s", parent, out)
		}
	}
	if answers[filepath.Join(private, "b")] != answers[filepath.Join(private, "none")] {
		t.Errorf("an image and nothing are answered differently:\n%q\n%q", answers[filepath.Join(private, "b")],
			answers[filepath.Join(private, "none")])
	}
	// A directory the user may read but not search (r without x), where
	// root keeps an image: the helper does not look into it for them.
	readable := filepath.Join(dir, "readable")
	writeChain(t, readable)
	if err := os.Chmod(readable, 0o744); err != nil {
		t.Fatal(err)
	}
	r := rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: &helperpb.Checkpoint{
		Pid: int64(a.pid), ImageDir: readable, LeaveRunning: true}}}, readable)
	if r.Code != helperpb.ErrorCode_ERROR_PERMISSION.String() || !strings.Contains(r.Message, "permission denied") ||
		strings.Contains(r.Message, "uid 0") {
		t.Errorf("a checkpoint into a directory the user may not search: %s", r)
	}
	a.waitIter(a.lastIter()+5, 30*time.Second)
}

// TestImageRemovalAcrossUsers: `gpucr image rm` and `gpucr image gc` of an
// unfinished image act only on the images of the user a path belongs to.
// The second user cannot remove root's images (opened up to 0755 so that
// only ownership stops it). Root's rm and gc refuse the second user's
// paths that lead to root's images: a symlink to root's image, and a
// directory of the user's whose gpucr/ is a symlink to root's GPU image.
// Every root image stays whole.
func TestImageRemovalAcrossUsers(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	a, b := writeChain(t, filepath.Join(dir, "root-series"))
	// An unfinished image of root's: a write whose commit never came.
	_, half := writeChain(t, filepath.Join(dir, "root-half"))
	if err := os.Remove(filepath.Join(half, image.SubDir, "manifest.pb")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(a), a, b, filepath.Dir(half), half} {
		if err := filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.IsDir() {
				err = os.Chmod(p, 0o755)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	before := chunkFiles(t, b) + chunkFiles(t, a)
	halfChunks := chunkFiles(t, half)
	gpucr := binPath(t, "gpucr")
	intact := func(what string) {
		t.Helper()
		for _, d := range []string{a, b} {
			if _, err := os.Stat(filepath.Join(d, image.SubDir)); err != nil {
				t.Fatalf("after %s: root's image %s: %v", what, d, err)
			}
		}
		if _, err := image.Open(b); err != nil {
			t.Errorf("after %s: root's image %s does not open: %v", what, b, err)
		}
		if n := chunkFiles(t, b) + chunkFiles(t, a); n != before {
			t.Errorf("after %s: root's series has %d chunk files, %d before", what, n, before)
		}
		if n := chunkFiles(t, half); n != halfChunks {
			t.Errorf("after %s: root's unfinished image has %d chunk files, %d before", what, n, halfChunks)
		}
	}

	// The second user names root's images.
	for _, args := range [][]string{{"image", "rm", b}, {"image", "gc", half}} {
		out, err := asOther(t, u, time.Minute, nil, gpucr, args...)
		if err == nil {
			t.Errorf("the second user's gpucr %s succeeded:\n%s", strings.Join(args, " "), out)
		}
		t.Logf("the second user's gpucr %s: %s", strings.Join(args, " "), strings.TrimSpace(out))
	}
	intact("the second user's rm and gc")

	// Root names the second user's paths to root's images.
	home := userDir(t, u, filepath.Join(dir, "home"))
	link := filepath.Join(home, "img")
	mustAsOther(t, u, "ln", "-s", b, link)
	fake := filepath.Join(home, "fake")
	mustAsOther(t, u, "mkdir", fake)
	mustAsOther(t, u, "ln", "-s", filepath.Join(b, image.SubDir), filepath.Join(fake, image.SubDir))
	halfLink := filepath.Join(home, "half")
	mustAsOther(t, u, "mkdir", halfLink)
	mustAsOther(t, u, "ln", "-s", filepath.Join(half, image.SubDir), filepath.Join(halfLink, image.SubDir))
	for _, args := range [][]string{
		{"image", "rm", link},
		{"image", "rm", fake},
		{"image", "gc", link},
		{"image", "gc", halfLink},
	} {
		out, err := runErr(time.Minute, nil, gpucr, args...)
		if err == nil || !strings.Contains(out, "belongs to uid") && !strings.Contains(out, "is a symlink") {
			t.Errorf("root's gpucr %s: %v, not refused for the path's owner:\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("root's gpucr %s: %s", strings.Join(args, " "), strings.TrimSpace(out))
		intact("root's gpucr " + strings.Join(args, " "))
	}

	// Root's own removal of its images still works.
	if out, err := runErr(time.Minute, nil, gpucr, "image", "gc", half); err != nil || !strings.Contains(out, "unfinished") {
		t.Errorf("root's gc of its own unfinished image: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(half, image.SubDir)); err == nil {
		t.Errorf("root's gc left its unfinished image")
	}
	if out, err := runErr(time.Minute, nil, gpucr, "image", "rm", b, a); err != nil {
		t.Errorf("root's image rm of its own series: %v\n%s", err, out)
	}
}
