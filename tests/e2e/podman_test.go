package e2e

// podman container checkpoint / restore, in place and through an exported
// archive, of a container whose application runs on helper-owned GPU memory.

import (
	"archive/tar"
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// podmanRig is a podman that leaves the machine's own configuration and
// containers alone. Its configuration (CONTAINERS_CONF), storage
// (CONTAINERS_STORAGE_CONF: graphroot, runroot) and state (tmp_dir, file
// locks, events) are in a temporary directory, and every podman command runs
// in a private mount namespace, entered with nsenter, in which
//
//   - /run is a fresh tmpfs, and /run/gpucr in it is the test helper's socket
//     directory. podman starts runc, and runc CRIU, with no environment but
//     PATH, so GPUCR_SOCKET never reaches gpucr's plugin: it reaches the
//     helper at the default /run/gpucr/helper.sock. In the namespace that is
//     this test's helper; a helper the machine runs there is neither seen nor
//     disturbed, and nothing is created in the machine's /run (runc's
//     /run/runc and CRIU's /run/criu.kdat land in the tmpfs too).
//   - the root file system is read-only, except /tmp (CRIU makes temporary
//     directories there) and the test's directory: whatever podman would
//     write into /etc or /var (its blob cache in /var/lib/containers, CNI's
//     lock in /etc/cni) fails or is skipped instead of changing the machine.
//
// The containers' cgroups are below a cgroup parent of the test's own, which
// is removed at the end.
type podmanRig struct {
	t            testing.TB
	podman       string
	nsenter      string
	dir          string
	env          []string
	holder       *exec.Cmd // sleeps in the namespace, which podman commands enter
	cgroupParent string
}

// newPodmanRig configures podman in a temporary directory and starts the
// namespace whose /run/gpucr is hdir (the helper's socket directory).
func newPodmanRig(t testing.TB, hdir string) *podmanRig {
	t.Helper()
	p := &podmanRig{t: t, podman: needTool(t, "podman"), nsenter: needTool(t, "nsenter"), dir: t.TempDir(),
		cgroupParent: fmt.Sprintf("/gpucr-e2e-%d", os.Getpid())}
	unshare := needTool(t, "unshare")
	tmp, net := filepath.Join(p.dir, "tmp"), filepath.Join(p.dir, "net.d")
	for _, d := range []string{tmp, net} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// default_ulimits = []: podman sets no rlimits of its own (raising one
	// needs CAP_SYS_RESOURCE, which CI machines lack). runc: Debian's crun has
	// no CRIU support. cgroupfs, file events and file locks: no systemd, no
	// journald, no shared memory segment shared with other podmans.
	conf := fmt.Sprintf(`[containers]
default_ulimits = []
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %q
tmp_dir = %q
lock_type = "file"
image_copy_tmp_dir = %q

[network]
network_config_dir = %q
`, filepath.Join(p.dir, "events.log"), tmp, tmp, net)
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n",
		filepath.Join(p.dir, "graph"), filepath.Join(p.dir, "run"))
	confPath, storagePath := filepath.Join(p.dir, "containers.conf"), filepath.Join(p.dir, "storage.conf")
	for path, s := range map[string]string{confPath: conf, storagePath: storage} {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p.env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + p.dir, "TMPDIR=" + tmp,
		"CONTAINERS_CONF=" + confPath, "CONTAINERS_STORAGE_CONF=" + storagePath}

	// Removed last: the cgroups podman made below the test's parent.
	t.Cleanup(p.removeCgroups)

	const script = `set -e
mount --bind /tmp /tmp
mount --bind "$1" "$1"
mount -o remount,bind,ro /
mount -t tmpfs -o mode=0755 gpucr-e2e-run /run
ln -s /dev/shm /run/shm
mkdir /run/gpucr
mount --bind "$2" /run/gpucr
exec sleep 100000
`
	logPath := filepath.Join(p.dir, "namespace.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p.holder = exec.Command(unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", p.dir, hdir)
	p.holder.Stdout, p.holder.Stderr = f, f
	if err := p.holder.Start(); err != nil {
		t.Fatalf("unshare: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = p.holder.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = p.holder.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(20 * time.Second)
	for !p.namespaceReady() {
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the mount namespace for podman could not be set up:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the mount namespace for podman was not ready after 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Registered after the holder: runs before it is killed.
	t.Cleanup(func() { _, _ = p.podmanErr(time.Minute, "rm", "--all", "--force", "--time", "0") })
	return p
}

// namespaceReady: the holder's namespace has its /run/gpucr mount.
func (p *podmanRig) namespaceReady() bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", p.holder.Process.Pid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && fs[4] == "/run/gpucr" {
			return true
		}
	}
	return false
}

