package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/trusted"
)

// Where `gpucr checkpoint` and `gpucr restore` find gpucr's CRIU plugin.

// pluginFile is the plugin's file name in its directory.
const pluginFile = "gpucr_plugin.so"

// criuDefaultPluginDir is where CRIU loads plugins from without a libdir
// (criu --help: "by default /usr/lib/criu/"); `make install` puts the plugin
// there.
const criuDefaultPluginDir = "/usr/lib/criu"

// pluginDirFlag: where CRIU finds gpucr_plugin.so.
func pluginDirFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "plugin-dir", Usage: "directory with " + pluginFile +
		" for CRIU (default: $GPUCR_PLUGIN_DIR, else next to gpucr (../lib/criu, ../lib), else " + criuDefaultPluginDir + ")"}
}

// pluginSearch is the outcome of a search for the plugin: the directory it
// is in ("" if none), and every place looked at, in order.
type pluginSearch struct {
	Dir   string
	Tried []string
}

// findPlugin looks for the plugin: the --plugin-dir flag, $GPUCR_PLUGIN_DIR,
// beside the real gpucr binary (../lib/criu, ../lib), CRIU's default plugin
// directory. A directory named by the flag or the variable must hold it: a
// wrong setting is an error, not a reason to take another plugin.
func findPlugin(flagDir string) (pluginSearch, error) {
	var s pluginSearch
	for _, named := range []struct{ what, dir string }{{"--plugin-dir", flagDir}, {"GPUCR_PLUGIN_DIR", os.Getenv("GPUCR_PLUGIN_DIR")}} {
		if named.dir == "" {
			continue
		}
		abs, err := filepath.Abs(named.dir)
		if err != nil {
			return s, fmt.Errorf("%s %s: %w", named.what, named.dir, err)
		}
		p := filepath.Join(abs, pluginFile)
		s.Tried = append(s.Tried, p)
		if !isFile(p) {
			return s, fmt.Errorf("%s %s: no %s there", named.what, named.dir, pluginFile)
		}
		// As root, a directory the environment names (kept from a user by
		// `sudo -E`) is loaded into CRIU only if root alone can change it
		// and its plugin; --plugin-dir is root's own choice.
		if named.what == "GPUCR_PLUGIN_DIR" && os.Geteuid() == 0 {
			real, err := trusted.Path(p)
			if err != nil {
				return s, fmt.Errorf("GPUCR_PLUGIN_DIR=%s: %w (as root, gpucr loads a plugin named by the environment only where root alone can change it; name the directory with --plugin-dir)",
					named.dir, err)
			}
			abs = filepath.Dir(real)
		}
		s.Dir = abs
		return s, nil
	}
	var dirs []string
	if exe, err := realExecutable(); err == nil {
		bin := filepath.Dir(exe)
		dirs = append(dirs, filepath.Join(bin, "..", "lib", "criu"), filepath.Join(bin, "..", "lib"))
	}
	dirs = append(dirs, criuDefaultPluginDir)
	for _, d := range dirs {
		d = filepath.Clean(d)
		p := filepath.Join(d, pluginFile)
		s.Tried = append(s.Tried, p)
		if isFile(p) {
			s.Dir = d
			return s, nil
		}
	}
	return s, nil
}

// notFound says where the plugin was looked for.
func (s pluginSearch) notFound() string {
	return fmt.Sprintf("gpucr's CRIU plugin was not found (looked for %s); build it with make, install it with make install, or name its directory with --plugin-dir or GPUCR_PLUGIN_DIR",
		strings.Join(s.Tried, ", "))
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// realExecutable is the gpucr binary this process runs, symlinks resolved.
// Run as `ld-linux-x86-64.so.2 --library-path ... /path/libexec/gpucr` (the
// launcher of scripts/make-gpucr-bundle.sh), the kernel's executable
// (os.Executable) is the dynamic loader; the program is then argv[0], which
// the loader sets to the path it ran.
func realExecutable() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return resolveExecutable(exe, os.Args[0])
}

// dynamicLoader matches the file names of glibc's and musl's dynamic loaders
// (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ld.so, ld-musl-x86_64.so.1).
var dynamicLoader = regexp.MustCompile(`^ld(-linux[^/]*|-musl[^/]*|)\.so(\.[0-9]+)*$|^ld-[^/]*\.so(\.[0-9]+)*$`)

// resolveExecutable is realExecutable's logic, for the kernel's executable
// exe and argv[0].
func resolveExecutable(exe, arg0 string) (string, error) {
	if dynamicLoader.MatchString(filepath.Base(exe)) && arg0 != "" {
		p := arg0
		if !strings.Contains(p, "/") {
			if lp, err := exec.LookPath(p); err == nil {
				p = lp
			}
		}
		if abs, err := filepath.Abs(p); err == nil && isFile(abs) && !sameFile(abs, exe) {
			exe = abs
		}
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	return exe, nil
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}
