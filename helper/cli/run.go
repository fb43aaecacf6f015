package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/client"
)

// systemInterposer is where packages install the interposer.
const systemInterposer = "/usr/lib/gpucr/libgpucr.so"

func runCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "run",
		Usage:     "run a CUDA program with the gpucr interposer, so that the helper can checkpoint it",
		ArgsUsage: "-- CMD [ARGS...]",
		Flags:     []ucli.Flag{socketFlag()},
		Action: func(c *ucli.Context) error {
			args := c.Args().Slice()
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			if len(args) == 0 {
				return usageError{errors.New("usage: gpucr run [--socket PATH] -- CMD [ARGS...]")}
			}
			path, env, err := prepareRun(args[0], client.SocketPath(c.String("socket")), os.Environ())
			if err != nil {
				return err
			}
			err = syscall.Exec(path, args, env)
			return execFailed(path, err)
		},
	}
}

// notRunnable is a program gpucr run cannot start, with the exit code a
// shell gives it: 127 where there is no such program, 126 where it is no
// file that can be run (a directory, no execute permission).
func notRunnable(cmd string, err error) error {
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EISDIR) {
		return exitError{ExitCannotRun, fmt.Errorf("run: %s: cannot run it (not an executable file)", cmd)}
	}
	if strings.Contains(cmd, "/") {
		return exitError{ExitNotFound, fmt.Errorf("run: %s: no such file", cmd)}
	}
	return exitError{ExitNotFound, fmt.Errorf("run: %s: command not found (not on PATH)", cmd)}
}

// execFailed is an exec of path that failed: ENOENT (a script whose
// interpreter is missing) 127, anything else (no exec format, permission)
// 126, as a shell says.
func execFailed(path string, err error) error {
	if errors.Is(err, syscall.ENOENT) {
		// path was found: what is missing is its interpreter (#!) or loader
		return exitError{ExitNotFound, fmt.Errorf("run: %s: %w (its interpreter or dynamic loader is missing)", path, err)}
	}
	return exitError{ExitCannotRun, fmt.Errorf("run: %s: %w", path, err)}
}

// findInterposer: $GPUCR_INTERPOSER, else <dir of gpucr>/../lib/libgpucr.so,
// else <dir of gpucr>/libgpucr.so, else /usr/lib/gpucr/libgpucr.so; gpucr is
// the real binary, also when a dynamic loader runs it (realExecutable).
func findInterposer() (string, error) {
	if p := os.Getenv("GPUCR_INTERPOSER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("GPUCR_INTERPOSER=%s: %w", p, err)
		}
		return filepath.Abs(p)
	}
	var tried []string
	if exe, err := realExecutable(); err == nil {
		dir := filepath.Dir(exe)
		tried = append(tried, filepath.Join(dir, "..", "lib", "libgpucr.so"), filepath.Join(dir, "libgpucr.so"))
	}
	tried = append(tried, systemInterposer)
	for _, p := range tried {
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("interposer libgpucr.so not found (looked at %s; set GPUCR_INTERPOSER or build it with make)",
		strings.Join(tried, ", "))
}

// prepareRun resolves the command and returns the environment it runs with:
// the interposer first in LD_PRELOAD, GPUCR_SOCKET set to socket.
func prepareRun(cmd, socket string, environ []string) (string, []string, error) {
	lib, err := findInterposer()
	if err != nil {
		return "", nil, err
	}
	path, err := exec.LookPath(cmd)
	if err != nil {
		return "", nil, notRunnable(cmd, err)
	}
	if abs, err := filepath.Abs(socket); err == nil {
		socket = abs
	}
	preload := lib
	var env []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "LD_PRELOAD":
			for _, p := range strings.FieldsFunc(v, func(r rune) bool { return r == ':' || r == ' ' }) {
				if p != lib {
					preload += ":" + p
				}
			}
		case "GPUCR_SOCKET":
		default:
			env = append(env, kv)
		}
	}
	env = append(env, "LD_PRELOAD="+preload, "GPUCR_SOCKET="+socket)
	return path, env, nil
}
