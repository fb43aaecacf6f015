package e2e

// What one user can do to another through image directories: the CLI's
// CRIU configuration, the helper (which runs as root and writes images for
// whoever asks on its socket, opened to everyone as a shared machine runs
// it), FIFOs and symlinks in images, and whose images are. The hostile
// files are planted by the tests' second user (users_test.go).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
	"github.com/gpucr/gpucr/protocol/imagepb"
)

// watchFIFO watches the FIFO at path until the returned function is
// called, which says what it saw: anyone holding it open to read (a
// non-blocking open for writing then succeeds) or anything written into it
// (the watcher's own non-blocking read gets it; a writer that waited for a
// reader is let through, and caught).
func watchFIFO(path string) (stop func() []string) {
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	finished := make(chan struct{})
	note := func(s string) {
		mu.Lock()
		if !slices.Contains(seen, s) {
			seen = append(seen, s)
		}
		mu.Unlock()
	}
	go func() {
		defer close(finished)
		buf := make([]byte, 4096)
		for {
			select {
			case <-done:
				return
			default:
			}
			// No fork while the watcher's own reading end is open: a child
			// of this process would hold a copy of it until its exec, and
			// the probe below would take that for someone reading.
			syscall.ForkLock.RLock()
			if fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
				time.Sleep(2 * time.Millisecond)
				if n, _ := unix.Read(fd, buf); n > 0 {
					note(fmt.Sprintf("written into: %q", buf[:n]))
				}
				unix.Close(fd)
			}
			syscall.ForkLock.RUnlock()
			if fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
				note("opened for reading")
				unix.Close(fd)
			}
			time.Sleep(3 * time.Millisecond)
		}
	}()
	return func() []string {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

var pluginLine = regexp.MustCompile(`Plugin "([^"]*)" \(version`)

// pluginsLoaded lists the plugins CRIU's log says it loaded.
func pluginsLoaded(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range pluginLine.FindAllStringSubmatch(string(b), -1) {
		names = append(names, m[1])
	}
	return names
}

// TestPlantedCRIUConfig: root checkpoints and restores with the CLI in a
// world-writable image directory (1777, as a tmpfs is) where the second user
// planted DIR/.gpucr-criu.conf (where gpucr once wrote CRIU's
// configuration), once a FIFO and once a symlink to a file only root may
// read and write. gpucr reads nothing from them and writes nothing through
// them, the FIFO gets no reader or writer, and CRIU loads gpucr's plugin
// and nothing else.
func TestPlantedCRIUConfig(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	for _, kind := range []string{"fifo", "symlink"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			openUp(t, dir)
			env := gpucrEnv(t)
			h := startHelper(t, dir, env)
			img := filepath.Join(dir, "img")
			if err := os.Mkdir(img, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(img, 0o777|os.ModeSticky); err != nil {
				t.Fatal(err)
			}
			secret := filepath.Join(dir, "secret")
			if err := os.WriteFile(secret, []byte("root's alone\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			conf := filepath.Join(img, ".gpucr-criu.conf")
			var stop func() []string
			if kind == "fifo" {
				mustAsOther(t, u, "mkfifo", conf)
				stop = watchFIFO(conf)
			} else {
				mustAsOther(t, u, "ln", "-s", secret, conf)
			}

			a := startUnder(t, dir, h, env, "ptrchase", "--mib", "8", "--interval-ms", "20")
			a.waitIter(15, time.Minute)
			cliEnv := append(append([]string{}, env...), "GPUCR_SOCKET="+h.socket)
			out, err := runErr(90*time.Second, cliEnv, binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", img)
			if err != nil {
				if stop != nil {
					t.Errorf("the planted FIFO: %v", stop())
				}
				t.Fatalf("gpucr checkpoint: %v\n%s", err, out)
			}
			a.reap(30 * time.Second)
			before := a.lastIter()
			out, err = runErr(90*time.Second, cliEnv, binPath(t, "gpucr"), "restore", "-D", img)
			if err != nil {
				t.Fatalf("gpucr restore: %v\n%s", err, out)
			}
			a.waitIter(before+10, time.Minute)
			_ = syscall.Kill(a.pid, syscall.SIGKILL)

			if stop != nil {
				if seen := stop(); len(seen) > 0 {
					t.Errorf("the planted FIFO was used: %v", seen)
				}
			}
			uid, mode := fileOwner(t, conf)
			wantType := os.ModeNamedPipe
			if kind == "symlink" {
				wantType = os.ModeSymlink
			}
			if uid != u.UID || mode.Type() != wantType {
				t.Errorf("%s is now uid %d, %v; the second user's %s was replaced", conf, uid, mode, kind)
			}
			if b, err := os.ReadFile(secret); err != nil || string(b) != "root's alone\n" {
				t.Errorf("the file the symlink points to changed: %q, %v", b, err)
			}
			if _, mode := fileOwner(t, secret); mode.Perm() != 0o600 {
				t.Errorf("the file the symlink points to has mode %v now", mode)
			}
			for _, log := range []string{"dump.log", "restore.log"} {
				if got := pluginsLoaded(t, filepath.Join(img, log)); !slices.Equal(got, []string{"gpucr"}) {
					t.Errorf("%s: CRIU loaded the plugins %q, want only gpucr's", log, got)
				}
			}
		})
	}
}

// transfersOf decodes the Transfers reply a raw client printed.
func transfersOf(t *testing.T, r rawReply) []struct {
	ImageDir string   `json:"imageDir"`
	Pids     []string `json:"pids"`
} {
	t.Helper()
	var resp struct {
		Transfers struct {
			Transfers []struct {
				ImageDir string   `json:"imageDir"`
				Pids     []string `json:"pids"`
			} `json:"transfers"`
		} `json:"transfers"`
	}
	if r.Transport != "" || r.Code != "" {
		t.Fatalf("Transfers: %+v", r)
	}
	if err := json.Unmarshal(r.Response, &resp); err != nil {
		t.Fatalf("Transfers reply %s: %v", r.Response, err)
	}
	return resp.Transfers.Transfers
}

// TestHelperWritesOnlyWhereTheCallerMay: through a helper whose socket is
// open to everyone, the second user (who may checkpoint its own process)
// can neither create a directory in /etc, nor write into (or delete files
// in) root's 0700 directory through a symlink it planted, nor overwrite
// root's committed GPU image; nor learn root's image paths and pids from
// Transfers. Each with the gpucr CLI as that user, and with requests of its
// own program, which the CLI would not send.
func TestHelperWritesOnlyWhereTheCallerMay(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	mine := startUnderAs(t, dir, h, env, u, "heartbeat", "--mib", "4", "--interval-ms", "20")
	roots := startUnder(t, dir, h, env, "ptrchase", "--mib", "4", "--interval-ms", "20")
	mine.waitIter(5, time.Minute)
	roots.waitIter(5, time.Minute)
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	asUserCLI := func(args ...string) (string, error) {
		return asOther(t, u, 2*time.Minute, env, binPath(t, "gpucr"), append(args, "--socket", h.socket)...)
	}
	ckpt := func(dir string, deferCommit bool) *helperpb.Request {
		return &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: &helperpb.Checkpoint{
			Pid: int64(mine.pid), ImageDir: dir, LeaveRunning: true, DeferCommit: deferCommit}}}
	}

	t.Run("a directory in /etc", func(t *testing.T) {
		target := filepath.Join("/etc", fmt.Sprintf("gpucr-e2e-%d", os.Getpid()))
		sub := filepath.Join("/etc", image.SubDir)
		if _, err := os.Lstat(sub); err == nil {
			t.Fatalf("%s exists already; this test would not tell", sub)
		}
		t.Cleanup(func() { os.RemoveAll(target); os.RemoveAll(sub) })
		if r := rawAs(t, u, h, ckpt(target, false), ""); r.Code != "ERROR_PERMISSION" {
			t.Errorf("Checkpoint into %s by path: %+v, want ERROR_PERMISSION", target, r)
		}
		if _, err := os.Lstat(target); err == nil {
			t.Errorf("%s was made for uid %d", target, u.UID)
		}
		// /etc itself, opened by the user (it may read it) and passed.
		if r := rawAs(t, u, h, ckpt("/etc", false), "/etc"); r.Code == "" || r.Transport != "" {
			t.Errorf("Checkpoint into /etc, passed as a descriptor: %+v, want an error", r)
		}
		if _, err := os.Lstat(sub); err == nil {
			t.Errorf("%s was made for uid %d", sub, u.UID)
		}
	})

	t.Run("root's 0700 directory through a symlink", func(t *testing.T) {
		private := filepath.Join(dir, "private")
		if err := os.Mkdir(private, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string]string{"keep": "root's", ".tmp-keep": "root's too"} {
			if err := os.WriteFile(filepath.Join(private, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		before := treeOf(t, private)
		img := filepath.Join(home, "img-link")
		mustAsOther(t, u, "mkdir", img)
		mustAsOther(t, u, "ln", "-s", private, filepath.Join(img, image.SubDir))
		out, err := asUserCLI("checkpoint", strconv.Itoa(mine.pid), "-D", img, "--gpu-only", "--leave-running")
		if err == nil || !strings.Contains(out, "symlink") {
			t.Errorf("checkpoint into a directory whose gpucr/ is a symlink: %v\n%s", err, out)
		}
		if r := rawAs(t, u, h, ckpt(img, false), ""); r.Code != "ERROR_PERMISSION" {
			t.Errorf("Checkpoint by path: %+v, want ERROR_PERMISSION", r)
		}
		if after := treeOf(t, private); after != before {
			t.Errorf("root's private directory changed:\n%s\nnow:\n%s", before, after)
		}
	})

	rootImg := filepath.Join(dir, "root-img")
	if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(roots.pid), "-D", rootImg, "--gpu-only", "--leave-running"); err != nil {
		t.Fatalf("root's checkpoint: %v\n%s", err, out)
	}
	t.Run("root's committed image", func(t *testing.T) {
		// Root's image stays root's: root's files, 0700 and 0600.
		_ = filepath.Walk(filepath.Join(rootImg, image.SubDir), func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			want := os.FileMode(0o600)
			if fi.IsDir() {
				want = 0o700
			}
			if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 0 || fi.Mode().Perm() != want {
				t.Errorf("root's image: %s is uid %d, %v", p, uid, fi.Mode())
			}
			return nil
		})
		// Even where the user can open the directory (0755 was the default).
		if err := os.Chmod(rootImg, 0o755); err != nil {
			t.Fatal(err)
		}
		before := treeOf(t, rootImg)
		out, err := asUserCLI("checkpoint", strconv.Itoa(mine.pid), "-D", rootImg, "--gpu-only", "--leave-running")
		if err == nil || !strings.Contains(out, "belongs to uid 0") {
			t.Errorf("checkpoint into root's image: %v\n%s", err, out)
		}
		if r := rawAs(t, u, h, ckpt(rootImg, false), ""); r.Code != "ERROR_PERMISSION" {
			t.Errorf("Checkpoint into root's image by path: %+v, want ERROR_PERMISSION", r)
		}
		if after := treeOf(t, rootImg); after != before {
			t.Errorf("root's image changed:\n%s\nnow:\n%s", before, after)
		}
		if out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "verify", rootImg); !strings.Contains(out, "ok:") {
			t.Errorf("root's image does not verify: %s", out)
		}
	})

	t.Run("transfers", func(t *testing.T) {
		for _, tr := range transfersOf(t, rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_Transfers{Transfers: &helperpb.Transfers{}}}, "")) {
			if tr.ImageDir == rootImg || slices.Contains(tr.Pids, strconv.Itoa(roots.pid)) {
				t.Errorf("uid %d sees root's transfer: %+v", u.UID, tr)
			}
		}
		// Root sees it.
		conn, err := client.Dial(t.Context(), h.socket, helperpb.Role_ROLE_CLI, "e2e")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		trs, err := conn.Transfers(t.Context(), rootImg)
		if err != nil || len(trs) == 0 {
			t.Errorf("root does not see its own transfer into %s: %v, %v", rootImg, trs, err)
		}
	})
	if mine.hasExited() {
		t.Errorf("the user's process ended: %v", mine.cmd.ProcessState)
	}
}

