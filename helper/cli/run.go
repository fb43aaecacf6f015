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

// systemInterposer is where packages install the interposer, and
// systemServed the served-mode library.
const (
	systemInterposer = "/usr/lib/gpucr/libgpucr.so"
	systemServed     = "/usr/lib/gpucr/served/libcuda.so.1"
)

func runCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "run",
		Usage:     "run a CUDA program with the gpucr interposer, so that the helper can checkpoint it",
		ArgsUsage: "-- CMD [ARGS...]",
		Description: "With --served, the program loads gpucr's served-mode library under the interposer instead of NVIDIA's\n" +
			"driver: a worker process that the helper keeps ready (gpucr helper --served-pool N) runs its GPU calls, and\n" +
			"the program itself holds no driver state (docs/served-mode.md says what served mode supports).",
		Flags: []ucli.Flag{socketFlag(),
			&ucli.BoolFlag{Name: "served", Usage: "run the program in served mode: its GPU calls run in a worker of the helper's"},
			&ucli.UintFlag{Name: "device", Usage: "served mode: the device (the helper's ordinal) the worker runs on"}},
		Action: func(c *ucli.Context) error {
			args := c.Args().Slice()
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			if len(args) == 0 {
				return usageError{errors.New("usage: gpucr run [--socket PATH] [--served [--device N]] -- CMD [ARGS...]")}
			}
			if c.IsSet("device") && !c.Bool("served") {
				return usageError{errors.New("run: --device is for served mode (--served)")}
			}
			prepare := prepareRun
			if c.Bool("served") {
				prepare = func(cmd, socket string, environ []string) (string, []string, error) {
					return prepareServed(cmd, socket, c.Uint("device"), environ)
				}
			}
			path, env, err := prepare(args[0], client.SocketPath(c.String("socket")), os.Environ())
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

// preloadAfterFirst puts libs right after the first entry of an LD_PRELOAD
// list (the interposer, which prepareRun put first), in their order, once
// each; empty ones are left out.
func preloadAfterFirst(list string, libs ...string) string {
	parts := strings.Split(list, ":")
	out := parts[:1:1]
	seen := map[string]bool{}
	for _, l := range libs {
		if l != "" && !seen[l] {
			out = append(out, l)
			seen[l] = true
		}
	}
	for _, p := range parts[1:] {
		if p != "" && !seen[p] {
			out = append(out, p)
		}
	}
	return strings.Join(out, ":")
}

// findServed is the served-mode library, found as findInterposer finds the
// interposer: $GPUCR_SERVED_LIB, else <dir of gpucr>/../lib/served/libcuda.so.1,
// else /usr/lib/gpucr/served/libcuda.so.1.
func findServed() (string, error) {
	if p := os.Getenv("GPUCR_SERVED_LIB"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("GPUCR_SERVED_LIB=%s: %w", p, err)
		}
		return filepath.Abs(p)
	}
	var tried []string
	if exe, err := realExecutable(); err == nil {
		tried = append(tried, filepath.Join(filepath.Dir(exe), "..", "lib", "served", "libcuda.so.1"))
	}
	tried = append(tried, systemServed)
	for _, p := range tried {
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("served-mode library not found (looked at %s; set GPUCR_SERVED_LIB or build it with make)",
		strings.Join(tried, ", "))
}

// prepareServed is prepareRun for served mode: the interposer preloaded as
// in-process mode has it (the helper owns the memory, and checkpoints go
// through it), with served mode's library as the driver under it
// (GPUCR_LIBCUDA), whose directory comes first in LD_LIBRARY_PATH so that the
// program's own libcuda.so.1 is that library too; GPUCR_SERVED_DEVICE set.
// Served mode's runtime, cuBLAS and cuBLASLt (libcudart.so.13,
// libcublas.so.13 and libcublasLt.so.13 beside the served library) are
// preloaded right after the interposer: a program's libraries name
// NVIDIA's runtime by soname, often through an RPATH that LD_LIBRARY_PATH
// cannot override, and a preloaded object with that soname is the one the
// dynamic linker gives them.
func prepareServed(cmd, socket string, device uint, environ []string) (string, []string, error) {
	lib, err := findServed()
	if err != nil {
		return "", nil, err
	}
	path, env, err := prepareRun(cmd, socket, environ)
	if err != nil {
		return "", nil, err
	}
	dir := filepath.Dir(lib)
	libPath := dir
	// The runtime, cuBLAS and cuBLASLt of served mode, where they were built.
	var preload []string
	for _, name := range []string{"libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			preload = append(preload, p)
		}
	}
	out := env[:0]
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "LD_PRELOAD":
			out = append(out, "LD_PRELOAD="+preloadAfterFirst(v, preload...))
		case "LD_LIBRARY_PATH":
			for _, p := range strings.Split(v, ":") {
				if p != "" && p != dir {
					libPath += ":" + p
				}
			}
		case "GPUCR_LIBCUDA", "GPUCR_SERVED_DEVICE":
		default:
			out = append(out, kv)
		}
	}
	out = append(out, "LD_LIBRARY_PATH="+libPath, "GPUCR_LIBCUDA="+lib, fmt.Sprintf("GPUCR_SERVED_DEVICE=%d", device))
	return path, out, nil
}

// fileExists: path names something stat can see.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
