package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/helper/proc"
)

// A dump's record goes into the stage 0600 and comes back as written; what
// is not a regular file of the caller's is not read (a symlink is not
// followed, a FIFO not waited on), and a missing one is no error.
func TestDumpRecord(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rec := dumpRecordOf(CRIU{ShellJob: true, TCPEstablished: true, Extra: []string{"network-lock skip"}})
	if err := writeDumpRecord(d, rec); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, dumpRecordName)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record: %v %v", fi, err)
	}
	got, why, err := readDumpRecord(dir)
	if err != nil || why != "" || got == nil || !got.ShellJob || !got.TCPEstablished || !slices.Equal(got.CRIUOpts, rec.CRIUOpts) {
		t.Fatalf("read back: %+v %q %v", got, why, err)
	}
	c := CRIU{TCPClose: true, Extra: []string{"network-lock skip"}}
	if applied := got.applyTo(&c); !slices.Equal(applied, []string{"--shell-job"}) || !c.ShellJob || c.TCPEstablished {
		t.Errorf("applied %q to %+v: want --shell-job alone (--tcp-close restores connections closed)", applied, c)
	}
	if n := got.notes(c); len(n) != 0 {
		t.Errorf("notes %q for a restore given the same --criu-opt", n)
	}
	if err := writeDumpRecord(d, rec); err == nil {
		t.Error("a second record replaced the first (it is made O_EXCL in a fresh stage)")
	}

	for name, make := range map[string]func() error{
		"is a symlink":          func() error { return os.Symlink("/etc/passwd", path) },
		"is not a regular file": func() error { return syscall.Mkfifo(path, 0o600) },
		"belongs to uid 65534": func() error {
			return errors.Join(os.WriteFile(path, []byte(`{"format":1}`), 0o600), os.Chown(path, 65534, 65534))
		},
		"does not parse":         func() error { return os.WriteFile(path, []byte("{"), 0o600) },
		"which this gpucr does ": func() error { return os.WriteFile(path, []byte(`{"format":9}`), 0o600) },
	} {
		_ = os.Remove(path)
		if err := make(); err != nil {
			if strings.Contains(name, "uid") && os.Geteuid() != 0 {
				continue // only root gives a file away
			}
			t.Fatal(err)
		}
		got, why, err := readDumpRecord(dir)
		if got != nil || err != nil || !strings.Contains(why, name) {
			t.Errorf("%s: %+v %q %v", name, got, why, err)
		}
	}
	_ = os.Remove(path)
	if got, why, err := readDumpRecord(dir); got != nil || why != "" || err != nil {
		t.Errorf("no record: %+v %q %v", got, why, err)
	}
}

// A restore's "Can't fork for N" where N is no process of the image (the
// shell's session of a process dumped with --shell-job) says to restore
// with --shell-job, not that a process holds N.
func TestRestoreForkHints(t *testing.T) {
	msgs := []string{"pid 6909: Can't fork for 6906: File exists"}
	generic := criuHintsFor(msgs, false)
	if len(generic) != 1 || !strings.Contains(generic[0], "taken by another process") {
		t.Fatalf("hints %q", generic)
	}
	h := restoreForkHints(generic, msgs, []proc.Pid{6909, 6910}, false)
	if len(h) != 1 || !strings.Contains(h[0], "pid 6906 is no process of the image") || !strings.Contains(h[0], "restore it with --shell-job too") {
		t.Errorf("for a pid not in the image: %q", h)
	}
	for _, tc := range []struct {
		pids     []proc.Pid
		shellJob bool
	}{{[]proc.Pid{6906, 6909}, false}, {[]proc.Pid{6909}, true}} {
		if h := restoreForkHints(generic, msgs, tc.pids, tc.shellJob); !slices.Equal(h, generic) {
			t.Errorf("image pids %v, --shell-job %v: %q, want the hint unchanged", tc.pids, tc.shellJob, h)
		}
	}
}
