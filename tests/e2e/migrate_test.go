package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A second machine, on this one: a network namespace joined to this one by
// a veth pair, with its own pid and mount namespaces, an sshd, and a gpucr
// helper of its own. In its mount namespace that helper's directory is
// bound over the source helper's, so the helper socket has the same path
// on both "machines", as /run/gpucr/helper.sock has on two real ones (a
// restored process reconnects to the path its helper had).
type targetMachine struct {
	addr   string    // its address
	ns     string    // its network namespace (ip netns)
	keys   string    // the directory of its sshd's keys (client, authorized_keys)
	ssh    string    // --ssh for gpucr migrate
	gpucr  string    // --target-gpucr
	init   *exec.Cmd // unshare: its pid namespace dies with it
	helper string    // the target helper's log
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startTargetMachine starts the target; srcHelperDir is the directory of
// the source helper's socket, env the helper's environment.
func startTargetMachine(t *testing.T, dir, srcHelperDir string, env []string) *targetMachine {
	t.Helper()
	return startMachine(t, dir, srcHelperDir, env, false, "")
}

// startMachine is startTargetMachine; with ownShm the machine has a
// /dev/shm of its own, as a real one does: the simulated driver names each
// process's checkpoint socket by its pid in /dev/shm, and two machines'
// processes may have the same pid in their own pid namespaces. sshdConf
// are more lines of its sshd's configuration.
func startMachine(t *testing.T, dir, srcHelperDir string, env []string, ownShm bool, sshdConf string) *targetMachine {
	t.Helper()
	sshd := needTool(t, "sshd")
	sshKeygen := needTool(t, "ssh-keygen")
	needTool(t, "ssh")
	ip := needTool(t, "ip")
	unshare := needTool(t, "unshare")
	criu := needTool(t, "criu")
	// 10.213.N.0/24, N from the id, one no machine of this host has taken
	// (this end of each machine's link is here): a second machine of one
	// test, or of a test in a parallel package, on the same subnet would
	// answer for the first (a job test once met the other's sshd)
	used, _ := exec.Command(ip, "-4", "-o", "addr", "show").Output()
	var id string
	var n uint64
	for range 64 {
		id = randomHex(3)
		n, _ = strconv.ParseUint(id[:2], 16, 8)
		if !strings.Contains(string(used), fmt.Sprintf(" 10.213.%d.", n)) {
			break
		}
	}
	ns := "gpucr-mig-" + id
	if out, err := exec.Command(ip, "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("cannot make a network namespace here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", ns).Run() })
	src, dst := fmt.Sprintf("10.213.%d.1", n), fmt.Sprintf("10.213.%d.2", n)
	va, vb := "gma"+id, "gmb"+id
	for _, args := range [][]string{
		{"link", "add", va, "type", "veth", "peer", "name", vb},
		{"link", "set", vb, "netns", ns},
		{"addr", "add", src + "/24", "dev", va},
		{"link", "set", va, "up"},
		{"-n", ns, "addr", "add", dst + "/24", "dev", vb},
		{"-n", ns, "link", "set", vb, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command(ip, "link", "del", va).Run() })

	keys := filepath.Join(dir, "ssh")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"host", "client"} {
		if out, err := exec.Command(sshKeygen, "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(keys, k)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v: %s", err, out)
		}
	}
	copyFile(t, filepath.Join(keys, "client.pub"), filepath.Join(keys, "authorized_keys"))
	conf := filepath.Join(keys, "sshd_config")
	copyText(t, conf, fmt.Sprintf("ListenAddress %s\nHostKey %s\nAuthorizedKeysFile %s\nPermitRootLogin prohibit-password\n"+
		"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n%s",
		dst, filepath.Join(keys, "host"), filepath.Join(keys, "authorized_keys"), sshdConf))
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	tdir := filepath.Join(dir, "target-helper")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := &targetMachine{addr: dst, ns: ns, keys: keys, helper: filepath.Join(dir, "target-helper.log")}
	sock := filepath.Join(srcHelperDir, "helper.sock")
	shm := ""
	if ownShm {
		shm = "mount -t tmpfs -o mode=1777 tmpfs /dev/shm\n"
	}
	script := fmt.Sprintf(`set -e
mount --bind %[1]s %[2]s
`+shm+`%[3]s helper --socket %[4]s --log-level debug >%[5]s 2>&1 &
exec %[6]s -D -e -f %[7]s`, tdir, srcHelperDir, binPath(t, "gpucr"), sock, m.helper, sshd, conf)
	m.init = exec.Command(ip, "netns", "exec", ns, unshare, "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "/bin/sh", "-c", script)
	m.init.Env = env
	slog, err := os.Create(filepath.Join(dir, "target-sshd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer slog.Close()
	m.init.Stdout, m.init.Stderr = slog, slog
	if err := m.init.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.stop)
	m.ssh = fmt.Sprintf("ssh -i %s -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR -o ConnectTimeout=5",
		filepath.Join(keys, "client"))
	m.gpucr = fmt.Sprintf("env GPUCR_SOCKET=%s GPUCR_CRIU=%s PATH=%s %s", sock, criu, os.Getenv("PATH"), binPath(t, "gpucr"))
	// up once sshd answers and the target's helper does
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := m.run("test -S " + sock + " && " + m.gpucr + " status --json")
		if err == nil && strings.Contains(out, `"helper_version"`) {
			return m
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "target-sshd.log"))
			h, _ := os.ReadFile(m.helper)
			t.Fatalf("the target machine does not come up: %v\n%s\nsshd:\n%s\nhelper:\n%s", err, out, tail(string(b), 10), tail(string(h), 10))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// run runs a command line on the target.
func (m *targetMachine) run(cmdline string) (string, error) {
	args := append(strings.Fields(m.ssh)[1:], "root@"+m.addr, cmdline)
	out, err := exec.Command("ssh", args...).CombinedOutput()
	return string(out), err
}

// stop ends the target machine: its pid namespace, whatever runs there.
func (m *targetMachine) stop() {
	if m.init != nil && m.init.Process != nil {
		_ = m.init.Process.Kill()
		_ = m.init.Wait()
		m.init = nil
	}
}

type migrateReport struct {
	Pid           int     `json:"pid"`
	TargetPid     int     `json:"target_pid"`
	Downtime      float64 `json:"downtime_seconds"`
	Dump          float64 `json:"dump_seconds"`
	Transfer      float64 `json:"transfer_seconds"`
	RestoreSecs   float64 `json:"restore_seconds"`
	TransferBytes int64   `json:"transfer_bytes"`
	PreCopySent   int64   `json:"pre_copy_bytes_sent"`
	RemoteDir     string  `json:"remote_dir"`
	DumpReport    struct {
		PreCopy []struct {
			CopiedBytes int64 `json:"copied_bytes"`
		} `json:"pre_copy"`
	} `json:"dump"`
	ImagesDir string `json:"images_dir"`
	Restore   struct {
		GPUProcesses []struct {
			Pid   int    `json:"pid"`
			State string `json:"state"`
		} `json:"gpu_processes"`
	} `json:"restore"`
}

// TestMigrate: `gpucr migrate PID --to HOST` moves a GPU process to another
// machine (namespaces with an sshd, here) over ssh: the GPU memory is
// pre-copied in rounds while it runs (--pre-copy) and the rounds are
// streamed there before the stop, the rest of the image after it; the target's gpucr restores it through the
// target's helper (on demand: --on-demand goes to the target's restore), and
// only then is the source killed. The process computes
// on there exactly as an uninterrupted run.
func TestMigrate(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	srcDir := filepath.Join(dir, "src")
	if err := os.MkdirAll(srcDir, 0o755); err != nil {
		t.Fatal(err)
	}
	h := startHelper(t, srcDir, env)
	m := startTargetMachine(t, dir, srcDir, env)
	args := []string{"--mib", "24", "--interval-ms", "20"}
	a := startUnder(t, dir, h, env, "heartbeat", args...)
	a.waitIter(15, time.Minute)
	pid := a.pid
	out, err := cli(t, h, env, "migrate", strconv.Itoa(pid), "--to", "root@"+m.addr, "--ssh", m.ssh, "--target-gpucr", m.gpucr,
		"--target-dir", filepath.Join(dir, "remote-img"), "--pre-copy", "2", "--on-demand", "--json")
	if err != nil {
		hl, _ := os.ReadFile(m.helper)
		t.Fatalf("gpucr migrate: %v\n%s\ntarget helper:\n%s", err, out, tail(string(hl), 20))
	}
	var r migrateReport
	lastJSON(t, out, &r)
	if r.Pid != pid || r.TargetPid != pid || r.Downtime <= 0 || r.Dump <= 0 || r.TransferBytes < 24<<20 ||
		len(r.Restore.GPUProcesses) != 1 || r.Restore.GPUProcesses[0].State != "running" {
		t.Errorf("migrate report %+v:\n%s", r, out)
	}
	if _, err := os.Stat(r.ImagesDir); err == nil {
		t.Errorf("the local image %s stayed after a migration that succeeded", r.ImagesDir)
	}
	if len(r.DumpReport.PreCopy) == 0 || r.DumpReport.PreCopy[0].CopiedBytes < 24<<20 || r.PreCopySent < 24<<20 {
		t.Errorf("no pre-copy round that copied the GPU memory and went to the target before the stop: %+v, %d bytes sent",
			r.DumpReport.PreCopy, r.PreCopySent)
	}
	t.Logf("migrated pid %d: downtime %.3f s (dump %.3f s, transfer %.3f s, restore %.3f s), %d bytes sent",
		pid, r.Downtime, r.Dump, r.Transfer, r.RestoreSecs, r.TransferBytes)
	a.reap(10 * time.Second) // the source is gone
	// and the source's helper released the memory it kept for it
	deadline := time.Now().Add(10 * time.Second)
	for _, _, ok := h.client(pid); ok; _, _, ok = h.client(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the source helper still lists pid %d after the migration", pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := a.lastIter()
	a.waitIter(before+20, time.Minute) // it computes on at the target
	if hl, _ := os.ReadFile(m.helper); !strings.Contains(string(hl), "restored") || !strings.Contains(string(hl), `"on_demand":true`) {
		t.Errorf("the target's helper did not restore it on demand:\n%s", tail(string(hl), 20))
	}
	m.stop() // the target machine goes, and the process with it
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, before)
}

// failingTarget makes, in dir, a "target" on this machine for gpucr
// migrate: an ssh stand-in that runs the command line here, and a gpucr
// that answers `version`, receives and discards the image (`gpucr image
// receive|discard`), and fails every restore.
func failingTarget(t *testing.T, dir string) (ssh, gpucr string) {
	t.Helper()
	fakeSSH := filepath.Join(dir, "fake-ssh")
	copyText(t, fakeSSH, "#!/bin/sh\nshift\nexec /bin/sh -c \"$1\"\n")
	fakeGpucr := filepath.Join(dir, "fake-gpucr")
	copyText(t, fakeGpucr, fmt.Sprintf("#!/bin/sh\ncase \"$1\" in version|image) exec %[1]s \"$@\";; esac\n"+
		"echo '{\"error\": \"restore refused by the test\", \"hints\": [\"none\"]}'\nexit 1\n", binPath(t, "gpucr")))
	for _, f := range []string{fakeSSH, fakeGpucr} {
		if err := os.Chmod(f, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return fakeSSH, fakeGpucr
}

// TestMigrateFailureContinuesSource: a migration whose restore fails at the
// target leaves the source as it was: it is continued where it stopped,
// gets its GPU back, and computes on exactly; the target's copy of the
// image is removed and the local one kept.
func TestMigrateFailureContinuesSource(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	fakeSSH, fakeGpucr := failingTarget(t, dir)
	args := []string{"--mib", "24", "--interval-ms", "20"}
	a := startUnder(t, dir, h, env, "heartbeat", args...)
	a.waitIter(15, time.Minute)
	img, remote := filepath.Join(dir, "img"), filepath.Join(dir, "remote")
	out, err := cli(t, h, env, "migrate", strconv.Itoa(a.pid), "--to", "elsewhere", "--ssh", fakeSSH, "--target-gpucr", fakeGpucr,
		"-D", img, "--target-dir", remote)
	if err == nil || !strings.Contains(out, "migration failed in its restore") || !strings.Contains(out, "restore refused by the test") ||
		!strings.Contains(out, fmt.Sprintf("the source (pid %d) runs on", a.pid)) {
		t.Fatalf("gpucr migrate to a failing target: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	if _, err := os.Stat(remote); err == nil {
		t.Errorf("the target's copy %s stayed", remote)
	}
	if _, err := os.Stat(filepath.Join(img, "inventory.img")); err != nil {
		t.Errorf("the local image is gone: %v", err)
	}
	at := a.lastIter()
	a.waitIter(at+20, time.Minute)
	if st := procState(a.pid); st == "T" || st == "" {
		t.Errorf("the source is in state %q", st)
	}
	// The image the failed migration kept is not mixed with a new one:
	// refused before anything stops, unless --force.
	out, err = cli(t, h, env, "migrate", strconv.Itoa(a.pid), "--to", "elsewhere", "--ssh", fakeSSH, "--target-gpucr", fakeGpucr,
		"-D", img, "--target-dir", remote)
	if err == nil || !strings.Contains(out, "already holds") || !strings.Contains(out, "--force") || strings.Contains(out, "dumping") {
		t.Errorf("a migration into the kept image's directory: %v\n%s", err, out)
	}
	a.waitIter(a.lastIter()+5, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, "heartbeat", args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, 0)
}

// TestMigrateFailureContinuesSourceConnections: a migration whose restore
// fails at the target continues the source, and the source's TCP
// connections (a parent and its child talking over one, dumped
// established) carry on: CRIU leaves the sockets of a --leave-stopped dump
// in repair mode, where every recv() fails with EPERM, and gpucr takes them
// out of it before the source runs again; it removes the links CRIU made
// for the dump (--link-remap), which would fail the next dump.
func TestMigrateFailureContinuesSourceConnections(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	env := noHelperEnv(dir)
	fakeSSH, fakeGpucr := failingTarget(t, dir)
	marks, pidfile := filepath.Join(dir, "marks"), filepath.Join(dir, "pids")
	root := startPyTree(t, dir, "ddp.py", ddpLike, marks, pidfile)
	readPids(t, pidfile)
	waitDDPMarks(t, marks, true, 20)
	img, remote := filepath.Join(dir, "img"), filepath.Join(dir, "remote")
	out, code := gpucrRun(t, env, "migrate", strconv.Itoa(root), "--to", "elsewhere", "--ssh", fakeSSH, "--target-gpucr", fakeGpucr,
		"-D", img, "--target-dir", remote)
	if code == 0 || !strings.Contains(out, "migration failed in its restore") || !strings.Contains(out, fmt.Sprintf("the source (pid %d) runs on", root)) {
		t.Fatalf("gpucr migrate to a failing target: exit %d\n%s", code, out)
	}
	t.Logf("%s", out)
	at := len(ddpMarks(t, marks, true))
	waitDDPMarks(t, marks, true, at+30)
	// The links CRIU made for the dump (--link-remap: the semaphore's) are
	// gone with the continuation, as after a dump that lets the tree run
	// on: the next checkpoint does not meet them ("File exists").
	out, code = gpucrRun(t, env, "checkpoint", strconv.Itoa(root), "-D", filepath.Join(dir, "again"), "--leave-running")
	if code != 0 {
		t.Fatalf("a checkpoint of the continued source: exit %d\n%s", code, out)
	}
	waitDDPMarks(t, marks, true, len(ddpMarks(t, marks, true))+10)
}
