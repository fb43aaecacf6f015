package cli

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The CRIU configuration and the plugin's log are made in a new private
// directory, not in the image directory.
func TestCRIUSession(t *testing.T) {
	plugins := t.TempDir()
	s, err := newCRIUSession(plugins)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(s.dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("private directory %s: %v, %v", s.dir, fi.Mode(), err)
	}
	b, err := os.ReadFile(s.config)
	if err != nil || string(b) != "libdir "+plugins+"\n" || filepath.Dir(s.config) != s.dir {
		t.Fatalf("config %s: %q, %v", s.config, b, err)
	}
	if fi, err := os.Stat(s.config); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config mode: %v, %v", fi.Mode(), err)
	}
	if filepath.Dir(s.pluginLog) != s.dir {
		t.Fatalf("plugin log %s outside %s", s.pluginLog, s.dir)
	}
	if err := os.WriteFile(s.pluginLog, []byte("gpucr_plugin: debug: chatter\ngpucr_plugin: it failed\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := s.pluginLines(); !slices.Equal(got, []string{"gpucr_plugin: it failed"}) {
		t.Errorf("pluginLines = %q", got)
	}
	s.close()
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after close: %v", s.dir, err)
	}

	// Without a plugin directory, no configuration.
	s, err = newCRIUSession("")
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if s.config != "" {
		t.Errorf("a configuration without a plugin directory: %s", s.config)
	}
	// CRIU's configuration format has no quoting.
	if s, err := newCRIUSession(filepath.Join(plugins, "a b")); err == nil {
		s.close()
		t.Error("a plugin directory with a blank was written into CRIU's configuration")
	}
}

func TestCreateExclRefusesExisting(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := createExcl(link, "libdir /x\n"); err == nil {
		t.Fatal("createExcl wrote through a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("target changed: %q", b)
	}
}