// TestDeferredImageBelongsToItsConnection: while root's dump writes its
// GPU image with a deferred commit (as CRIU's plugin does: one image for
// every process of the dumped tree, committed at the end), the second user
// cannot add its own process to that image, by path or with the directory
// passed; root's commit then holds root's process only, and restores.
func TestDeferredImageBelongsToItsConnection(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	mine := startUnderAs(t, dir, h, env, u, "heartbeat", "--mib", "4", "--interval-ms", "20")
	roots := startUnder(t, dir, h, env, "ptrchase", "--mib", "4", "--interval-ms", "20")
	mine.waitIter(5, time.Minute)
	roots.waitIter(5, time.Minute)
	img := filepath.Join(dir, "img")
	if err := os.Mkdir(img, 0o755); err != nil {
		t.Fatal(err)
	}

	// Root's dump, at the protocol level: the plugin's Checkpoint (here
	// with leave_running, not detached) and, later, its CommitImage.
	conn, err := client.Dial(t.Context(), h.socket, helperpb.Role_ROLE_PLUGIN, "e2e-root-dump")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, _, err := conn.Call(t.Context(), &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: &helperpb.Checkpoint{
		Pid: int64(roots.pid), ImageDir: img, LeaveRunning: true, DeferCommit: true}}}); err != nil {
		t.Fatalf("root's Checkpoint: %v", err)
	}
	for _, viaFD := range []string{"", img} {
		r := rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: &helperpb.Checkpoint{
			Pid: int64(mine.pid), ImageDir: img, LeaveRunning: true, DeferCommit: true}}}, viaFD)
		if r.Code == "" && r.Transport == "" {
			t.Errorf("uid %d added its process to root's dump (directory passed: %v)", u.UID, viaFD != "")
		}
		if r := rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_CommitImage{CommitImage: &helperpb.CommitImage{
			ImageDir: img, Abort: true}}}, ""); r.Code != "ERROR_PERMISSION" {
			t.Errorf("uid %d dropped root's image: %+v", u.UID, r)
		}
	}
	if _, _, err := conn.Call(t.Context(), &helperpb.Request{Body: &helperpb.Request_CommitImage{CommitImage: &helperpb.CommitImage{
		ImageDir: img}}}); err != nil {
		t.Fatalf("root's CommitImage: %v", err)
	}
	im, err := image.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	var pids []int
	for _, p := range im.Processes() {
		pids = append(pids, p.Pid)
	}
	if !slices.Equal(pids, []int{roots.pid}) {
		t.Errorf("root's image holds the processes %v, want only root's %d", pids, roots.pid)
	}
	if err := im.Verify(); err != nil {
		t.Errorf("root's image: %v", err)
	}
}

