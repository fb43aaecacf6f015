package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Under a loader launcher (ld-linux-x86-64.so.2 ... /x/libexec/gpucr), the
// real binary is argv[0]; symlinks to it are resolved; a binary run
// directly is itself.
func TestResolveExecutable(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "libexec", "gpucr")
	if err := os.MkdirAll(filepath.Dir(real), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(real, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "gpucr-link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	loader := filepath.Join(root, "lib", "ld-linux-x86-64.so.2")
	if err := os.MkdirAll(filepath.Dir(loader), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(loader, []byte("y"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ exe, arg0, want string }{
		{loader, real, real},
		{loader, link, real},
		{link, "gpucr", real},
		{real, "whatever", real},
		{loader, filepath.Join(root, "missing"), loader}, // argv[0] not a file: the loader it is
		{loader, loader, loader},
	} {
		got, err := resolveExecutable(tc.exe, tc.arg0)
		if err != nil || got != tc.want {
			t.Errorf("resolveExecutable(%s, %s) = %q, %v; want %q", tc.exe, tc.arg0, got, err, tc.want)
		}
	}
	for _, name := range []string{"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "ld.so", "ld-musl-x86_64.so.1", "ld-2.36.so"} {
		if !dynamicLoader.MatchString(name) {
			t.Errorf("%s is not taken for a dynamic loader", name)
		}
	}
	for _, name := range []string{"gpucr", "ld", "libld.so", "old-linux.so.2"} {
		if dynamicLoader.MatchString(name) {
			t.Errorf("%s is taken for a dynamic loader", name)
		}
	}
}

// --plugin-dir, then GPUCR_PLUGIN_DIR; a named directory without the plugin
// is an error; else beside the binary and CRIU's default, every place listed.
func TestFindPlugin(t *testing.T) {
	withPlugin := t.TempDir()
	if err := os.WriteFile(filepath.Join(withPlugin, pluginFile), []byte("so"), 0o755); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()

	t.Setenv("GPUCR_PLUGIN_DIR", empty)
	if s, err := findPlugin(withPlugin); err != nil || s.Dir != withPlugin {
		t.Errorf("--plugin-dir with the plugin: %+v, %v", s, err)
	}
	if _, err := findPlugin(""); err == nil || !strings.Contains(err.Error(), "GPUCR_PLUGIN_DIR "+empty) {
		t.Errorf("GPUCR_PLUGIN_DIR without the plugin: %v", err)
	}
	if _, err := findPlugin(empty); err == nil || !strings.Contains(err.Error(), "--plugin-dir "+empty) {
		t.Errorf("--plugin-dir without the plugin: %v", err)
	}
	t.Setenv("GPUCR_PLUGIN_DIR", withPlugin)
	if s, err := findPlugin(""); err != nil || s.Dir != withPlugin {
		t.Errorf("GPUCR_PLUGIN_DIR with the plugin: %+v, %v", s, err)
	}

	t.Setenv("GPUCR_PLUGIN_DIR", "")
	s, err := findPlugin("")
	if err != nil {
		t.Fatal(err)
	}
	if s.Dir != "" {
		t.Skipf("a plugin is installed here (%s)", s.Dir)
	}
	exe, _ := realExecutable()
	want := []string{filepath.Join(filepath.Dir(filepath.Dir(exe)), "lib", "criu", pluginFile),
		filepath.Join(filepath.Dir(filepath.Dir(exe)), "lib", pluginFile), filepath.Join(criuDefaultPluginDir, pluginFile)}
	if !slices.Equal(s.Tried, want) {
		t.Errorf("searched %q, want %q", s.Tried, want)
	}
	for _, p := range want {
		if !strings.Contains(s.notFound(), p) {
			t.Errorf("the error %q does not name %s", s.notFound(), p)
		}
	}
}
