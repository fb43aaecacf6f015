package checkpoint

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// SSHTarget is a migration target reached with ssh, or with any command
// that runs a command line on a host the way ssh does (SSH HOST CMDLINE):
// the image is streamed to it as a tar archive on the command's stdin
// (or, with Shared, read there from the same path), and the target's own
// gpucr restores it, through the target's helper.
type SSHTarget struct {
	SSH  []string // the ssh command and its options: ["ssh", "-p", "2222"]
	Host string   // [user@]host
	// Gpucr is gpucr at the target, as the words of its command line
	// (["gpucr"], or ["env", "GPUCR_SOCKET=/run/x.sock", "/opt/gpucr/bin/gpucr"]).
	Gpucr []string
	// Dir is the image directory at the target; "" is the local path.
	Dir string
	// Shared: the local image directory is the target's too (a shared file
	// system): nothing is sent.
	Shared bool
	// RestoreArgs are more flags for the target's `gpucr restore`
	// (--shell-job, CRIU's options).
	RestoreArgs []string
	// Stderr receives what the remote commands write to stderr (nil: kept
	// for error messages only).
	Stderr io.Writer
	// TempDir is where the shared connection's socket directory is made
	// ("": /tmp), as Environment.TempDir.
	TempDir string

	// control is the directory of OpenSSH's shared connection: opened by
	// Check, before the source stops, and used by every later command, so
	// that the downtime pays for no handshake. Ended by Close.
	control string
}

func (t *SSHTarget) Name() string { return t.Host }

// shellQuote quotes s for a POSIX shell (ssh hands its command line to the
// target's shell).
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:@,+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellLine(words ...string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellQuote(w)
	}
	return strings.Join(q, " ")
}

// remote runs cmdline at the target with stdin; it returns stdout, and on
// failure an error with the remote stderr's last lines.
func (t *SSHTarget) remote(ctx context.Context, cmdline string, stdin io.Reader) ([]byte, error) {
	if len(t.SSH) == 0 {
		return nil, errors.New("no ssh command")
	}
	cmd := exec.CommandContext(ctx, t.SSH[0], append(append(append(t.sshOptions(), t.SSH[1:]...), t.Host), cmdline)...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout = stdin, &out
	cmd.Stderr = &errb
	if t.Stderr != nil {
		cmd.Stderr = io.MultiWriter(&errb, t.Stderr)
	}
	if err := cmd.Run(); err != nil {
		re := &RemoteError{Host: t.Host, Command: firstWord(cmdline), Exit: -1, Stderr: strings.TrimSpace(errb.String()), err: err}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			re.Exit = ee.ExitCode()
		}
		return out.Bytes(), re
	}
	return out.Bytes(), nil
}

// RemoteError is a command that failed at the target.
type RemoteError struct {
	Host, Command string
	Exit          int // its exit status; -1 if it did not run
	Stderr        string
	err           error
}

func (e *RemoteError) Error() string {
	msg := e.Stderr
	if len(msg) > 2000 {
		msg = "..." + msg[len(msg)-2000:]
	}
	s := fmt.Sprintf("%s at %s: %v", e.Command, e.Host, e.err)
	if msg != "" {
		s += ": " + msg
	}
	return s
}

func firstWord(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return s
}

func (t *SSHTarget) gpucr(args ...string) string {
	return shellLine(append(append([]string{}, t.Gpucr...), args...)...)
}

// isOpenSSH: the command is OpenSSH's ssh, which can share one connection.
func (t *SSHTarget) isOpenSSH() bool {
	if len(t.SSH) == 0 || filepath.Base(t.SSH[0]) != "ssh" {
		return false
	}
	for _, a := range t.SSH[1:] {
		if strings.Contains(a, "ControlPath") || strings.Contains(a, "ControlMaster") {
			return false // the caller's own
		}
	}
	return true
}

// sshOptions are the options of the shared connection, if there is one.
func (t *SSHTarget) sshOptions() []string {
	if t.control == "" {
		return nil
	}
	return []string{"-o", "ControlMaster=auto", "-o", "ControlPath=" + filepath.Join(t.control, "%C"), "-o", "ControlPersist=120"}
}

// Close ends the shared connection.
func (t *SSHTarget) Close() error {
	if t.control == "" {
		return nil
	}
	args := append(t.sshOptions(), "-O", "exit", t.Host)
	_ = exec.Command(t.SSH[0], args...).Run()
	err := os.RemoveAll(t.control)
	t.control = ""
	return err
}

// Check runs `gpucr version` at the target (with OpenSSH, through the
// connection the later commands share).
func (t *SSHTarget) Check(ctx context.Context) error {
	if len(t.Gpucr) == 0 {
		return errors.New("no gpucr command for the target")
	}
	if t.isOpenSSH() && t.control == "" {
		base := t.TempDir
		if base == "" {
			base = "/tmp"
		}
		dir, err := os.MkdirTemp(base, "gpucr-ssh-")
		if err != nil {
			return err
		}
		t.control = dir
	}
	out, err := t.remote(ctx, t.gpucr("version", "--json"), nil)
	if err != nil {
		return err
	}
	var v struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(out, &v); err != nil || v.Version == "" {
		return fmt.Errorf("its gpucr does not answer `gpucr version --json` (%q)", strings.TrimSpace(string(out)))
	}
	return nil
}

