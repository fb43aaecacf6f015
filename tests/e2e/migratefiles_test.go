package e2e

// The job's owner against the files of root's migration of its job: what it
// plants in -D while the dump runs, and the symlinks it swaps in at the
// target (migrateattack_test.go says how the tests are set up).

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// attackerAs starts this test binary as u with env (its role), output into
// log, and waits until it says it is ready; the returned function ends it
// and returns its output.
func attackerAs(t *testing.T, u otherUser, log string, env ...string) func() string {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := asUser(exec.Command(testBinary(t)), u)
	cmd.Env = env
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() string {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		b, _ := os.ReadFile(log)
		return string(b)
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), "ready\n") {
			return stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second user's program is not ready: %s", stop())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rootOnlyDir makes a directory only root may enter, holding one file.
func rootOnlyDir(t *testing.T, p string) {
	t.Helper()
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "keep"), []byte("root's alone\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateTargetFollowsNoLink: the job's owner may add files to the
// image directory -D while the dump runs, and may write the (empty,
// existing) target directory. During the dump it plants a directory x
// (0777) holding a 64 MiB file and a second file; at the target, once x
// appears, it renames it and puts a symlink x to a directory only root may
// enter in its place. Nothing is created in that directory, and its mode
// stays 0700.
func TestMigrateTargetFollowsNoLink(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := userDir(t, u, filepath.Join(dir, "img"))
	remote := userDir(t, u, filepath.Join(dir, "remote"))
	home := userDir(t, u, filepath.Join(dir, "home"))
	secret := filepath.Join(dir, "secret")
	rootOnlyDir(t, secret)
	before := treeOf(t, secret)
	job := startJob(t, "sleep", "100000")
	stop := attackerAs(t, u, filepath.Join(dir, "attacker.log"),
		"GPUCR_E2E_PLANT_LINK="+strings.Join([]string{img, remote, home, secret}, "\n"))
	ssh, gpucr := fakeTarget(t, dir, restoreOK(job.Process.Pid))
	out, err := migrateTo(t, h, env, job.Process.Pid, ssh, gpucr, img, remote)
	said := stop()
	t.Logf("gpucr migrate: %v\n%s\nthe owner: %s", err, out, said)
	if after := treeOf(t, secret); after != before {
		t.Errorf("the root-only directory changed through the owner's symlink:\nbefore:\n%safter:\n%s", before, after)
	}
	if _, mode := fileOwner(t, secret); mode.Perm() != 0o700 {
		t.Errorf("the root-only directory has mode %v now", mode.Perm())
	}
	// The image went into a directory the target made itself (the owner's
	// empty one replaced): nobody else may write it.
	if err == nil {
		if uid, mode := fileOwner(t, remote); uid != 0 || mode.Perm() != 0o700 {
			t.Errorf("the image at the target is in %s, uid %d, %v: not a directory of root's alone", remote, uid, mode)
		}
	}
}

// plantLinkMain (GPUCR_E2E_PLANT_LINK="IMG\nREMOTE\nHOME\nTARGET", run as
// the job's owner): once CRIU's private directory shows that the dump runs
// in IMG, moves a directory x (0777: a 64 MiB file, then the file
// "second") made beforehand in HOME into IMG; then, once REMOTE/x
// appears, renames it and puts a symlink to TARGET in its place.
func plantLinkMain(args string) int {
	a := strings.Split(args, "\n")
	if len(a) != 4 {
		fmt.Println("bad GPUCR_E2E_PLANT_LINK")
		return 2
	}
	img, remote, home, target := a[0], a[1], a[2], a[3]
	x := filepath.Join(home, "x")
	if err := os.Mkdir(x, 0o777); err != nil {
		fmt.Println(err)
		return 1
	}
	_ = os.Chmod(x, 0o777)
	if err := os.WriteFile(filepath.Join(x, "big"), bytes.Repeat([]byte{'b'}, 64<<20), 0o644); err != nil {
		fmt.Println(err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(x, "second"), []byte("planted by the owner\n"), 0o644); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("ready")
	waitUntil(func() bool { return dumpRuns(img) })
	if err := os.Rename(x, filepath.Join(img, "x")); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("planted x in", img)
	rx := filepath.Join(remote, "x")
	waitUntil(func() bool { fi, err := os.Lstat(rx); return err == nil && fi.IsDir() })
	if err := os.Rename(rx, filepath.Join(remote, "x.moved")); err != nil {
		fmt.Println("rename:", err)
		return 1
	}
	if err := os.Symlink(target, rx); err != nil {
		fmt.Println("symlink:", err)
		return 1
	}
	fmt.Println("swapped", rx, "for a symlink to", target)
	return 0
}

// dumpRuns: CRIU's private directory in img, or its images, show that the
// dump runs or is done (its checks of what img holds are behind it).
func dumpRuns(img string) bool {
	ents, _ := os.ReadDir(img)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".gpucr-criu-") || e.Name() == "inventory.img" {
			return true
		}
	}
	return false
}

// waitUntil polls cond every 200 us, for as long as the program runs (the
// test ends it).
func waitUntil(cond func() bool) {
	for !cond() {
		time.Sleep(200 * time.Microsecond)
	}
}

// swapPairs is how many chances the owner's race of
// TestMigrateSendsNoOtherFile takes.
const swapPairs = 24

// TestMigrateSendsNoOtherFile: the owner plants pairs of files in -D while
// the dump runs, pNNa (4 MiB) then pNNb (as long as a file only root may
// read), and as the sender closes pNNa (inotify) renames a symlink to
// root's file over pNNb: what the sender looked at was the owner's file,
// what it would open by name is root's. Root's file does not arrive at the
// target.
func TestMigrateSendsNoOtherFile(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := userDir(t, u, filepath.Join(dir, "img"))
	home := userDir(t, u, filepath.Join(dir, "home"))
	remote := filepath.Join(dir, "remote")
	secretDir := filepath.Join(dir, "secret")
	if err := os.Mkdir(secretDir, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := []byte("root's own secret " + randomHex(16) + "\n")
	key := filepath.Join(secretDir, "key")
	if err := os.WriteFile(key, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	job := startJob(t, "sleep", "100000")
	stop := attackerAs(t, u, filepath.Join(dir, "attacker.log"),
		"GPUCR_E2E_SWAP_FILES="+strings.Join([]string{img, home, key, strconv.Itoa(len(secret))}, "\n"))
	ssh, gpucr := fakeTarget(t, dir, restoreOK(job.Process.Pid))
	out, err := migrateTo(t, h, env, job.Process.Pid, ssh, gpucr, img, remote)
	said := stop()
	t.Logf("gpucr migrate: %v\n%s\nthe owner: %s", err, out, said)
	if !strings.Contains(said, "planted") {
		t.Fatalf("the owner planted nothing: %s", said)
	}
	_ = filepath.Walk(remote, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		if b, _ := os.ReadFile(p); bytes.Contains(b, secret) {
			st := fi.Sys().(*syscall.Stat_t)
			t.Errorf("root's 0600 %s arrived at the target as %s (uid %d, %v)", key, p, st.Uid, fi.Mode())
		}
		return nil
	})
}

// swapFilesMain (GPUCR_E2E_SWAP_FILES="IMG\nHOME\nTARGET\nSIZE", run as the
// job's owner): makes the pairs and symlinks to TARGET in HOME, moves the
// pairs into IMG once the dump runs, and swaps each pNNb for its symlink
// as soon as pNNa is closed after a read.
func swapFilesMain(args string) int {
	a := strings.Split(args, "\n")
	if len(a) != 4 {
		fmt.Println("bad GPUCR_E2E_SWAP_FILES")
		return 2
	}
	img, home, target := a[0], a[1], a[2]
	size, _ := strconv.Atoi(a[3])
	big := bytes.Repeat([]byte{'a'}, 4<<20)
	for i := range swapPairs {
		p := filepath.Join(home, fmt.Sprintf("p%02d", i))
		if os.WriteFile(p+"a", big, 0o644) != nil || os.WriteFile(p+"b", bytes.Repeat([]byte{'d'}, size), 0o644) != nil ||
			os.Symlink(target, filepath.Join(home, fmt.Sprintf("l%02d", i))) != nil {
			fmt.Println("cannot make the pairs")
			return 1
		}
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	if _, err := unix.InotifyAddWatch(fd, img, unix.IN_CLOSE_NOWRITE); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("ready")
	waitUntil(func() bool { return dumpRuns(img) })
	for i := range swapPairs {
		for _, s := range []string{"a", "b"} {
			n := fmt.Sprintf("p%02d%s", i, s)
			if err := os.Rename(filepath.Join(home, n), filepath.Join(img, n)); err != nil {
				fmt.Println(err)
				return 1
			}
		}
	}
	fmt.Println("planted", swapPairs, "pairs in", img)
	buf := make([]byte, 64<<10)
	swapped := 0
	for swapped < swapPairs {
		n, err := unix.Read(fd, buf)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			var i int
			if _, err := fmt.Sscanf(name, "p%02da", &i); err != nil || len(name) != 4 {
				continue
			}
			if os.Rename(filepath.Join(home, fmt.Sprintf("l%02d", i)), filepath.Join(img, fmt.Sprintf("p%02db", i))) == nil {
				swapped++
			}
		}
	}
	fmt.Println("swapped", swapped)
	return 0
}

// TestMigrateDiscardRemovesOnlyItsOwn: the target directory is
// HOME/p/img, p a directory of the owner's. While the target restores, the
// owner renames p and puts a symlink p to a directory that holds a root-only
// directory img. The restore fails: the migration's cleanup at the target
// removes nothing of root's.
func TestMigrateDiscardRemovesOnlyItsOwn(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	home := userDir(t, u, filepath.Join(dir, "home"))
	userDir(t, u, filepath.Join(home, "p"))
	elsewhere := filepath.Join(dir, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	rootOnlyDir(t, filepath.Join(elsewhere, "img"))
	before := treeOf(t, elsewhere)
	job := startJob(t, "sleep", "100000")
	ready, goFile := filepath.Join(dir, "restoring"), filepath.Join(home, "swapped")
	ssh, gpucr := fakeTarget(t, dir, waitMarker(ready, goFile)+"\n"+restoreFails)
	swap := fmt.Sprintf("while [ ! -e %[1]s ]; do sleep 0.05; done; cd %[2]s && mv p p.moved && ln -s %[3]s p && touch %[4]s",
		ready, home, elsewhere, goFile)
	swapper := asUser(exec.Command("/bin/sh", "-c", swap), u)
	swapper.Dir = "/"
	var said bytes.Buffer
	swapper.Stdout, swapper.Stderr = &said, &said
	if err := swapper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = swapper.Process.Kill(); _ = swapper.Wait() })
	out, err := migrateTo(t, h, env, job.Process.Pid, ssh, gpucr, filepath.Join(dir, "img"), filepath.Join(home, "p", "img"))
	t.Logf("gpucr migrate: %v\n%s", err, out)
	if err == nil || !strings.Contains(out, "migration failed in its restore") {
		t.Fatalf("the migration did not fail in its restore: %v\n%s", err, out)
	}
	if _, serr := os.Stat(goFile); serr != nil {
		t.Fatalf("the owner did not swap the parent for a symlink: %s", said.String())
	}
	if after := treeOf(t, elsewhere); after != before {
		t.Errorf("the cleanup at the target removed root's directory through the owner's symlinked parent:\nbefore:\n%safter:\n%s",
			before, after)
	}
}
