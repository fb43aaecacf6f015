package e2e

// Served mode's NVML (intercept/nvml): libnvidia-ml.so.1 of build/lib/served,
// NVML that is not available in a served process. PyTorch dlopens
// libnvidia-ml.so.1 and asserts that each function of its NVML table
// (c10/cuda/driver_api.h) is there before it calls any of them: the first
// allocation with expandable segments died on one the library lacked.

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testroot"
)

// torchNVMLNames is testdata/nvml-torch-driver-api.txt: PyTorch's NVML table.
func torchNVMLNames(t *testing.T) []string {
	t.Helper()
	names := readNames(t, filepath.Join(testroot.Dir(t), "tests", "e2e", "testdata", "nvml-torch-driver-api.txt"))
	if len(names) != 7 {
		t.Fatalf("testdata/nvml-torch-driver-api.txt lists %d functions, want PyTorch's 7", len(names))
	}
	return names
}

// TestServedNVMLExports: gpucr's libnvidia-ml.so.1 defines every function of
// PyTorch's NVML table, as functions a dlsym finds.
func TestServedNVMLExports(t *testing.T) {
	names := torchNVMLNames(t)
	lib := filepath.Join(buildDir(t), "lib", "served", "libnvidia-ml.so.1")
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatalf("served mode's NVML is not built (run `make`): %v", err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC && elf.ST_BIND(s.Info) == elf.STB_GLOBAL &&
			elf.ST_VISIBILITY(s.Other) == elf.STV_DEFAULT {
			defined[s.Name] = true
		}
	}
	for _, n := range names {
		if !defined[n] {
			t.Errorf("%s does not define %s", lib, n)
		}
	}
}

// TestServedNVMLNotAvailable: a program that loads NVML as PyTorch does
// (nvmlprobe: dlopen of libnvidia-ml.so.1, dlsym of each function of the
// table) under `gpucr run --served` gets served mode's, finds every function,
// and hears from each that NVML is not available: nvmlInit_v2 that the driver
// is not loaded, the others that NVML is not initialized, none writing to its
// arguments, and no driver file is open in it after.
func TestServedNVMLNotAvailable(t *testing.T) {
	names := torchNVMLNames(t)
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Fatalf("no C compiler: %v", err)
	}
	dir := t.TempDir()
	root := testroot.Dir(t)
	probe := filepath.Join(dir, "nvmlprobe")
	build := exec.Command(cc, "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-o", probe,
		filepath.Join(root, "tests", "e2e", "testdata", "nvmlprobe.c"), "-ldl")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building nvmlprobe: %v\n%s", err, out)
	}
	served, err := filepath.Abs(filepath.Join(buildDir(t), "lib", "served", "libnvidia-ml.so.1"))
	if err == nil {
		served, err = filepath.EvalSymlinks(served)
	}
	if err != nil {
		t.Fatalf("served mode's NVML is not built (run `make`): %v", err)
	}
	env := gpucrEnv(t)
	h := startHelper(t, dir, env, "--served-pool", "1")
	waitIdle(t, h, 1)
	text, err := runErr(time.Minute, env, binPath(t, "gpucr"), "run", "--served", "--socket", h.socket, "--",
		probe, filepath.Join(root, "tests", "e2e", "testdata", "nvml-torch-driver-api.txt"))
	if err != nil || !strings.Contains(text, "nvmlprobe: ok") {
		t.Fatalf("nvmlprobe under gpucr run --served: %v\n%s\nhelper:\n%s", err, text, tail(h.logText(), 20))
	}
	if !strings.Contains(text, "nvmlprobe: loaded "+served+"\n") {
		t.Errorf("nvmlprobe did not load served mode's NVML (%s):\n%s", served, text)
	}
	for _, n := range names {
		want := n + "=1 (Uninitialized)"
		if n == "nvmlInit_v2" {
			want = n + "=9 (Driver Not Loaded"
		}
		if !strings.Contains(text, want) {
			t.Errorf("nvmlprobe's call of %s: want %q in\n%s", n, want, text)
		}
	}
}
