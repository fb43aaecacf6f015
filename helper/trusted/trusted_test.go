package trusted

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of root and of others are made")
	}
}

func exe(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// root's file under root's directories (/tmp, sticky, among them) is
// trusted, through a symlink too (the resolved path comes back); one of
// another uid, one others may write, or one in a directory others may
// write is not, and the error names the culprit.
func TestPath(t *testing.T) {
	needRoot(t)
	dir := t.TempDir() // below /tmp: 1777, sticky
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "criu")
	exe(t, good)
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{good, link} {
		real, err := Path(p)
		if err != nil || real != good {
			t.Errorf("Path(%s) = %q, %v; want %s", p, real, err, good)
		}
	}

	cases := map[string]func(p string) error{
		"another uid's file": func(p string) error { return os.Chown(p, 12345, 12345) },
		"group-writable":     func(p string) error { return os.Chmod(p, 0o775) },
		"world-writable":     func(p string) error { return os.Chmod(p, 0o757) },
	}
	for name, spoil := range cases {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		exe(t, p)
		if err := spoil(p); err != nil {
			t.Fatal(err)
		}
		var te *Error
		if _, err := Path(p); !errors.Is(err, ErrUntrusted) || !errors.As(err, &te) || te.Path != p {
			t.Errorf("%s: Path = %v, want ErrUntrusted naming %s", name, err, p)
		}
	}
	// A directory above that others may write, even a sticky one: the
	// file's own directory, and the file, must be root's alone.
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	exe(t, filepath.Join(open, "criu"))
	if err := os.Chown(open, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if _, err := Path(filepath.Join(open, "criu")); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), open+" ") {
		t.Errorf("a file in another uid's directory: %v", err)
	}
	if _, err := Path(filepath.Join(dir, "missing")); err == nil || errors.Is(err, ErrUntrusted) {
		t.Errorf("a missing file: %v", err)
	}
}

// LookPath passes over an untrusted criu on PATH to a trusted one, and says
// which it passed over; with none trusted it fails naming them.
func TestLookPath(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	users, roots := filepath.Join(base, "users"), filepath.Join(base, "roots")
	for _, d := range []string{users, roots} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		exe(t, filepath.Join(d, "gpucr-test-prog"))
	}
	if err := os.Chown(users, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	got, skipped, err := LookPath("gpucr-test-prog", "relative:"+users+":"+roots)
	if err != nil || got != filepath.Join(roots, "gpucr-test-prog") || len(skipped) != 1 {
		t.Fatalf("LookPath = %q, %v, %v", got, skipped, err)
	}
	if _, _, err := LookPath("gpucr-test-prog", users); err == nil || !strings.Contains(err.Error(), users) {
		t.Errorf("only an untrusted one: %v", err)
	}
}
