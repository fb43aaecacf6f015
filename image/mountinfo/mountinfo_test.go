package mountinfo

import (
	"os"
	"path/filepath"
	"testing"
)

func TestOf(t *testing.T) {
	m, err := Of("/")
	if err != nil || m.Point != "/" || m.FSType == "" {
		t.Fatalf("Of(/) = %+v, %v", m, err)
	}
	// /proc is a mount of its own, below /.
	if p, err := Of("/proc/self"); err != nil || p.Point != "/proc" || p.FSType != "proc" {
		t.Errorf("Of(/proc/self) = %+v, %v", p, err)
	}
	// A symlink is resolved to where it points.
	dir := t.TempDir()
	link := filepath.Join(dir, "proc")
	if err := os.Symlink("/proc", link); err != nil {
		t.Fatal(err)
	}
	if p, err := Of(link); err != nil || p.Point != "/proc" {
		t.Errorf("Of(a link to /proc) = %+v, %v", p, err)
	}
	if _, err := Of(filepath.Join(dir, "missing")); err == nil {
		t.Error("Of(a missing path) succeeded")
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`, `/bad\09`: `/bad\09`} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
	m := Mount{Options: []string{"rw", "size=4096k", "huge=always"}}
	if m.Option("huge") != "always" || m.Option("size") != "4096k" || m.Option("nr_inodes") != "" {
		t.Errorf("Option: %+v", m)
	}
}
