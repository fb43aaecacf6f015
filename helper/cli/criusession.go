package cli

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// criuSession is a private temporary directory (0700) for one CRIU run: the
// CRIU configuration file that names the plugin directory (CRIU's RPC has no
// option for it), and the file the plugin appends its messages to
// (GPUCR_PLUGIN_LOG: go-criu runs `criu swrk` with its stderr discarded).
// Both are created exclusively there, never in the image directory, where a
// symlink or a FIFO planted under the same name would be followed or opened.
type criuSession struct {
	dir       string
	config    string // "" without a plugin directory
	pluginLog string
}

// pluginLogEnv names the plugin's message file (criuplugin/README.md).
const pluginLogEnv = "GPUCR_PLUGIN_LOG"

func newCRIUSession(pluginDir string) (*criuSession, error) {
	dir, err := os.MkdirTemp("", "gpucr-criu-")
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
