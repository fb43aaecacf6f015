package e2e

// What checkpoints leave on disk: no more than the image they made.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/imagepb"
)

// gpuBytes is the size of the files under dir/gpucr* (the GPU image and
// any pre-copy rounds), each file once however many names it has.
func gpuBytes(t *testing.T, dir string) int64 {
	t.Helper()
	seen := map[uint64]bool{}
	var n int64
	tops, _ := filepath.Glob(filepath.Join(dir, "gpucr*"))
	for _, top := range tops {
		_ = filepath.Walk(top, func(_ string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() {
				return nil
			}
			if ino := fi.Sys().(*syscall.Stat_t).Ino; !seen[ino] {
				seen[ino] = true
				n += fi.Size()
			}
			return nil
		})
	}
	return n
}

// TestPreCopyRoundsFolded: a checkpoint with --pre-copy whose process
// changes all its memory all the time copies it in every round; once the
// image is committed, what it uses of the rounds is folded into it and the
// rounds are removed: the directory holds the GPU memory once (it held it
// once per round, three times, until gc). The image restores exactly.
func TestPreCopyRoundsFolded(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	args := []string{"--mib", "16", "--buffers", "4", "--hb-every", "5"}
	a := startUnder(t, dir, h, env, "heartbeat", append(append([]string{}, args...), "--interval-ms", "5")...)
	a.waitIter(10, time.Minute)
	img := filepath.Join(dir, "img")
	out := cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--pre-copy", "3", "--json")
	var d struct {
		PreCopy []checkpoint.PreCopyRound `json:"pre_copy"`
	}
	if err := json.Unmarshal([]byte(out[strings.LastIndex(out, "\n{")+1:]), &d); err != nil {
		t.Fatalf("checkpoint --json: %v\n%s", err, out)
	}
	var copied uint64
	for _, r := range d.PreCopy {
		copied += r.CopiedBytes
	}
	mem := d.PreCopy[0].Bytes
	if copied < 2*mem {
		t.Fatalf("the rounds copied %d bytes: want the memory copied at least twice (it changes all the time): %+v", copied, d.PreCopy)
	}
	if _, err := os.Stat(filepath.Join(img, checkpoint.PreCopyDir)); err == nil {
		t.Errorf("the pre-copy rounds stay in %s", img)
	}
	if n := gpuBytes(t, img); n > int64(mem)+1<<20 {
		t.Errorf("the GPU image takes %d bytes on disk for %d bytes of GPU memory", n, mem)
	}
	cliOK(t, h, env, img, "image", "verify", img)
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+20, time.Minute)
	a.kill()
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, maxIter(hbs)))
	checkContinuous(t, hbs, before)
}

// chunkFilesOf counts the files under dir/gpucr/chunks and the chunk files
// the image there names.
func chunkFilesOf(t *testing.T, dir string) (files, named int) {
	t.Helper()
	_ = filepath.Walk(filepath.Join(dir, "gpucr", "chunks"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			files++
		}
		return nil
	})
	im, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	seen := map[string]bool{}
	for _, b := range im.Manifest().GetBuffers() {
		for _, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_LOCAL && !seen[string(c.GetHash())] {
				seen[string(c.GetHash())] = true
				named++
			}
		}
	}
	return files, named
}

