package cli

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/trusted"
)

// criuSession is a private temporary directory (0700) for one CRIU run:
// CRIU's work directory (its log goes there) and HOME, the CRIU
// configuration file that names the plugin directory (CRIU's RPC has no
// option for it), and the file the plugin appends its messages to
// (GPUCR_PLUGIN_LOG: `criu swrk` runs with its stderr discarded). Everything
// is created exclusively there, never in the image directory, where a
// symlink or a FIFO planted under the same name would be followed or opened.
// Run as root, the directory is made under a temporary directory that root
// alone can change (privateTempDir).
type criuSession struct {
	dir       string
	config    string // "" without a plugin directory
	pluginLog string
}

// pluginLogEnv names the plugin's message file (criuplugin/README.md).
const pluginLogEnv = "GPUCR_PLUGIN_LOG"

// privateTempDir is where private directories are made: $TMPDIR (os.TempDir),
// but as root only if root alone can change it, else /tmp. A user's TMPDIR
// kept by `sudo -E` is the user's directory: they could rename root's private
// directory away and put their own (with a CRIU configuration of theirs) in
// its place.
func privateTempDir() (string, error) {
	t := os.TempDir()
	if os.Geteuid() != 0 {
		return t, nil
	}
	if real, err := trusted.TempDir(t); err == nil {
		return real, nil
	}
	real, err := trusted.TempDir("/tmp")
	if err != nil {
		return "", fmt.Errorf("no temporary directory that only root can change: %w", err)
	}
	return real, nil
}

func newCRIUSession(pluginDir string) (*criuSession, error) {
	base, err := privateTempDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(base, "gpucr-criu-")
	if err != nil {
		return nil, fmt.Errorf("private directory for CRIU: %w", err)
	}
	s := &criuSession{dir: dir, pluginLog: filepath.Join(dir, "plugin.log")}
	if err := createExcl(s.pluginLog, ""); err != nil {
		s.close()
		return nil, err
	}
	if pluginDir != "" {
		abs, err := filepath.Abs(pluginDir)
		if err != nil {
			s.close()
			return nil, err
		}
		if strings.ContainsAny(abs, " \t\n\"'\\") {
			s.close()
			return nil, fmt.Errorf("plugin directory %q: CRIU's configuration file cannot name a path with blanks, quotes or backslashes", abs)
		}
		s.config = filepath.Join(dir, "criu.conf")
		if err := createExcl(s.config, "libdir "+abs+"\n"); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

// createExcl creates path, which must not exist, with content (mode 0600).
func createExcl(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(content)
	return errors.Join(werr, f.Close())
}

// pluginLines are the plugin's messages so far, debug lines left out.
func (s *criuSession) pluginLines() []string {
	f, err := os.Open(s.pluginLog)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "gpucr_plugin: debug: ") {
			continue
		}
		out = append(out, l)
	}
	return out
}

func (s *criuSession) close() { _ = os.RemoveAll(s.dir) }

// workDir opens the private directory, for CRIU's work_dir_fd.
func (s *criuSession) workDir() (*os.File, error) {
	return os.OpenFile(s.dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
}

// criuEnv is the whole environment of a `criu swrk` of this session: nothing
// else of this process's environment reaches CRIU and the plugin. PATH (for
// what CRIU runs itself) is a system one for root; HOME is the private
// directory, which holds no .criu/. extra are more NAME=VALUE settings for
// the plugin; GPUCR_LOG and GPUCR_PLUGIN_TIMEOUT_S, which only tune what the
// plugin says and how long it waits, pass through.
func (s *criuSession) criuEnv(socket string, extra ...string) []string {
	path := os.Getenv("PATH")
	if os.Geteuid() == 0 || path == "" {
		path = strings.Join(trusted.SystemPath, ":")
	}
	env := []string{"PATH=" + path, "HOME=" + s.dir, "GPUCR_SOCKET=" + socket, pluginLogEnv + "=" + s.pluginLog}
	for _, k := range []string{"GPUCR_LOG", "GPUCR_PLUGIN_TIMEOUT_S"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return append(env, extra...)
}
