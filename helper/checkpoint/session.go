package checkpoint

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
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
// alone can change (Environment.TempDir).
type criuSession struct {
	dir       string
	config    string // "" without a plugin directory
	pluginLog string
	// stderr is CRIU's stderr: CRIU says there what it cannot parse in
	// its configuration file (an unknown --criu-opt), before it has a log.
	stderr string
}

// pluginLogEnv names the plugin's message file (criuplugin/README.md).
const pluginLogEnv = "GPUCR_PLUGIN_LOG"

// sessionPrefix starts the name of a session's private directory. The name
// goes on with its maker's identity (sessionOwner), so that the directory
// of a session whose gpucr was killed (SIGKILL runs no cleanup) is known
// for what it is and removed by the next session.
const sessionPrefix = "gpucr-criu-"

// sessionOwner names this process in a session directory's name: its pid
// namespace, pid and start time, "NS-PID-START-" ("" if it cannot be read:
// such a directory is then never taken for a dead one's).
func sessionOwner() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	ns = strings.TrimSuffix(strings.TrimPrefix(ns, "pid:["), "]")
	pid := proc.Pid(os.Getpid())
	st, err := proc.ReadStat(pid)
	if err != nil || ns == "" {
		return ""
	}
	return fmt.Sprintf("%s-%d-%d-", ns, pid, st.Start)
}

// removeDeadSessions removes, under tempDir, the private directories of
// sessions whose gpucr no longer runs: those of this pid namespace (a pid
// of another means nothing here) and of this user, named by a process
// that is gone. It acts beneath tempDir's descriptor and follows no link
// (os.Root); a directory another user made under such a name is left alone.
func removeDeadSessions(tempDir, self string) {
	ns, _, _ := strings.Cut(self, "-")
	if ns == "" {
		return
	}
	root, err := os.OpenRoot(tempDir)
	if err != nil {
		return
	}
	defer root.Close()
	d, err := root.Open(".")
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, sessionPrefix+ns+"-")
		if !ok {
			continue
		}
		var pid proc.Pid
		var start uint64
		if n, _ := fmt.Sscanf(strings.ReplaceAll(rest, "-", " "), "%d %d", &pid, &start); n != 2 || proc.RunsOn(pid, start) {
			continue
		}
		fi, err := root.Lstat(name)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
			continue
		}
		_ = root.RemoveAll(name)
	}
}

// newSession makes the session's private directory under tempDir (/tmp
// if empty) and, with a plugin directory or extra CRIU options, its CRIU
// configuration: "libdir DIR" and one line per extra option. It removes
// what sessions of killed gpucr processes left there first.
func newSession(tempDir, pluginDir string, extra []string) (*criuSession, error) {
	if tempDir == "" {
		tempDir = "/tmp"
	}
	self := sessionOwner()
	removeDeadSessions(tempDir, self)
	dir, err := os.MkdirTemp(tempDir, sessionPrefix+self)
	if err != nil {
		return nil, fmt.Errorf("private directory for CRIU: %w", err)
	}
	s := &criuSession{dir: dir, pluginLog: filepath.Join(dir, "plugin.log"), stderr: filepath.Join(dir, "criu.stderr")}
	for _, f := range []string{s.pluginLog, s.stderr} {
		if err := createExcl(f, ""); err != nil {
			s.close()
			return nil, err
		}
	}
	var conf strings.Builder
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
		conf.WriteString("libdir " + abs + "\n")
	}
	for _, l := range extra {
		// CRIU's configuration file takes options without their dashes.
		conf.WriteString(strings.TrimLeft(strings.TrimSpace(l), "-") + "\n")
	}
	if conf.Len() > 0 {
		s.config = filepath.Join(dir, "criu.conf")
		if err := createExcl(s.config, conf.String()); err != nil {
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

// openStderr opens the file CRIU's stderr goes to, for appending.
func (s *criuSession) openStderr() (*os.File, error) {
	f, err := os.OpenFile(s.stderr, os.O_WRONLY|os.O_APPEND|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("CRIU's stderr: %w", err)
	}
	return f, nil
}

// maxStderr bounds what of CRIU's stderr is read.
const maxStderr = 16 << 10

// stderrLines are the lines CRIU printed on its stderr (its first
// maxStderr bytes), blank ones left out.
func (s *criuSession) stderrLines() []string {
	f, err := os.Open(s.stderr)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(io.LimitReader(f, maxStderr))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// workDir opens the private directory, for CRIU's work_dir_fd.
func (s *criuSession) workDir() (*os.File, error) {
	return os.OpenFile(s.dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
}

// criuEnv is the whole environment of a `criu swrk` of this session: nothing
// else reaches CRIU and the plugin. PATH (for what CRIU runs itself) is the
// caller's choice; HOME is the private directory, which holds no .criu/.
// extra are more NAME=VALUE settings for the plugin.
func (s *criuSession) criuEnv(e Environment, extra ...string) []string {
	path := e.Path
	if path == "" {
		path = strings.Join(trusted.SystemPath, ":")
	}
	env := []string{"PATH=" + path, "HOME=" + s.dir, "GPUCR_SOCKET=" + e.Socket, pluginLogEnv + "=" + s.pluginLog}
	env = append(env, e.PluginEnv...)
	return append(env, extra...)
}