// TestUserImageIsTheUsers: a user's --gpu-only image is the user's: its
// files and directories belong to the user, 0700/0600 (nobody else can read
// its GPU memory), the user verifies and deletes it; an incremental image
// on the user's own parent refers to the parent's chunks; one on root's
// image is refused; Transfers shows the user its own copies.
func TestUserImageIsTheUsers(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	// Two data buffers of over 1 MiB each: the table of pointers, written
	// once, has a slab to itself, which never changes.
	mine := startUnderAs(t, dir, h, env, u, "ptrchase", "--mib", "8", "--buffers", "2", "--interval-ms", "20")
	roots := startUnder(t, dir, h, env, "ptrchase", "--mib", "4", "--interval-ms", "20")
	mine.waitIter(5, time.Minute)
	roots.waitIter(5, time.Minute)
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	asUserCLI := func(args ...string) (string, error) {
		return asOther(t, u, 2*time.Minute, env, binPath(t, "gpucr"), append(args, "--socket", h.socket)...)
	}
	base, child := filepath.Join(home, "base"), filepath.Join(home, "child")
	if out, err := asUserCLI("checkpoint", strconv.Itoa(mine.pid), "-D", base, "--gpu-only", "--leave-running"); err != nil {
		t.Fatalf("the user's checkpoint: %v\n%s", err, out)
	}
	_ = filepath.Walk(filepath.Join(base, image.SubDir), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Error(err)
			return nil
		}
		want := os.FileMode(0o600)
		if fi.IsDir() {
			want = 0o700
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != u.UID || st.Gid != u.GID || fi.Mode().Perm() != want {
			t.Errorf("%s: uid %d gid %d %v; want the user's (%d, %d) and %v", p, st.Uid, st.Gid, fi.Mode(), u.UID, u.GID, want)
		}
		return nil
	})
	if out, err := asOther(t, u, time.Minute, env, binPath(t, "gpucr"), "image", "verify", base); err != nil || !strings.Contains(out, "ok:") {
		t.Errorf("the user cannot verify its image: %v\n%s", err, out)
	}

	if out, err := asUserCLI("checkpoint", strconv.Itoa(mine.pid), "-D", child, "--gpu-only", "--leave-running", "--parent", base); err != nil {
		t.Fatalf("the user's incremental checkpoint: %v\n%s", err, out)
	}
	im, err := image.Open(child)
	if err != nil {
		t.Fatal(err)
	}
	fromParent := 0
	for _, b := range im.Manifest().GetBuffers() {
		for _, c := range b.GetChunks() {
			// the parent's chunk file, linked into the image (the user's
			// own file: the user can delete either image)
			if c.GetLinked() {
				fromParent++
			}
		}
	}
	im.Close()
	if fromParent == 0 {
		t.Errorf("the incremental image takes no chunk from its parent (ptrchase's table never changes)")
	}

	rootImg := filepath.Join(dir, "root-img")
	if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(roots.pid), "-D", rootImg, "--gpu-only", "--leave-running"); err != nil {
		t.Fatalf("root's checkpoint: %v\n%s", err, out)
	}
	os.Chmod(rootImg, 0o755)
	out, err := asUserCLI("checkpoint", strconv.Itoa(mine.pid), "-D", filepath.Join(home, "on-roots"), "--gpu-only", "--leave-running", "--parent", rootImg)
	if err == nil || !strings.Contains(out, "belongs to uid 0") {
		t.Errorf("an incremental image on root's image: %v\n%s", err, out)
	}

	trs := transfersOf(t, rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_Transfers{Transfers: &helperpb.Transfers{}}}, ""))
	var dirs []string
	for _, tr := range trs {
		dirs = append(dirs, tr.ImageDir)
	}
	if !slices.Contains(dirs, base) || !slices.Contains(dirs, child) || slices.Contains(dirs, rootImg) {
		t.Errorf("the user's Transfers lists %v; want its own %s and %s, not root's", dirs, base, child)
	}

	if out, err := asOther(t, u, time.Minute, nil, "rm", "-rf", child, base); err != nil {
		t.Errorf("the user cannot delete its images: %v\n%s", err, out)
	}
}

