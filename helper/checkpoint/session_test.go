package checkpoint

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The CRIU configuration and the plugin's log are made in a new private
// directory, not in the image directory.
func TestCRIUSession(t *testing.T) {
	plugins := t.TempDir()
	s, err := newSession(t.TempDir(), plugins, nil)
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
	s, err = newSession(t.TempDir(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if s.config != "" {
		t.Errorf("a configuration without a plugin directory: %s", s.config)
	}
	// CRIU options passed through are lines of the configuration, without
	// their dashes.
	s2, err := newSession(t.TempDir(), plugins, []string{"--tcp-established", "external mnt[]:m"})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.close()
	if b, err := os.ReadFile(s2.config); err != nil || string(b) != "libdir "+plugins+"\ntcp-established\nexternal mnt[]:m\n" {
		t.Errorf("config with options: %q, %v", b, err)
	}
	// CRIU's configuration format has no quoting.
	if s, err := newSession(t.TempDir(), filepath.Join(plugins, "a b"), nil); err == nil {
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

// Options gpucr sets itself, and malformed ones, are refused before
// anything runs.
func TestCRIUOptionsCheck(t *testing.T) {
	base := CRIU{Binary: "/usr/sbin/criu"}
	for _, bad := range []CRIU{
		{Binary: ""},
		{Binary: "criu", Extra: []string{"images-dir /tmp"}},
		{Binary: "criu", Extra: []string{"--log-file x"}},
		{Binary: "criu", Extra: []string{"tcp-established\nlibdir /evil"}},
		{Binary: "criu", Extra: []string{"  "}},
		{Binary: "criu", ManageCgroups: "sometimes"},
		{Binary: "criu", LogLevel: 7},
		{Binary: "criu", Timeout: -time.Second},
	} {
		if err := bad.check(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	good := base
	good.Extra = []string{"--tcp-established", "ghost-limit 10M"}
	good.ManageCgroups = "soft"
	if err := good.check(); err != nil {
		t.Errorf("%+v refused: %v", good, err)
	}
}

// A new session removes the directories of sessions whose gpucr is gone
// (of this pid namespace and this user), and nothing else: a live
// session's, a gone one's of another pid namespace, a symlink or a file
// under such a name, a directory of another mode or of another user.
func TestRemoveDeadSessions(t *testing.T) {
	base := t.TempDir()
	self := sessionOwner()
	if self == "" {
		t.Skip("this process's pid namespace or start time cannot be read")
	}
	ns, _, _ := strings.Cut(self, "-")
	dead := sessionPrefix + ns + "-999999999-1-123"
	kept := map[string]bool{
		sessionPrefix + self + "456":                 true, // this process: runs
		sessionPrefix + "4026531999-999999999-1-789": true, // another pid namespace
		sessionPrefix + ns + "-999999999-1-link":     true, // a symlink
		sessionPrefix + ns + "-999999999-1-file":     true, // a file
		sessionPrefix + ns + "-999999999-1-open":     true, // 0755
		sessionPrefix + ns + "-999999999-1-theirs":   true, // another user's
		"gpucr-check-" + ns + "-999999999-1-x":       true, // not a session's
		"target-stays":                               true, // the symlink's target
	}
	for name := range kept {
		p := filepath.Join(base, name)
		switch {
		case strings.HasSuffix(name, "-link"):
			if err := os.Symlink(filepath.Join(base, "target-stays"), p); err != nil {
				t.Fatal(err)
			}
		case strings.HasSuffix(name, "-file"):
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		case strings.HasSuffix(name, "-open"):
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}
	}
	theirs := filepath.Join(base, sessionPrefix+ns+"-999999999-1-theirs")
	if os.Geteuid() == 0 {
		if err := os.Chown(theirs, 61002, 61002); err != nil {
			t.Fatal(err)
		}
	} else {
		delete(kept, sessionPrefix+ns+"-999999999-1-theirs")
		_ = os.Remove(theirs)
	}
	if err := os.MkdirAll(filepath.Join(base, dead, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, dead, "sub", "dump.log"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	removeDeadSessions(base, self)
	if _, err := os.Lstat(filepath.Join(base, dead)); !os.IsNotExist(err) {
		t.Errorf("a dead session's directory is still there: %v", err)
	}
	for name := range kept {
		if _, err := os.Lstat(filepath.Join(base, name)); err != nil {
			t.Errorf("%s was removed: %v", name, err)
		}
	}
}
