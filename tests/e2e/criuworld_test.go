package e2e

// CRIU runs as root in a world of its own: it follows nothing a user planted
// in an image directory they may write, restores only files of the user who
// restores, reads no configuration of a user's, and as root gpucr runs no
// CRIU, plugin or helper that the environment names and a user could change.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rootSecret makes a file only root may read and write, with known content.
func rootSecret(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(name+": root's alone\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func secretIntact(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil || string(b) != filepath.Base(p)+": root's alone\n" {
		t.Errorf("%s changed (%d bytes now, starting %q), %v", p, len(b), b[:min(len(b), 60)], err)
	}
	if _, mode := fileOwner(t, p); mode.Perm() != 0o600 {
		t.Errorf("%s has mode %v now", p, mode)
	}
}

// userDir makes a directory that belongs to u (u may plant anything in it).
func userDir(t *testing.T, u otherUser, p string) string {
	t.Helper()
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCRIUFollowsNothingPlanted: root checkpoints and restores a process in
// an image directory that belongs to the second user, who planted symlinks
// under the names of CRIU's logs, of one of its images and of its
// statistics: to files only root may write, and to a file that does not
// exist. The dump (with --force: the directory holds something) and the
// restore work, nothing is written through the symlinks, nothing is created
// where the dangling one points, and removing the planted image name after
// the dump removes the symlink, not its target; the directory then holds
// CRIU's own files.
func TestCRIUFollowsNothingPlanted(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	img := userDir(t, u, filepath.Join(dir, "img"))
	secrets := map[string]string{}
	for _, name := range []string{"dump.log", "inventory.img", "stats-dump", "stats-restore"} {
		secrets[name] = rootSecret(t, dir, "secret-"+name)
		mustAsOther(t, u, "ln", "-s", secrets[name], filepath.Join(img, name))
	}
	dangling := filepath.Join(dir, "made-by-root")
	mustAsOther(t, u, "ln", "-s", dangling, filepath.Join(img, "restore.log"))

	a := startUnder(t, dir, h, env, "ptrchase", "--mib", "8", "--interval-ms", "20")
	a.waitIter(15, time.Minute)
	cliEnv := append(append([]string{}, env...), "GPUCR_SOCKET="+h.socket)
	// --force: the planted image name is put aside (renamed, not followed)
	// and removed with the aside directory once the dump is complete
	if out, err := runErr(90*time.Second, cliEnv, binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", img, "--force"); err != nil {
		t.Fatalf("gpucr checkpoint: %v\n%s", err, out)
	}
	a.reap(30 * time.Second)
	before := a.lastIter()
	if out, err := runErr(90*time.Second, cliEnv, binPath(t, "gpucr"), "restore", "-D", img); err != nil {
		t.Fatalf("gpucr restore: %v\n%s", err, out)
	}
	a.waitIter(before+10, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)

	for _, p := range secrets {
		secretIntact(t, p)
	}
	if _, err := os.Lstat(dangling); err == nil {
		t.Errorf("root created %s through a dangling symlink", dangling)
	}
	for _, name := range []string{"dump.log", "restore.log", "inventory.img", "stats-dump", "stats-restore"} {
		fi, err := os.Lstat(filepath.Join(img, name))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s in the image directory: %v, %v; want CRIU's own file", name, fi, err)
			continue
		}
		if uid, _ := fileOwner(t, filepath.Join(img, name)); uid != 0 {
			t.Errorf("%s belongs to uid %d", name, uid)
		}
	}
	if got := pluginsLoaded(t, filepath.Join(img, "dump.log")); len(got) != 1 || got[0] != "gpucr" {
		t.Errorf("dump.log: CRIU loaded the plugins %q, want only gpucr's", got)
	}
	ents, _ := os.ReadDir(img)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".gpucr-") {
			t.Errorf("%s left in the image directory", e.Name())
		}
	}
}

// TestRestoreOnlyTheCallersImages: an image directory where the second user
// put an empty inventory.img of their own is no CRIU image to root: the
// restore is refused before CRIU runs, saying whose file it is.
func TestRestoreOnlyTheCallersImages(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	img := userDir(t, u, filepath.Join(dir, "img"))
	mustAsOther(t, u, "touch", filepath.Join(img, "inventory.img"))
	out, err := runErr(time.Minute, gpucrEnv(t), binPath(t, "gpucr"), "restore", "-D", img,
		"--socket", filepath.Join(dir, "none.sock"))
	want := "inventory.img belongs to uid " + strconv.Itoa(int(u.UID)) + ", not to uid 0"
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("gpucr restore of the second user's inventory.img: %v\n%s\nwant %q", err, out, want)
	}
	if _, err := os.Lstat(filepath.Join(img, "restore.log")); err == nil {
		t.Error("CRIU ran (restore.log is there)")
	}
}

