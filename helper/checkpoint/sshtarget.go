package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/image"
)

// SSHTarget is a migration target reached with ssh, or with any command
// that runs a command line on a host the way ssh does (SSH HOST CMDLINE):
// the image is streamed to it as a tar archive on the command's stdin, to
// the target's `gpucr image receive` (or, with Shared, read there from the
// same path), and the target's own gpucr restores it, through the
// target's helper.
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
	// Features are what Check requires the target's gpucr to list besides
	// (without Shared) FeatureReceive: FeatureJobAgent for a job's host.
	Features []string

	// control is the directory of OpenSSH's shared connection: opened by
	// Check, before the source stops, and used by every later command, so
	// that the downtime pays for no handshake. Ended by Close.
	control string
	// received are the directories Receive made at the target, by path.
	received map[string]receivedDir
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
// failure an error with the remote stderr's last lines. An *os.File stdin
// (a pipe's reading end) is the command's own: it is closed here once the
// command has it, so that its writer learns (EPIPE) when the command ends.
func (t *SSHTarget) remote(ctx context.Context, cmdline string, stdin io.Reader) ([]byte, error) {
	f, owned := stdin.(*os.File)
	if owned {
		defer f.Close()
	}
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
	err := cmd.Start()
	if owned {
		f.Close()
	}
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
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
		Version  string `json:"version"`
		Features string `json:"features"` // comma-separated
	}
	if err := json.Unmarshal(out, &v); err != nil || v.Version == "" {
		return fmt.Errorf("its gpucr does not answer `gpucr version --json` (%q)", strings.TrimSpace(string(out)))
	}
	if !t.Shared && !slices.Contains(strings.Split(v.Features, ","), FeatureReceive) {
		return fmt.Errorf("its gpucr (version %s) has no `gpucr image receive`, which receives a streamed image there: install this gpucr there (or use --shared)",
			v.Version)
	}
	for _, f := range t.Features {
		if !slices.Contains(strings.Split(v.Features, ","), f) {
			return fmt.Errorf("its gpucr (version %s) lacks %q (`gpucr version --json`): install this gpucr there", v.Version, f)
		}
	}
	return nil
}

// start starts cmdline at the target, through the shared connection, with
// pipes to its stdin and from its stdout; its stderr goes to stderr (and
// t.Stderr). The session lasts until stdin is closed and the command ends,
// or ctx ends.
func (t *SSHTarget) start(ctx context.Context, cmdline string, stderr io.Writer) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	if len(t.SSH) == 0 {
		return nil, nil, nil, errors.New("no ssh command")
	}
	cmd := exec.CommandContext(ctx, t.SSH[0], append(append(append(t.sshOptions(), t.SSH[1:]...), t.Host), cmdline)...)
	cmd.Stderr = stderr
	if t.Stderr != nil {
		cmd.Stderr = io.MultiWriter(stderr, t.Stderr)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("ssh %s: %w", t.Host, err)
	}
	return cmd, in, out, nil
}

func (t *SSHTarget) dir(local string) string {
	if t.Dir != "" {
		return t.Dir
	}
	return local
}

// Receive streams localDir to the target's image directory, which must
// not exist or be empty (its contents are never replaced).
func (t *SSHTarget) Receive(ctx context.Context, localDir string) (Received, error) {
	return t.receivePart(ctx, localDir, true, nil)
}

// FeatureReceive is what `gpucr version --json` lists where gpucr has
// `gpucr image receive` and `gpucr image discard`, which a streamed
// migration runs at its target.
const FeatureReceive = "image-receive"

// receivedDir is a directory `gpucr image receive` made at the target: its
// identity, by which later commands refer to it and to no other directory
// its path may lead to by then.
type receivedDir struct {
	ID   string `json:"id"` // DEV:INO
	Made bool   `json:"made"`
}