// TestGPUOnlyReplacesOnlyWithForce: a second --gpu-only checkpoint into a
// directory that holds an image is refused, as a whole-process one is,
// and the image stays; with --force it replaces the image and leaves no
// chunk file of the old one behind (they stayed until gc: 264 MiB for a
// user). A whole-process image replaced so goes whole, CRIU's files too.
func TestGPUOnlyReplacesOnlyWithForce(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--buffers", "4", "--interval-ms", "5")
	a.waitIter(10, time.Minute)
	img := filepath.Join(dir, "img")
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running")
	manifest := filepath.Join(img, "gpucr", "manifest.pb")
	first, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	a.waitIter(a.lastIter()+5, time.Minute) // every buffer changes
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running")
	if err == nil || !strings.Contains(out, "already holds") || !strings.Contains(out, "--force") {
		t.Errorf("a second GPU-only checkpoint into %s: %v\n%s", img, err, out)
	}
	if now, _ := os.ReadFile(manifest); string(now) != string(first) {
		t.Errorf("the refused checkpoint replaced the image")
	}
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running", "--force")
	if files, named := chunkFilesOf(t, img); files != named {
		t.Errorf("after --force, %s holds %d chunk files for the %d its image names", img, files, named)
	}
	cliOK(t, h, env, img, "image", "verify", img)

	// A whole-process image, replaced by a GPU-only one.
	whole := filepath.Join(dir, "whole")
	cliOK(t, h, env, whole, "checkpoint", strconv.Itoa(a.pid), "-D", whole, "--leave-running")
	cliOK(t, h, env, whole, "checkpoint", strconv.Itoa(a.pid), "-D", whole, "--gpu-only", "--leave-running", "--force")
	if _, err := os.Stat(filepath.Join(whole, "inventory.img")); err == nil {
		t.Errorf("CRIU's images of the replaced image stay beside the new GPU-only one in %s", whole)
	}
	if files, named := chunkFilesOf(t, whole); files != named {
		t.Errorf("%s holds %d chunk files for the %d its image names", whole, files, named)
	}
}

// TestRefusedCheckpointLeavesNoDirectory: a checkpoint that is refused, or
// interrupted, removes the image directory it made (and the directories
// it made above it) when nothing is left in them: a GPU-only one the
// helper refuses, a whole-process one refused for want of space, one
// interrupted while the helper copies. A directory that was there before
// stays.
func TestRefusedCheckpointLeavesNoDirectory(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, append(append([]string{}, env...), "GPUCR_FAULT=stall-copy@1"))
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(5, time.Minute)
	gone := func(what, p string) {
		t.Helper()
		if _, err := os.Lstat(p); err == nil {
			ents, _ := os.ReadDir(p)
			t.Errorf("%s left %s (%d entries)", what, p, len(ents))
		}
	}

	// Refused by the helper: no such client.
	top := filepath.Join(dir, "new")
	out, err := cli(t, h, env, "checkpoint", "1", "-D", filepath.Join(top, "img"), "--gpu-only")
	if err == nil {
		t.Fatalf("a GPU-only checkpoint of pid 1 succeeded:\n%s", out)
	}
	gone("a refused GPU-only checkpoint", top)

	// Interrupted while the helper copies (stalled there): SIGINT.
	img := filepath.Join(dir, "interrupted", "img")
	cmd := exec.Command(binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", img)
	cmd.Env = append(append([]string{}, env...), "GPUCR_SOCKET="+h.socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(helperLog(h), "stall-copy"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the checkpoint never reached the copy:\n%s", tail(helperLog(h), 20))
		}
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	_ = cmd.Wait()
	gone("an interrupted checkpoint", filepath.Dir(img))

	// Refused for want of space, in a directory that was there before
	// (it stays) and one made for it (it goes).
	small := filepath.Join(dir, "small")
	if err := os.Mkdir(small, 0o700); err != nil {
		t.Fatal(err)
	}
	mountTmpfsOn(t, small, "size=1m")
	img = filepath.Join(small, "img")
	out, err = cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	if err == nil || !strings.Contains(out, "checkpoint refused") {
		t.Fatalf("a checkpoint of 16 MiB into 1 MiB: %v\n%s", err, out)
	}
	gone("a checkpoint refused for want of space", img)
	if err := os.Mkdir(img, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img); err == nil {
		t.Fatal("a checkpoint of 16 MiB into 1 MiB succeeded")
	}
	if _, err := os.Stat(img); err != nil {
		t.Errorf("the image directory that was there before is gone: %v", err)
	}
	a.waitIter(a.lastIter()+3, time.Minute) // it runs on
}