// podmanErr runs podman in the namespace and returns its output. The output
// goes to a file, never a pipe: conmon and the container would inherit a
// pipe and keep the command from finishing.
func (p *podmanRig) podmanErr(timeout time.Duration, args ...string) (string, error) {
	f, err := os.CreateTemp(p.dir, "podman-*.log")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cmd := exec.Command(p.nsenter, append([]string{"--target", strconv.Itoa(p.holder.Process.Pid), "--mount", "--", p.podman}, args...)...)
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = p.env, nil, f, f
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		err = fmt.Errorf("timed out after %v: %w", timeout, <-done)
	}
	out, _ := os.ReadFile(f.Name())
	return string(out), err
}

var criuLogRE = regexp.MustCompile(`log file: (\S+?)(\\n|"|\s|$)`)

// do runs podman and fails the test, with the end of any CRIU log its error
// names, if podman fails.
func (p *podmanRig) do(timeout time.Duration, args ...string) string {
	p.t.Helper()
	out, err := p.podmanErr(timeout, args...)
	if err != nil {
		msg := fmt.Sprintf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
		for _, m := range criuLogRE.FindAllStringSubmatch(out, -1) {
			if b, err := os.ReadFile(m[1]); err == nil {
				msg += fmt.Sprintf("\n%s:\n%s", m[1], tail(string(b), 30))
			}
		}
		p.t.Fatal(msg)
	}
	return strings.TrimSpace(out)
}

// inspect is one field of `podman container inspect`.
func (p *podmanRig) inspect(name, format string) string {
	p.t.Helper()
	return p.do(30*time.Second, "container", "inspect", "--format", format, name)
}

func (p *podmanRig) pid(name string) int {
	p.t.Helper()
	s := p.inspect(name, "{{.State.Pid}}")
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		p.t.Fatalf("container %s: pid %q", name, s)
	}
	return pid
}

// removeCgroups removes the test's cgroup parent (and the empty cgroups
// podman left below it: conmon's) from every cgroup hierarchy.
func (p *podmanRig) removeCgroups() {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		i := 6
		for i < len(f) && f[i] != "-" {
			i++
		}
		if i+1 >= len(f) || (f[i+1] != "cgroup" && f[i+1] != "cgroup2") {
			continue
		}
		root := filepath.Join(f[4], p.cgroupParent)
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for j := len(dirs) - 1; j >= 0; j-- {
			_ = os.Remove(dirs[j])
		}
	}
}

// importBusybox makes a container image from busybox (busybox-static's
// /bin/busybox, /bin/sh linking to it) with podman import. The test
// application comes from the build directory and its C library from the
// host's /usr, bound in when the container is created; /lib and /lib64
// are the host's symlinks into /usr, or mount points for the host's own
// directories where they are not symlinks (returned as extra -v options).
func (p *podmanRig) importBusybox(image string) (volumes []string) {
	t := p.t
	t.Helper()
	busybox, err := os.ReadFile(needTool(t, "busybox"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(p.dir, "rootfs.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	hdr := func(h *tar.Header) {
		h.ModTime = time.Now()
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin", "dev", "etc", "proc", "sys", "run", "run/gpucr", "work", "gpucr", "usr"} {
		hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755})
	}
	hdr(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777})
	hdr(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(busybox))})
	if _, err := tw.Write(busybox); err != nil {
		t.Fatal(err)
	}
	hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/sh", Linkname: "busybox"})
	for _, d := range []string{"lib", "lib64"} {
		fi, err := os.Lstat("/" + d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink("/" + d)
			if err != nil {
				t.Fatal(err)
			}
			hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: d, Linkname: target})
		case fi.IsDir():
			hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755})
			volumes = append(volumes, "-v", "/"+d+":/"+d+":ro,bind")
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	p.do(time.Minute, "import", path, image)
	return volumes
}