// receivePart is Receive of the entries of localDir that only accepts (nil:
// all; rel is slash-separated, relative to localDir), into a directory the
// target's gpucr makes if first, else into the one an earlier part made
// (a pre-copy's rounds go before the stop, the rest after it). The
// target's `gpucr image receive` names the directory it made before it
// reads anything (a failed transfer removes only that), and refuses a
// directory that is not empty.
func (t *SSHTarget) receivePart(ctx context.Context, localDir string, first bool, only func(rel string) bool) (Received, error) {
	rdir := t.dir(localDir)
	if t.Shared {
		return Received{Dir: rdir}, nil
	}
	args := []string{"image", "receive"}
	if !first {
		r, ok := t.received[rdir]
		if !ok {
			return Received{}, fmt.Errorf("no earlier part of the image went to %s:%s", t.Host, rdir)
		}
		args = append(args, "--into", r.ID)
	}
	args = append(args, "--", rdir)
	// The stream goes through a pipe that ssh reads itself (no copy in
	// this process between the archive and ssh), 1 MiB deep where the
	// kernel allows.
	pr, pw, err := os.Pipe()
	if err != nil {
		return Received{}, fmt.Errorf("a pipe for the image: %w", err)
	}
	if rc, err := pw.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, 1<<20) })
	}
	sent := make(chan image.SendResult, 1)
	var werr error
	go func() {
		res, err := writeTar(pw, localDir, only)
		werr = err
		pw.Close()
		sent <- res
	}()
	out, err := t.remote(ctx, t.gpucr(args...), pr) // closes pr: a writer the remote end stopped reading gives up
	res := <-sent
	switch {
	case werr == nil:
	case err == nil:
		err = werr
	case !errors.Is(werr, syscall.EPIPE):
		// The sending failed first, and the target saw the stream end.
		err = fmt.Errorf("%w; at the target: %v", werr, err)
	}
	got := Received{Bytes: res.Bytes, NotSent: res.NotSent}
	if !first {
		got.Dir = rdir
	} else if r, ok := receivedOf(out); ok {
		if t.received == nil {
			t.received = map[string]receivedDir{}
		}
		t.received[rdir] = r
		got.Dir = rdir
	}
	return got, err
}

// receivedOf finds the line of `gpucr image receive` that names the
// directory it made.
func receivedOf(out []byte) (receivedDir, bool) {
	for _, line := range strings.Split(string(out), "\n") {
		var r receivedDir
		if json.Unmarshal([]byte(line), &r) == nil && r.ID != "" {
			return r, true
		}
	}
	return receivedDir{}, false
}

// writeTar writes the image directory dir (CRIU's images, the GPU image,
// the logs; not gpucr's private directories) as a tar archive; with only,
// just the entries it accepts (a directory it refuses is skipped whole).
// Only this user's directories and regular files go, each opened beneath
// its directory without following a link (image.Send): a restore at the
// target reads only the restoring user's files, and whoever else may
// write dir (the job's owner, in its own -D) would only have root send
// what it swaps in.
func writeTar(w io.Writer, dir string, only func(rel string) bool) (image.SendResult, error) {
	return image.Send(w, dir, image.SendOptions{
		Only: func(rel string) bool {
			return !strings.HasPrefix(path.Base(rel), ".gpucr-") && (only == nil || only(rel))
		},
		Owner: &image.Owner{UID: os.Geteuid(), GID: os.Getegid()},
	})
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

// Discard removes the image that Receive sent (never a shared one): the
// target's gpucr removes the directory it made, by its identity, and what
// it holds, without following a link; a directory the path leads to that
// is not that one is left alone.
func (t *SSHTarget) Discard(ctx context.Context, remoteDir string) error {
	if t.Shared || remoteDir == "" {
		return nil
	}
	r, ok := t.received[remoteDir]
	if !ok {
		return nil // nothing there is this migration's
	}
	args := []string{"image", "discard", "--id", r.ID}
	if !r.Made {
		args = append(args, "--keep-dir") // an empty directory that was there: it stays, empty
	}
	if _, err := t.remote(ctx, t.gpucr(append(args, "--", remoteDir)...), nil); err != nil {
		return err
	}
	delete(t.received, remoteDir)
	return nil
}