// TestFIFOInImage: a FIFO where an image has its manifest or a chunk file,
// planted by the second user in its own image (or in the image directory
// it owns), makes `gpucr image verify` and `gpucr restore` fail at once,
// naming the FIFO, instead of waiting on it forever; the helper keeps
// answering.
func TestFIFOInImage(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := sharedHelper(t, dir, env)
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	quick := func(what string, args ...string) string {
		t.Helper()
		start := time.Now()
		out, err := runErr(40*time.Second, append(append([]string{}, env...), "GPUCR_SOCKET="+h.socket), binPath(t, "gpucr"), args...)
		if took := time.Since(start); err == nil || took > 25*time.Second {
			t.Errorf("%s: %v after %v; want a failure at once\n%s", what, err, took.Round(time.Millisecond), out)
		}
		return out
	}
	// plant replaces the image's gpucr/ with the user's copy of it (its
	// own files, or root's readable ones where the user could read them),
	// in which rel becomes a FIFO.
	planted := 0
	plant := func(img, rel string) string {
		t.Helper()
		planted++
		g := filepath.Join(img, image.SubDir)
		orig := fmt.Sprintf("%s.orig%d", g, planted)
		mustAsOther(t, u, "mv", g, orig)
		mustAsOther(t, u, "mkdir", g)
		mustAsOther(t, u, "sh", "-c", `cp -R "$1"/. "$2"/ 2>/dev/null; true`, "sh", orig, g)
		p := filepath.Join(g, rel)
		mustAsOther(t, u, "mkdir", "-p", filepath.Dir(p))
		mustAsOther(t, u, "rm", "-f", p)
		mustAsOther(t, u, "mkfifo", p)
		return p
	}

	mine := startUnderAs(t, dir, h, env, u, "ptrchase", "--mib", "4", "--interval-ms", "20")
	mine.waitIter(5, time.Minute)
	userImg := filepath.Join(home, "img")
	mustAsOther(t, u, "mkdir", userImg)
	if out, err := asOther(t, u, 2*time.Minute, env, binPath(t, "gpucr"), "checkpoint", strconv.Itoa(mine.pid), "-D", userImg,
		"--gpu-only", "--leave-running", "--socket", h.socket); err != nil {
		t.Fatalf("the user's checkpoint: %v\n%s", err, out)
	}
	im, err := image.Open(userImg)
	if err != nil {
		t.Fatal(err)
	}
	chunk := ""
	for bi, b := range im.Manifest().GetBuffers() {
		for ci, c := range b.GetChunks() {
			if chunk == "" && c.GetLocation() == imagepb.Location_LOCATION_LOCAL {
				chunk, _ = filepath.Rel(filepath.Join(userImg, image.SubDir), im.ChunkFile(bi, ci))
			}
		}
	}
	im.Close()
	if chunk == "" {
		t.Fatal("the user's image has no chunk file")
	}
	fifo := plant(userImg, chunk)
	if out := quick("gpucr image verify with a FIFO chunk", "image", "verify", userImg); !strings.Contains(out, fifo) ||
		!strings.Contains(out, "is a FIFO, not a regular file") {
		t.Errorf("gpucr image verify does not name the FIFO %s:\n%s", fifo, out)
	}
	fifo = plant(userImg, "manifest.pb")
	if out := quick("gpucr image verify with a FIFO manifest", "image", "verify", userImg); !strings.Contains(out, fifo) ||
		!strings.Contains(out, "is a FIFO, not a regular file") {
		t.Errorf("gpucr image verify does not name the FIFO %s:\n%s", fifo, out)
	}

	// Root's dump into a directory the user owns; the user puts a FIFO in
	// place of the manifest; root's restore.
	roots := startUnder(t, dir, h, env, "ptrchase", "--mib", "4", "--interval-ms", "20")
	roots.waitIter(15, time.Minute)
	dumpDir := filepath.Join(home, "dump")
	mustAsOther(t, u, "mkdir", dumpDir)
	if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(roots.pid), "-D", dumpDir); err != nil {
		t.Fatalf("root's checkpoint: %v\n%s", err, out)
	}
	roots.reap(30 * time.Second)
	fifo = plant(dumpDir, "manifest.pb")
	out := quick("gpucr restore with a FIFO manifest", "restore", "-D", dumpDir, "--criu-timeout", "40s")
	if !strings.Contains(out, "is a FIFO, not a regular file") {
		t.Errorf("gpucr restore does not say that %s is a FIFO:\n%s", fifo, out)
	}
	if _, err := h.statusErr(); err != nil {
		t.Errorf("the helper does not answer after the restore: %v", err)
	}
	if procState(roots.pid) != "" && procState(roots.pid) != "Z" {
		t.Errorf("pid %d runs after a refused restore", roots.pid)
	}
}