// waitClient waits until pid is a client of the helper.
func waitClient(t testing.TB, h *helperProc, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, _, ok := h.client(pid); ok {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(h.log)
			t.Fatalf("pid %d is no client of the helper after %v; helper log:\n%s", pid, timeout, tail(string(b), 15))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// heartbeatsFrom are the heartbeats in the application's log from byte
// offset off on: those of one restored container, when several restored
// from one archive append to the same log.
func heartbeatsFrom(a *app, off int) []heartbeat {
	out := a.output()
	if off > len(out) {
		return nil
	}
	_, hbs := parseHeartbeats(out[off:])
	return hbs
}

func waitIterFrom(a *app, off, n int, timeout time.Duration) {
	a.t.Helper()
	a.waitFor(timeout, fmt.Sprintf("heartbeat for iteration %d after the restore", n), func(out string, _ []heartbeat) bool {
		if off > len(out) {
			return false
		}
		_, hbs := parseHeartbeats(out[off:])
		return len(hbs) > 0 && hbs[len(hbs)-1].Iter >= n
	})
}

// checkResumed: the heartbeats of a restored process go on from last, the
// last heartbeat the checkpointed process wrote, by one period (no gap, no
// repeat), and on at that period.
func checkResumed(t testing.TB, what string, hbs []heartbeat, last heartbeat, period int) {
	t.Helper()
	if len(hbs) == 0 {
		t.Errorf("%s: no heartbeat", what)
		return
	}
	if hbs[0].Iter != last.Iter+period {
		t.Errorf("%s: first heartbeat is for iteration %d, the checkpointed process's last was %d (period %d)",
			what, hbs[0].Iter, last.Iter, period)
	}
	checkContinuous(t, hbs, last.Iter)
}

// TestPodmanCheckpointRestore: a podman container runs a test application on
// the simulated driver, the interposer preloaded and the helper's socket
// directory bound in, gpucr's plugin given to CRIU through the
// org.criu.config annotation. `podman container checkpoint` and `restore`
// in place; then `checkpoint --export` to an archive, `podman rm`, and two
// `restore --import` from that archive, the second as a fresh container
// under another name. After every restore the application computes on with
// exactly the checksums of an uninterrupted run, and the GPU images (in
// podman's checkpoint directory, and in the unpacked archive) verify.
func TestPodmanCheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	needTool(t, "runc")
	tarTool := needTool(t, "tar")
	start := time.Now()
	phase := start
	step := func(what string) {
		t.Logf("%-40s %5.1fs", what, time.Since(phase).Seconds())
		phase = time.Now()
	}

	dir := t.TempDir()
	hdir, work := filepath.Join(dir, "helper"), filepath.Join(dir, "work")
	for _, d := range []string{hdir, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := gpucrEnv(t)
	h := startHelper(t, hdir, env)
	p := newPodmanRig(t, hdir)
	criuConf := filepath.Join(dir, "criu.conf")
	if err := os.WriteFile(criuConf, []byte("libdir "+pluginDir(t)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	image := "localhost/gpucr-e2e-busybox:latest"
	volumes := p.importBusybox(image)
	step("helper, podman set up, image imported")

	tc := appCases[0]
	period := 0
	for i, a := range tc.args {
		if a == "--hb-every" && i+1 < len(tc.args) {
			period, _ = strconv.Atoi(tc.args[i+1])
		}
	}
	if period <= 0 {
		t.Fatalf("no --hb-every in %v", tc.args)
	}
	appCmd := "exec /gpucr/bin/" + tc.name + " " + strings.Join(tc.args, " ") + " --interval-ms 20 >>/work/app.log 2>&1"
	name := fmt.Sprintf("gpucr-e2e-%d", os.Getpid())
	// The host's /usr with bind, not podman's default rbind: a file system
	// CRIU does not know mounted below it (a GPU host's /usr/local/nvidia)
	// would make the dump fail (docs/containers.md).
	runArgs := append([]string{"run", "--detach", "--pull", "never", "--name", name, "--network", "host",
		"--cgroup-parent", p.cgroupParent, "--annotation", "org.criu.config=" + criuConf,
		"-v", buildDir(t) + ":/gpucr:ro", "-v", work + ":/work", "-v", "/run/gpucr:/run/gpucr", "-v", "/usr:/usr:ro,bind"},
		volumes...)
	runArgs = append(runArgs,
		"-e", "LD_LIBRARY_PATH=/gpucr/sim", "-e", "GPUCR_LIBCUDA=/gpucr/sim/libcuda.so.1",
		"-e", "LD_PRELOAD=/gpucr/lib/libgpucr.so", "-e", "GPUCR_SOCKET=/run/gpucr/helper.sock",
		image, "/bin/sh", "-c", appCmd)
	p.do(time.Minute, runArgs...)
	a := &app{t: t, name: tc.name, log: filepath.Join(work, "app.log"), pid: p.pid(name)}
	a.waitIter(15, time.Minute)
	waitClient(t, h, a.pid, 10*time.Second)
	step("container running, helper client")

	// In place: podman keeps the checkpoint in the container's directory.
	imgDir := filepath.Join(p.inspect(name, "{{.StaticDir}}"), "checkpoint")
	p.do(2*time.Minute, "container", "checkpoint", name)
	waitDead(t, a.pid, 10*time.Second)
	before := a.lastIter()
	step("podman container checkpoint")
	if out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "verify", imgDir); !strings.Contains(out, "ok:") {
		t.Fatalf("GPU image in podman's checkpoint: %s", out)
	}
	p.do(2*time.Minute, "container", "restore", name)
	a.pid = p.pid(name)
	waitClient(t, h, a.pid, 10*time.Second)
	step("podman container restore")
	a.waitIter(before+20, time.Minute)

	// Exported: the archive holds CRIU's image with the GPU image in it.
	archive := filepath.Join(dir, "checkpoint.tar")
	p.do(2*time.Minute, "container", "checkpoint", "--export", archive, "--compress", "none", name)
	waitDead(t, a.pid, 10*time.Second)
	step("podman container checkpoint --export")
	history := a.heartbeats() // run, checkpoint, restore, checkpoint: one history
	checkContinuous(t, history, before)
	last := history[len(history)-1]
	unpacked := filepath.Join(dir, "unpacked")
	if err := os.Mkdir(unpacked, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, time.Minute, nil, tarTool, "-C", unpacked, "-xf", archive)
	if out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "verify", filepath.Join(unpacked, "checkpoint")); !strings.Contains(out, "ok:") {
		t.Fatalf("GPU image in the exported archive: %s", out)
	}
	p.do(time.Minute, "rm", name)

	// Two restores from the one archive: the removed container's name first,
	// then a fresh container under another name. Both append to the same
	// log, so each is judged by what it wrote.
	segments := map[string][]heartbeat{}
	for _, restored := range []string{name, name + "-2"} {
		args := []string{"container", "restore", "--import", archive}
		if restored != name {
			args = append(args, "--name", restored)
		}
		off := len(a.output())
		p.do(2*time.Minute, args...)
		a.pid = p.pid(restored)
		waitClient(t, h, a.pid, 10*time.Second)
		step("podman container restore --import")
		waitIterFrom(a, off, last.Iter+20, time.Minute)
		p.do(time.Minute, "rm", "--force", "--time", "0", restored)
		waitDead(t, a.pid, 10*time.Second)
		waitNoClients(t, h, 10*time.Second)
		segments[restored] = heartbeatsFrom(a, off)
	}

	// Two restores from the one archive running at the same time: the same
	// image, the same pid inside each container, the same token, the same
	// wake file. Each must get its own memory and run on, and both are
	// clients of the helper at once. They write identical lines to the one
	// log, so every iteration shows up twice.
	off := len(a.output())
	var pids []int
	for _, restored := range []string{name + "-3", name + "-4"} {
		p.do(2*time.Minute, "container", "restore", "--import", archive, "--name", restored)
		pids = append(pids, p.pid(restored))
	}
	for _, pid := range pids {
		waitClient(t, h, pid, 10*time.Second)
	}
	target := last.Iter + 20
	a.waitFor(time.Minute, fmt.Sprintf("iteration %d from both containers", target), func(out string, _ []heartbeat) bool {
		n := 0
		for _, hb := range heartbeatsFrom(a, off) {
			if hb.Iter == target {
				n++
			}
		}
		return n == 2
	})
	st := h.status()
	for _, pid := range pids {
		found := false
		for _, c := range st.Clients {
			if n, _ := c.Pid.Int64(); int(n) == pid {
				found = true
				if !c.Checkpointable {
					t.Errorf("restored container process %d is not checkpointable: %v", pid, c.NotCheckpointable)
				}
			}
		}
		if !found {
			t.Errorf("restored container process %d is not a client of the helper (%d clients)", pid, len(st.Clients))
		}
	}
	step("two concurrent restore --import")
	p.do(time.Minute, "rm", "--force", "--time", "0", name+"-3", name+"-4")
	for _, pid := range pids {
		waitDead(t, pid, 10*time.Second)
	}
	waitNoClients(t, h, 10*time.Second)
	concurrent := map[int][]string{}
	for _, hb := range heartbeatsFrom(a, off) {
		concurrent[hb.Iter] = append(concurrent[hb.Iter], hb.Checksum)
	}

	maxIter := last.Iter
	for _, hbs := range segments {
		if n := len(hbs); n > 0 && hbs[n-1].Iter > maxIter {
			maxIter = hbs[n-1].Iter
		}
	}
	ref := reference(t, env, tc.name, tc.args, maxIter)
	compareWithReference(t, history, ref)
	for restored, hbs := range segments {
		what := "container " + restored + " restored from the archive"
		checkResumed(t, what, hbs, last, period)
		compareWithReference(t, hbs, ref)
	}
	if target > maxIter {
		ref = reference(t, env, tc.name, tc.args, target)
	}
	for it := last.Iter + period; it <= target; it += period {
		sums := concurrent[it]
		if len(sums) != 2 {
			t.Errorf("concurrent restores: iteration %d reported %d times, want once by each container", it, len(sums))
		}
		for _, sum := range sums {
			if sum != ref[it] {
				t.Errorf("concurrent restores: iteration %d: checksum %s, uninterrupted run has %s", it, sum, ref[it])
			}
		}
	}
	t.Logf("podman test: %.1fs in all", time.Since(start).Seconds())
}