func (t *SSHTarget) dir(local string) string {
	if t.Dir != "" {
		return t.Dir
	}
	return local
}

// Receive streams localDir to the target's image directory, which must not
// exist or be empty (its contents are never replaced).
func (t *SSHTarget) Receive(ctx context.Context, localDir string) (string, int64, error) {
	return t.receivePart(ctx, localDir, true, nil)
}

// receivePart is Receive of the entries of localDir that only accepts (nil:
// all; rel is slash-separated, relative to localDir), into a new or empty
// directory if first, else into the one an earlier part made (a
// pre-copy's rounds go before the stop, the rest after it).
func (t *SSHTarget) receivePart(ctx context.Context, localDir string, first bool, only func(rel string) bool) (string, int64, error) {
	rdir := t.dir(localDir)
	if t.Shared {
		return rdir, 0, nil
	}
	// One command: the directory is made, refused unless empty (exit 3: a
	// failed transfer removes only what it made), and filled (tar reading
	// 1 MiB records: its default 10 KiB ones took half the speed here).
	// A later part goes into the directory the first one made.
	q := shellQuote(rdir)
	script := fmt.Sprintf(`mkdir -p -m 0700 -- %[1]s || exit 2; if [ -n "$(ls -A -- %[1]s)" ]; then echo %[2]s >&2; exit 3; fi; exec tar -C %[1]s -b 2048 -xf -`,
		q, shellQuote(rdir+" is not empty"))
	if !first {
		script = fmt.Sprintf(`[ -d %[1]s ] || { echo %[2]s >&2; exit 2; }; exec tar -C %[1]s -b 2048 -xf -`,
			q, shellQuote(rdir+" is missing"))
	}
	pr, pw := io.Pipe()
	sent := make(chan int64, 1)
	var werr error
	go func() {
		n, err := writeTar(pw, localDir, only)
		werr = err
		pw.CloseWithError(err)
		sent <- n
	}()
	_, err := t.remote(ctx, script, pr)
	pr.Close() // a writer the remote end stopped reading gives up
	n := <-sent
	if err == nil && werr != nil {
		err = werr
	}
	var re *RemoteError
	if errors.As(err, &re) && re.Exit == 3 {
		return "", n, err // not ours to remove
	}
	return rdir, n, err
}

// writeTar writes the image directory dir (CRIU's images, the GPU image,
// the logs; not gpucr's private directories) as a tar archive; with only,
// just the entries it accepts (a directory it refuses is skipped whole).
func writeTar(w io.Writer, dir string, only func(rel string) bool) (int64, error) {
	tw := tar.NewWriter(w)
	buf := make([]byte, 1<<20)
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		if strings.HasPrefix(d.Name(), ".gpucr-") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if only != nil && !only(filepath.ToSlash(rel)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.IsDir() && !fi.Mode().IsRegular() {
			return nil // an image holds directories and files only
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		c, err := io.CopyBuffer(tw, f, buf)
		n += c
		return err
	})
	if err != nil {
		return n, fmt.Errorf("sending %s: %w", dir, err)
	}
	return n, tw.Close()
}

// Restore runs `gpucr restore -D DIR --json` at the target.
func (t *SSHTarget) Restore(ctx context.Context, remoteDir string) (*RestoreResult, error) {
	args := append([]string{"restore", "-D", remoteDir, "--json"}, t.RestoreArgs...)
	out, err := t.remote(ctx, t.gpucr(args...), nil)
	if err != nil {
		// gpucr --json tells its failure on stdout
		var f struct {
			Error  string   `json:"error"`
			CRIU   []string `json:"criu_errors"`
			Plugin []string `json:"plugin_messages"`
			Hints  []string `json:"hints"`
		}
		if json.Unmarshal(out, &f) == nil && f.Error != "" {
			msg := f.Error
			for _, l := range f.Plugin {
				msg += "\n  " + l
			}
			for _, l := range f.CRIU {
				msg += "\n  criu: " + l
			}
			for _, h := range f.Hints {
				msg += "\n  hint: " + h
			}
			return nil, fmt.Errorf("gpucr restore at %s: %s", t.Host, msg)
		}
		return nil, err
	}
	var r RestoreResult
	if err := json.Unmarshal(out, &r); err != nil || r.Pid == 0 {
		return nil, fmt.Errorf("gpucr restore at %s answered no result (%v): %q", t.Host, err, strings.TrimSpace(string(out)))
	}
	return &r, nil
}

// Discard removes the image that Receive sent (never a shared one).
func (t *SSHTarget) Discard(ctx context.Context, remoteDir string) error {
	if t.Shared || remoteDir == "" {
		return nil
	}
	_, err := t.remote(ctx, "rm -rf -- "+shellQuote(remoteDir), nil)
	return err
}
