package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// gpucr run exits as a shell does when it cannot start the program: 127
// for one that is not there, 126 for one that cannot be run (it exited 1).
func TestRunExitCodes(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libgpucr.so")
	noexec := filepath.Join(dir, "noexec")
	for _, f := range []string{lib, noexec} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("GPUCR_INTERPOSER", lib)
	for _, tc := range []struct {
		prog string
		code int
		want string
	}{
		{"gpucr-no-such-program", ExitNotFound, "command not found"},
		{filepath.Join(dir, "missing"), ExitNotFound, "no such file"},
		{noexec, ExitCannotRun, "cannot run it"},
		{dir, ExitCannotRun, "cannot run it"},
	} {
		code, _, errOut := runCLI(t, "run", "--", tc.prog)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("gpucr run -- %s: exit %d, %q; want %d and %q", tc.prog, code, errOut, tc.code, tc.want)
		}
	}
	// The exec itself: a program found whose interpreter is missing is
	// "not found" too, one the kernel will not run is 126.
	for err, code := range map[error]int{syscall.ENOENT: ExitNotFound, syscall.EACCES: ExitCannotRun, syscall.ENOEXEC: ExitCannotRun} {
		var xe exitError
		if e := execFailed("/x", err); !errors.As(e, &xe) || xe.code != code {
			t.Errorf("exec failing with %v: %v, want exit %d", err, e, code)
		}
	}
}

// TestPreloadAfterFirst: served mode's runtime goes right after the
// interposer in LD_PRELOAD, once, whatever the user preloaded.
func TestPreloadAfterFirst(t *testing.T) {
	for _, c := range []struct{ list, lib, want string }{
		{"/g/libgpucr.so", "/s/libcudart.so.13", "/g/libgpucr.so:/s/libcudart.so.13"},
		{"/g/libgpucr.so:/u/a.so", "/s/libcudart.so.13", "/g/libgpucr.so:/s/libcudart.so.13:/u/a.so"},
		{"/g/libgpucr.so:/s/libcudart.so.13:/u/a.so", "/s/libcudart.so.13", "/g/libgpucr.so:/s/libcudart.so.13:/u/a.so"},
		{"/g/libgpucr.so:/u/a.so", "", "/g/libgpucr.so:/u/a.so"},
	} {
		if got := preloadAfterFirst(c.list, c.lib); got != c.want {
			t.Errorf("preloadAfterFirst(%q, %q) = %q, want %q", c.list, c.lib, got, c.want)
		}
	}
	// The runtime, cuBLAS and cuBLASLt, in that order, each once.
	for _, c := range []struct {
		list string
		libs []string
		want string
	}{
		{"/g/libgpucr.so", []string{"/s/rt", "/s/blas", "/s/lt"}, "/g/libgpucr.so:/s/rt:/s/blas:/s/lt"},
		{"/g/libgpucr.so:/s/blas:/u/a.so", []string{"/s/rt", "/s/blas", "/s/lt"}, "/g/libgpucr.so:/s/rt:/s/blas:/s/lt:/u/a.so"},
	} {
		if got := preloadAfterFirst(c.list, c.libs...); got != c.want {
			t.Errorf("preloadAfterFirst(%q, %q) = %q, want %q", c.list, c.libs, got, c.want)
		}
	}
}