// TestCRIUReadsNoUsersConfig: root runs gpucr with the second user's
// environment (as `sudo -E` keeps it). CRIU reads nothing of the user's
// ~/.criu/default.conf (whose action-script would run as root), and a CRIU,
// a plugin directory and a helper socket that the environment names and the
// user could change are refused, each naming what it refused; the process
// runs on untouched.
func TestCRIUReadsNoUsersConfig(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	openUp(t, dir)
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	home := userDir(t, u, filepath.Join(dir, "home"))
	marker := filepath.Join(dir, "action-script-ran")
	hook := filepath.Join(home, "hook.sh")
	mustAsOther(t, u, "sh", "-c", "mkdir -p "+home+"/.criu && printf '#!/bin/sh\\ntouch "+marker+"\\n' > "+hook+
		" && chmod 755 "+hook+" && echo 'action-script "+hook+"' > "+home+"/.criu/default.conf")

	a := startUnder(t, dir, h, env, "ptrchase", "--mib", "8", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	cliEnv := append(append([]string{}, env...), "GPUCR_SOCKET="+h.socket, "HOME="+home)
	img := filepath.Join(dir, "img")
	if out, err := runErr(90*time.Second, cliEnv, binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", img,
		"--leave-running"); err != nil {
		t.Fatalf("gpucr checkpoint: %v\n%s", err, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("CRIU ran the action-script of the user's ~/.criu/default.conf")
	}

	// What the environment names, the user's.
	criuCopy := filepath.Join(home, "criu")
	real, err := exec.LookPath("criu")
	if err != nil {
		t.Fatal(err)
	}
	mustAsOther(t, u, "sh", "-c", "printf '#!/bin/sh\\nexec "+real+" \"$@\"\\n' > "+criuCopy+" && chmod 755 "+criuCopy)
	plugins := filepath.Join(home, "plugins")
	mustAsOther(t, u, "mkdir", plugins)
	mustAsOther(t, u, "cp", filepath.Join(buildDir(t), "lib", "criu", "gpucr_plugin.so"), plugins)
	fake := filepath.Join(home, "helper.sock")
	listener := listenAs(t, u, fake)
	defer listener()

	for _, tc := range []struct{ name, env, want string }{
		{"criu", "GPUCR_CRIU=" + criuCopy, "GPUCR_CRIU=" + criuCopy},
		{"plugin", "GPUCR_PLUGIN_DIR=" + plugins, "GPUCR_PLUGIN_DIR=" + plugins},
		{"socket", "GPUCR_SOCKET=" + fake, "not a gpucr helper run by root"},
	} {
		e := append(append([]string{}, cliEnv...), tc.env)
		out, err := runErr(90*time.Second, e, binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", img+"-"+tc.name,
			"--leave-running")
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%s the user could change: %v\n%s\nwant %q", tc.name, err, out, tc.want)
		}
	}
	before := a.lastIter()
	a.waitIter(before+10, 30*time.Second)
}

// listenAs has a program of u listen on the unix socket path (accepting and
// holding connections) until the returned function is called.
func listenAs(t *testing.T, u otherUser, path string) func() {
	t.Helper()
	cmd := asUser(exec.Command(testBinary(t)), u)
	cmd.Env = []string{"GPUCR_E2E_LISTEN=" + path}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("the second user's listener on %s did not come up", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
}

// listenMain (GPUCR_E2E_LISTEN=PATH) listens on PATH and holds every
// connection, answering nothing.
func listenMain(path string) int {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return 1
	}
	var held []net.Conn
	for {
		c, err := ln.Accept()
		if err != nil {
			return 0
		}
		held = append(held, c)
	}
}

// TestCRIUImagesArePrivate: root's checkpoint into a directory others may
// enter (0755) leaves nothing there that another user can read: CRIU's
// images (the process's memory, in pages-*.img), its log and statistics are
// 0600 like the GPU image, every directory 0700; the second user reads no
// page image. The restore from them works, and the process carries on.
func TestCRIUImagesArePrivate(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	openUp(t, dir)
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"--mib", "4", "--interval-ms", "20", "--hb-every", "1"}
	a := startUnder(t, dir, h, env, "heartbeat", args...)
	a.waitIter(5, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)
	var pages []string
	err := filepath.Walk(img, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == img {
			return err
		}
		switch {
		case fi.IsDir() && fi.Mode().Perm() != 0o700:
			t.Errorf("%s: mode %v, want 0700", p, fi.Mode())
		case fi.Mode().IsRegular() && fi.Mode().Perm() != 0o600:
			t.Errorf("%s: mode %v, want 0600", p, fi.Mode())
		}
		if strings.HasPrefix(fi.Name(), "pages-") {
			pages = append(pages, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatalf("no pages-*.img in %s", img)
	}
	for _, p := range pages {
		if out, err := asOther(t, u, time.Minute, nil, "head", "-c", "64", p); err == nil {
			t.Errorf("user %s read %s (%d bytes): root's process memory", u.Name, p, len(out))
		}
	}
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+5, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, maxIter(a.heartbeats())))
}

// TestKilledCheckpointsDirectoryRemoved: a `gpucr checkpoint` killed while
// CRIU runs (SIGKILL: no cleanup of its own) leaves its private directory
// (CRIU's log and configuration, root's) in /tmp; the next checkpoint
// removes it, and only it.
func TestKilledCheckpointsDirectoryRemoved(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "256", "--interval-ms", "20")
	a.waitIter(3, time.Minute)
	cmd := exec.Command(binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", filepath.Join(dir, "img"), "--socket", h.socket)
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Its private directory: the one it holds open for CRIU.
	var private string
	waitForCond(t, 30*time.Second, func() bool {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		for _, fd := range fds {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", cmd.Process.Pid, fd.Name()))
			if strings.HasPrefix(l, "/tmp/gpucr-criu-") {
				private = l
				return true
			}
		}
		return false
	}, func() string { return "gpucr checkpoint holds no private directory in /tmp open" })
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if _, err := os.Lstat(private); err != nil {
		t.Fatalf("the killed checkpoint's directory %s: %v (nothing left to test)", private, err)
	}
	a.kill()
	other := setsidSleep(t)
	cliOK(t, h, env, filepath.Join(dir, "img2"), "checkpoint", strconv.Itoa(other), "-D", filepath.Join(dir, "img2"))
	if _, err := os.Lstat(private); err == nil {
		t.Errorf("the killed checkpoint's private directory %s is still there after the next checkpoint", private)
	}
}

// setsidSleep starts a plain process that leads its own session (what a
// checkpoint without --shell-job needs) and returns its pid.
func setsidSleep(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }() // reaped when the checkpoint ends it
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd.Process.Pid
}
