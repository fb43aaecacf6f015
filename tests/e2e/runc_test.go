package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testroot"
)

// container is a runc container running one test application, with its own
// runc state directory so tests never touch the host's containers.
type container struct {
	t      testing.TB
	runc   string
	root   string // runc --root
	bundle string
	id     string
	work   string // host directory bound at /work in the container
}

// do runs a runc command. Its output goes to a file, never a pipe: a
// container started by run or restore inherits runc's stdio, and a pipe to
// this test would both keep the command from finishing and be a peer outside
// the container that CRIU cannot dump.
func (c *container) do(timeout time.Duration, args ...string) {
	c.t.Helper()
	logPath := filepath.Join(c.root, "runc-command.log")
	f, err := os.Create(logPath)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.runc, append([]string{"--root", c.root}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, f, f
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logPath)
		c.t.Fatalf("runc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (c *container) pid(pidFile string) int {
	c.t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		c.t.Fatalf("runc pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		c.t.Fatalf("runc pid file %s: %q", pidFile, b)
	}
	return pid
}

// TestRuncCheckpointRestore checkpoints a container running a test
// application on the simulated driver with `runc checkpoint` and brings it
// back with `runc restore`, the path container runtimes (runc, podman) take.
func TestRuncCheckpointRestore(t *testing.T) {
	needTool(t, "criu")
	c := &container{t: t, runc: needTool(t, "runc"), id: fmt.Sprintf("gpucr-e2e-%d", os.Getpid())}
	dir := t.TempDir()
	c.root, c.bundle, c.work = filepath.Join(dir, "runc"), filepath.Join(dir, "bundle"), filepath.Join(dir, "work")
	img, cwork := filepath.Join(dir, "img"), filepath.Join(dir, "criu-work")
	for _, d := range []string{c.root, c.work, img, cwork} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tc := appCases[0]
	appCmd := "exec /gpucr/bin/" + tc.name + " " + strings.Join(tc.args, " ") + " >>/work/app.log 2>&1"
	run(t, time.Minute, nil, "bash", filepath.Join(testroot.Dir(t), "scripts", "oci-bundle.sh"),
		"-w", buildDir(t)+":/gpucr", "-w", c.work+":/work",
		"-e", "LD_LIBRARY_PATH=/gpucr/sim", c.bundle, "--", "/bin/sh", "-c", appCmd)

	pidFile := filepath.Join(dir, "pid1")
	c.do(time.Minute, "run", "-d", "--pid-file", pidFile, "-b", c.bundle, c.id)
	t.Cleanup(func() { _, _ = runErr(30*time.Second, nil, c.runc, "--root", c.root, "delete", "-f", c.id) })
	a := &app{t: t, name: tc.name, log: filepath.Join(c.work, "app.log"), pid: c.pid(pidFile)}
	a.waitIter(15, time.Minute)

	env := simEnv(t)
	driverCheckpoint(t, env, a.pid, "lock", "checkpoint")
	before := a.lastIter()
	c.do(2*time.Minute, "checkpoint", "--image-path", img, "--work-path", cwork, c.id)
	waitDead(t, a.pid, 10*time.Second)

	pidFile2 := filepath.Join(dir, "pid2")
	c.do(2*time.Minute, "restore", "-d", "--image-path", img, "--work-path", cwork,
		"--pid-file", pidFile2, "-b", c.bundle, c.id)
	a.pid = c.pid(pidFile2)
	driverCheckpoint(t, env, a.pid, "restore", "unlock")
	a.waitIter(before+20, time.Minute)
	c.do(30*time.Second, "kill", c.id, "KILL")

	hbs := a.heartbeats()
	ref := reference(t, env, tc.name, tc.args, hbs[len(hbs)-1].Iter)
	compareWithReference(t, hbs, ref)
	checkContinuous(t, hbs, before)
}

// TestRuncWithPlugin: `runc checkpoint` / `runc restore` of a container whose
// application runs on helper-owned GPU memory (the interposer preloaded, the
// helper's socket directory bound into the container), with gpucr's plugin
// given to CRIU through the org.criu.config annotation. The restored process
// has another host pid (new pid namespace); the helper finds it by its pid
// inside the container, which the image records.
func TestRuncWithPlugin(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	img, cwork, hdir := filepath.Join(dir, "img"), filepath.Join(dir, "criu-work"), filepath.Join(dir, "helper")
	for _, d := range []string{img, cwork, hdir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := gpucrEnv(t)
	h := startHelper(t, hdir, env)
	t.Setenv("GPUCR_SOCKET", h.socket) // runc -> criu -> the plugin
	tc := appCases[0]
	c := pluginContainer(t, dir, "plugin", hdir, tc, false)
	pidFile := filepath.Join(dir, "pid1")
	c.do(time.Minute, "run", "-d", "--pid-file", pidFile, "-b", c.bundle, c.id)
	a := &app{t: t, name: tc.name, log: filepath.Join(c.work, "app.log"), pid: c.pid(pidFile)}
	a.waitIter(15, time.Minute)
	if _, _, ok := h.client(a.pid); !ok {
		t.Fatalf("the containerized application (pid %d) is no client of the helper", a.pid)
	}
	// gpucr status names its container
	var st struct {
		Clients []struct {
			Pid       int    `json:"pid"`
			Container string `json:"container"`
			NsPid     int    `json:"ns_pid"`
		} `json:"clients"`
	}
	if err := json.Unmarshal([]byte(run(t, 10*time.Second, nil, binPath(t, "gpucr"), "status", "--json", "--socket", h.socket)), &st); err != nil ||
		len(st.Clients) != 1 || st.Clients[0].Container != c.id || st.Clients[0].NsPid == a.pid || st.Clients[0].NsPid == 0 {
		t.Errorf("gpucr status of the containerized client: %+v (%v), want container %s and its pid inside", st, err, c.id)
	}
	if out := run(t, 10*time.Second, nil, binPath(t, "gpucr"), "status", "--socket", h.socket); !strings.Contains(out, c.id+" (pid ") {
		t.Errorf("gpucr status shows no container column:\n%s", out)
	}
	before := a.lastIter()
	c.do(2*time.Minute, "checkpoint", "--image-path", img, "--work-path", cwork, c.id)
	waitDead(t, a.pid, 10*time.Second)
	if out := run(t, time.Minute, nil, binPath(t, "gpucr"), "image", "verify", img); !strings.Contains(out, "ok:") {
		t.Fatalf("GPU image: %s", out)
	}

	pidFile2 := filepath.Join(dir, "pid2")
	c.do(2*time.Minute, "restore", "-d", "--image-path", img, "--work-path", cwork,
		"--pid-file", pidFile2, "-b", c.bundle, c.id)
	a.pid = c.pid(pidFile2)
	a.waitIter(before+20, time.Minute)
	c.do(30*time.Second, "kill", c.id, "KILL")

	hbs := a.heartbeats()
	compareWithReference(t, hbs, reference(t, env, tc.name, tc.args, hbs[len(hbs)-1].Iter))
	checkContinuous(t, hbs, before)
}

// annotate sets one annotation in an OCI config.json.
func annotate(t testing.TB, path, key, value string) {
	t.Helper()
	editConfig(t, path, func(cfg map[string]any) {
		ann, _ := cfg["annotations"].(map[string]any)
		if ann == nil {
			ann = map[string]any{}
		}
		ann[key] = value
		cfg["annotations"] = ann
	})
}

// editConfig rewrites the OCI config.json at path as edit changes it.
func editConfig(t testing.TB, path string, edit func(cfg map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	if b, err = json.MarshalIndent(cfg, "", "  "); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRuncReplicasFromResidentImage: one container checkpointed, its image
// made resident (`gpucr image load`), then restored three times at once
// into three containers (runc restore of the one image path, each container
// with its own pid and network namespaces and its own /work): the way a server is
// scaled out from one warmed-up image. Each replica's GPU data is copied on
// the device from the one resident copy, and each computes exactly what an
// uninterrupted run does.
func TestRuncReplicasFromResidentImage(t *testing.T) {
	needTool(t, "criu")
	needTool(t, "runc")
	dir := t.TempDir()
	img, hdir := filepath.Join(dir, "img"), filepath.Join(dir, "helper")
	for _, d := range []string{img, hdir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := gpucrEnv(t)
	h := startHelper(t, hdir, env, "--resident-memory", "64M")
	t.Setenv("GPUCR_SOCKET", h.socket) // runc -> criu -> the plugin
	tc := appCases[0]
	newContainer := func(name string) *container {
		return pluginContainer(t, filepath.Join(dir, name), name, hdir, tc, true)
	}
	orig := newContainer("orig")
	pidFile := filepath.Join(dir, "orig", "pid")
	orig.do(time.Minute, "run", "-d", "--pid-file", pidFile, "-b", orig.bundle, orig.id)
	a := &app{t: t, name: tc.name, log: filepath.Join(orig.work, "app.log"), pid: orig.pid(pidFile)}
	a.waitIter(15, time.Minute)
	before := a.lastIter()
	orig.do(2*time.Minute, "checkpoint", "--image-path", img, "--work-path", filepath.Join(dir, "orig"), orig.id)
	waitDead(t, a.pid, 10*time.Second)
	atDump, err := os.ReadFile(a.log)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cli(t, h, env, "image", "load", img); err != nil {
		t.Fatalf("gpucr image load: %v\n%s", err, out)
	}

	const n = 3
	reps := make([]*container, n)
	for i := range reps {
		reps[i] = newContainer(fmt.Sprintf("replica%d", i))
		// CRIU reopens the log as it was at the dump, in each replica's /work.
		if err := os.WriteFile(filepath.Join(reps[i].work, "app.log"), atDump, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i, c := range reps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.do(2*time.Minute, "restore", "-d", "--image-path", img, "--work-path", filepath.Join(dir, fmt.Sprintf("replica%d", i)),
				"--pid-file", filepath.Join(dir, fmt.Sprintf("replica%d", i), "pid"), "-b", c.bundle, c.id)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var runs [][]heartbeat
	last := 0
	for i, c := range reps {
		r := &app{t: t, name: tc.name, log: filepath.Join(c.work, "app.log"), pid: c.pid(filepath.Join(dir, fmt.Sprintf("replica%d", i), "pid"))}
		r.waitIter(before+20, time.Minute)
		c.do(30*time.Second, "kill", c.id, "KILL")
		waitDead(t, r.pid, 10*time.Second)
		runs = append(runs, r.heartbeats())
		last = max(last, maxIter(runs[i]))
	}
	ref := reference(t, env, tc.name, tc.args, last)
	for _, hbs := range runs {
		compareWithReference(t, hbs, ref)
		checkContinuous(t, hbs, before)
	}
	if got := strings.Count(h.logText(), `"from_resident":true`); got != n {
		t.Errorf("%d of the %d replicas' GPU data came from the resident copy", got, n)
	}
	if st := residents(t, h, env); len(st.Resident) != 1 || st.Resident[0].Restores != n {
		t.Errorf("status after %d replicas: %+v", n, st)
	}
}

// privateNetwork gives the container of an OCI config.json a network
// namespace of its own: replicas of one image restore the same abstract
// Unix sockets (a name space per network namespace), which would collide
// in the host's.
func privateNetwork(t testing.TB, path string) {
	t.Helper()
	editConfig(t, path, func(cfg map[string]any) {
		linux, _ := cfg["linux"].(map[string]any)
		if linux == nil {
			t.Fatalf("%s: no linux section", path)
		}
		nss, _ := linux["namespaces"].([]any)
		linux["namespaces"] = append(nss, map[string]any{"type": "network"})
	})
}

// pluginContainer makes a runc container below dir (its runc root, bundle
// and /work) that runs the test application tc under the interposer, with
// the helper's socket directory hdir bound in and gpucr's plugin named to
// CRIU by the org.criu.config annotation; deleted when the test ends. With
// privateNet it gets a network namespace of its own.
func pluginContainer(t *testing.T, dir, name, hdir string, tc appCase, privateNet bool) *container {
	t.Helper()
	c := &container{t: t, runc: needTool(t, "runc"), id: fmt.Sprintf("gpucr-e2e-%s-%d", name, os.Getpid())}
	c.root, c.bundle, c.work = filepath.Join(dir, "runc"), filepath.Join(dir, "bundle"), filepath.Join(dir, "work")
	for _, d := range []string{c.root, c.work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(dir, "criu.conf")
	if err := os.WriteFile(conf, []byte("libdir "+pluginDir(t)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	appCmd := "exec /gpucr/bin/" + tc.name + " " + strings.Join(tc.args, " ") + " --interval-ms 20 >>/work/app.log 2>&1"
	run(t, time.Minute, nil, "bash", filepath.Join(testroot.Dir(t), "scripts", "oci-bundle.sh"),
		"-w", buildDir(t)+":/gpucr", "-w", c.work+":/work", "-w", hdir+":/run/gpucr",
		"-e", "LD_LIBRARY_PATH=/gpucr/sim", "-e", "GPUCR_LIBCUDA=/gpucr/sim/libcuda.so.1",
		"-e", "LD_PRELOAD=/gpucr/lib/libgpucr.so", "-e", "GPUCR_SOCKET=/run/gpucr/helper.sock",
		c.bundle, "--", "/bin/sh", "-c", appCmd)
	annotate(t, filepath.Join(c.bundle, "config.json"), "org.criu.config", conf)
	if privateNet {
		privateNetwork(t, filepath.Join(c.bundle, "config.json"))
	}
	t.Cleanup(func() { _, _ = runErr(30*time.Second, nil, c.runc, "--root", c.root, "delete", "-f", c.id) })
	return c
}
