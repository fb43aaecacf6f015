package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCheckpointFullDiskWithParent: an incremental checkpoint (a parent
// image elsewhere) may go ahead where free space looks short, and the disk
// fills up during the copy: the failure says so once, plainly, with the
// full-disk hint, and the process runs on. Both while the process waits for
// the copy (--concurrent=false) and while it runs on (the concurrent
// checkpoint's background copy, of a snapshot or behind a copy-on-write
// window).
func TestCheckpointFullDiskWithParent(t *testing.T) {
	needTool(t, "criu")
	for _, mode := range []string{"--concurrent=true", "--concurrent=false", "copy-on-write"} {
		t.Run(strings.TrimPrefix(mode, "--"), func(t *testing.T) {
			dir := t.TempDir()
			env := gpucrEnv(t)
			var hflags []string
			if mode == "copy-on-write" {
				// every buffer behind a window, which the full disk fails
				hflags, mode = []string{"--concurrent-mode", "copy-on-write"}, "--concurrent=true"
			}
			h := startHelper(t, dir, env, hflags...)
			a := startUnder(t, dir, h, env, "heartbeat", "--mib", "24", "--interval-ms", "10")
			a.waitIter(10, time.Minute)
			parent := filepath.Join(dir, "parent")
			cliOK(t, h, env, parent, "checkpoint", strconv.Itoa(a.pid), "-D", parent, "--leave-running")
			small := filepath.Join(dir, "small")
			if err := os.Mkdir(small, 0o700); err != nil {
				t.Fatal(err)
			}
			mountTmpfsOn(t, small, "size=8m")
			a.waitIter(a.lastIter()+20, time.Minute) // its buffers change
			img := filepath.Join(small, "img")
			out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", mode, "--parent", parent)
			exited := time.Now()
			t.Logf("%s", out)
			if err == nil {
				t.Skipf("the changed chunks fit after all:\n%s", out)
			}
			if !strings.Contains(out, "hint: the image directory's file system is full") {
				t.Errorf("no full-disk hint:\n%s", out)
			}
			if n := strings.Count(out, "no space left on device") + strings.Count(out, "No space left on device"); n > 2 {
				t.Errorf("the full disk is told %d times:\n%s", n, out)
			}
			if _, err := os.Stat(filepath.Join(img, "inventory.img")); err == nil {
				t.Errorf("CRIU's image was left in %s after the checkpoint failed", img)
			}
			runsAgainWithin(t, a, exited, a.lastIter(), 2*time.Second)
			if _, err := os.Stat(filepath.Join(parent, "gpucr", "manifest.pb")); err != nil {
				t.Errorf("the parent image was harmed: %v", err)
			}
		})
	}
}
