package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/daemon"
	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

func TestParseCRIUVersion(t *testing.T) {
	for out, want := range map[string][3]int{
		"Version: 4.2.1\n":                 {4, 2, 1},
		"Version: 4.2\nGitID: v4.2-3-gabc": {4, 2, 0},
		"Version: 3.17.1\n":                {3, 17, 1},
	} {
		if v, ok := parseCRIUVersion(out); !ok || v != want {
			t.Errorf("parseCRIUVersion(%q) = %v, %v; want %v", out, v, ok, want)
		}
	}
	if _, ok := parseCRIUVersion("criu: unknown option"); ok {
		t.Error("a version read from nothing")
	}
	if !versionLess([3]int{4, 1, 1}, minCRIU) || versionLess([3]int{4, 2, 0}, minCRIU) || versionLess([3]int{5, 0, 0}, minCRIU) {
		t.Error("versionLess")
	}
}

// item returns the report's item name, failing the test without one.
func item(t *testing.T, r checkReport, name string) checkItem {
	t.Helper()
	for _, it := range r.Items {
		if it.Name == name {
			return it
		}
	}
	t.Fatalf("no %q item in %+v", name, r.Items)
	return checkItem{}
}

// fakeCRIU writes an executable script standing in for criu.
func fakeCRIU(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkEnv keeps the variables a check sets (for CRIU's plugin) within the test.
func checkEnv(t *testing.T) {
	t.Setenv("GPUCR_SOCKET", "")
	t.Setenv("GPUCR_PLUGIN_LOG", "")
}

// An old CRIU fails the check, saying why, and is not tried.
func TestCheckOldCRIU(t *testing.T) {
	checkEnv(t)
	t.Setenv("GPUCR_CRIU", fakeCRIU(t, `echo "Version: 4.1.1"`))
	code, out, _ := runCLI(t, "check", "--json", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	var r checkReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != ExitFailure || r.OK {
		t.Fatalf("check with CRIU 4.1.1: exit %d, %v, %s", code, err, out)
	}
	if it := item(t, r, "criu"); it.Status != checkFail || !strings.Contains(it.Reason, "4.1.1") || !strings.Contains(it.Reason, "too old") {
		t.Errorf("criu item: %+v", it)
	}
	if it := item(t, r, "criu self-test"); it.Status != checkFail || !strings.Contains(it.Reason, "not run") {
		t.Errorf("self-test item: %+v", it)
	}
	// No helper at that socket either: said in the items, and in text the
	// error names what failed.
	if it := item(t, r, "helper"); it.Status != checkFail || !strings.Contains(it.Reason, "none.sock") {
		t.Errorf("helper item: %+v", it)
	}
	code, out, errOut := runCLI(t, "check", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if code != ExitFailure || !strings.Contains(out, "too old") ||
		!strings.Contains(errOut, "this host cannot checkpoint GPU processes: criu, criu self-test, ") ||
		!strings.Contains(errOut, "helper, driver failed") {
		t.Errorf("check in text: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}

// A CRIU that hangs is given up on at the time limit: in --version, and in
// the dump of the self-test.
func TestCheckHangingCRIU(t *testing.T) {
	checkEnv(t)
	r := runCheck(checkOptions{criu: fakeCRIU(t, "exec sleep 60"), timeout: 500 * time.Millisecond,
		socket: filepath.Join(t.TempDir(), "none.sock")})
	if it := item(t, r, "criu"); r.OK || it.Status != checkFail || !strings.Contains(it.Reason, "did not answer within 500ms") {
		t.Errorf("criu item of a hanging criu: %+v", it)
	}
	r = runCheck(checkOptions{criu: fakeCRIU(t, `case "$*" in *--version*) echo "Version: 4.2.1"; exit 0;; esac; exec sleep 60`),
		timeout: 500 * time.Millisecond, socket: filepath.Join(t.TempDir(), "none.sock")})
	if it := item(t, r, "criu"); it.Status != checkOK {
		t.Errorf("criu item: %+v", it)
	}
	if it := item(t, r, "criu self-test"); r.OK || it.Status != checkFail || !strings.Contains(it.Reason, "criu dump did not finish within 500ms") {
		t.Errorf("self-test item of a criu that hangs in its dump: %+v", it)
	}
}

// No helper: helper and driver fail, naming the socket.
func TestCheckNoHelper(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	var r checkReport
	if st := checkHelper(&r, sock); st != nil {
		t.Fatal("a Status without a helper")
	}
	if it := item(t, r, "helper"); it.Status != checkFail || !strings.Contains(it.Reason, sock) || !strings.Contains(it.Reason, "gpucr helper") {
		t.Errorf("helper item: %+v", it)
	}
	if it := item(t, r, "driver"); it.Status != checkFail {
		t.Errorf("driver item: %+v", it)
	}
}

// startHelperWith runs a helper on a fake GPU with cfg's driver and
// availability.
func startHelperWith(t *testing.T, driver *helperpb.DriverInfo, unavailable string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "helper.sock")
	cfg := daemon.Config{Socket: sock, Version: "t", Log: zap.NewNop(), Driver: driver, Unavailable: unavailable}
	if unavailable == "" {
		cfg.Devices = []daemon.Device{fakegpu.New(0, 1<<30)}
	}
	s := daemon.New(cfg)
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

// The driver is judged as the helper reports it.
func TestCheckHelperDriver(t *testing.T) {
	good := &helperpb.DriverInfo{Library: "libcuda.so.1", Path: "/usr/lib/libcuda.so.1", Version: 13000, CheckpointApi: true}
	old := &helperpb.DriverInfo{Library: "libcuda.so.1", Path: "/usr/lib/libcuda.so.1", Version: 12020,
		CheckpointApiMissing: []string{"cuCheckpointProcessLock"}}
	for _, tc := range []struct {
		name        string
		driver      *helperpb.DriverInfo
		unavailable string
		status      string
		want        string
	}{
		{"good", good, "", checkOK, "CUDA 13.0, checkpoint API present, 1 GPU(s)"},
		{"no checkpoint API", old, "", checkFail, "lacks the driver checkpoint API (cuCheckpointProcessLock)"},
		{"unopened", &helperpb.DriverInfo{Library: "libcuda.so.1", Error: "dlopen libcuda.so.1: not found"}, "driver libcuda.so.1: missing",
			checkFail, "cannot open its driver: dlopen libcuda.so.1"},
		{"no devices", good, "no GPU devices", checkFail, "the helper has no GPU: no GPU devices"},
		{"older helper", nil, "", checkWarn, "does not tell its driver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r checkReport
			if st := checkHelper(&r, startHelperWith(t, tc.driver, tc.unavailable)); st == nil {
				t.Fatal("no Status")
			}
			if it := item(t, r, "helper"); it.Status != checkOK {
				t.Errorf("helper item: %+v", it)
			}
			if it := item(t, r, "driver"); it.Status != tc.status || !strings.Contains(it.Reason, tc.want) {
				t.Errorf("driver item %+v, want %s with %q", it, tc.status, tc.want)
			}
		})
	}
}

func TestCheckInterposer(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libgpucr.so")
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GPUCR_INTERPOSER", lib)
	var r checkReport
	checkInterposer(&r)
	if it := item(t, r, "interposer"); it.Status != checkOK || !strings.Contains(it.Reason, lib) {
		t.Errorf("interposer item: %+v", it)
	}
	t.Setenv("GPUCR_INTERPOSER", lib+".missing")
	r = checkReport{}
	checkInterposer(&r)
	if it := item(t, r, "interposer"); it.Status != checkFail || !strings.Contains(it.Reason, lib+".missing") {
		t.Errorf("interposer item: %+v", it)
	}
}

// The image directory: a directory yet to be made is judged by its parent;
// the mount it is on is found.
func TestCheckImagesDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not", "yet")
	var r checkReport
	checkImagesDir(&r, dir, nil)
	it := item(t, r, "image dir")
	if it.Status == checkFail || !strings.Contains(it.Reason, "not there yet") || it.Info["fs_type"] == "" {
		t.Errorf("image dir item: %+v", it)
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r = checkReport{}
	checkImagesDir(&r, filepath.Join(file, "sub"), nil)
	if it := item(t, r, "image dir"); it.Status != checkFail || !strings.Contains(it.Reason, "not a directory") {
		t.Errorf("image dir under a file: %+v", it)
	}
}

// After a killed dump, each GPU process is told as the helper sees it.
// A device on which the helper could not load gpucr's GPU kernels fails the
// driver item, naming the device and the driver's answer.
func TestCheckKernelsNotLoaded(t *testing.T) {
	st := &helperpb.StatusReply{
		Driver:  &helperpb.DriverInfo{Library: "libcuda.so.1", Version: 13000, CheckpointApi: true},
		Devices: []*helperpb.DeviceInfo{{Uuid: "GPU-1", Ordinal: 0}, {Uuid: "GPU-2", Ordinal: 1, KernelsError: "cuModuleLoadData(gpucr kernels): CUDA_ERROR_INVALID_PTX (218)"}},
	}
	name, status, reason, info := driverItem(st)
	if name != "driver" || status != checkFail || !strings.Contains(reason, "GPU 1 (GPU-2)") ||
		!strings.Contains(reason, "CUDA_ERROR_INVALID_PTX") || info["kernels_error"] == nil {
		t.Fatalf("driver item %s %s %q %v", name, status, reason, info)
	}
	st.Devices[1].KernelsError = ""
	if _, status, reason, _ := driverItem(st); status != checkOK {
		t.Fatalf("with the kernels loaded: %s %q", status, reason)
	}
}

// CRIU's optional kernel features are reported, each ok or a warning with
// CRIU's own reason, and never fail the check.
func TestCheckCRIUFeatures(t *testing.T) {
	criu := fakeCRIU(t, `case "$*" in
*mem_dirty_track*) echo "Warn  (criu/cr-check.c:824): Dirty tracking is OFF. Memory snapshot will not work." >&2; exit 1 ;;
*uffd-noncoop*) echo "uffd-noncoop is supported"; exit 0 ;;
esac
exit 2`)
	var r checkReport
	checkCRIUFeatures(&r, criu, 5*time.Second)
	if it := item(t, r, "criu memory tracking"); it.Status != checkWarn || !strings.Contains(it.Reason, "Dirty tracking is OFF") ||
		strings.Contains(it.Reason, "cr-check.c") {
		t.Errorf("memory tracking: %+v", it)
	}
	if it := item(t, r, "criu lazy pages"); it.Status != checkOK || !strings.Contains(it.Reason, "lazy-pages") {
		t.Errorf("lazy pages: %+v", it)
	}
	// With lazy pages allowed: what a fault served through userfaultfd
	// costs here, against the limit for GPU processes.
	it := item(t, r, "lazy pages for GPU processes")
	if !strings.Contains(it.Reason, "userfaultfd") {
		t.Errorf("lazy pages for GPU processes: %+v", it)
	}
	t.Setenv("GPUCR_LAZY_FAULT_LIMIT_US", "0.001")
	var slow checkReport
	checkLazyFaults(&slow)
	if it := item(t, slow, "lazy pages for GPU processes"); it.Status != checkWarn || !strings.Contains(it.Reason, "is refused") {
		t.Errorf("lazy pages for GPU processes over the limit: %+v", it)
	}
}
