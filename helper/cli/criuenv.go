package cli

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/trusted"
)

// What of the command line and the environment a checkpoint, a restore or a
// migration hands to package checkpoint: which CRIU, which plugin, CRIU's
// options, and the environment CRIU and the plugin get.

// criuTimeoutFlag: the deadline of a CRIU run.
// shellJobFlag is --shell-job, for every command that runs CRIU.
func shellJobFlag() ucli.Flag {
	return &ucli.BoolFlag{Name: "shell-job", Usage: "the process tree was started from a shell: it leads no session of its own (CRIU --shell-job)"}
}

func criuTimeoutFlag() ucli.Flag {
	return &ucli.DurationFlag{Name: "criu-timeout", Value: checkpoint.DefaultTimeout,
		Usage: "how long CRIU may run; then it is killed (the processes of a dump run on)"}
}

// criuOptionFlags are CRIU's own options that gpucr passes on (dump and
// restore alike; CRIU ignores what does not apply), and --criu-opt for any
// other.
func criuOptionFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "tcp-established", Usage: "CRIU --tcp-established: checkpoint and restore open TCP connections (a checkpoint turns it on by itself where both ends of every connection are in the tree, and refuses a connection to a peer outside it unless this or --tcp-close is given)"},
		&ucli.BoolFlag{Name: "tcp-close", Usage: "CRIU --tcp-close: restore open TCP connections closed"},
		&ucli.BoolFlag{Name: "skip-in-flight", Usage: "CRIU --skip-in-flight: leave half-open TCP connections out"},
		&ucli.BoolFlag{Name: "ext-unix-sk", Usage: "CRIU --ext-unix-sk: allow unix sockets connected outside the tree"},
		&ucli.BoolFlag{Name: "file-locks", Usage: "CRIU --file-locks: checkpoint file locks"},
		&ucli.BoolFlag{Name: "link-remap", Usage: "CRIU --link-remap: allow open files that were unlinked (a checkpoint turns it on by itself for a file still linked under another name, as Python's multiprocessing semaphores are)"},
		&ucli.StringFlag{Name: "network-lock", Usage: "CRIU --network-lock METHOD (iptables, nftables, skip) for TCP connections; a checkpoint whose connections all have both ends in the tree skips it by itself, and its restore repeats what the checkpoint used"},
		&ucli.StringSliceFlag{Name: "external", Usage: "CRIU --external RES (repeatable)"},
		&ucli.StringFlag{Name: "manage-cgroups", Usage: "CRIU --manage-cgroups MODE (none, props, soft, full, strict, ignore)"},
		&ucli.IntFlag{Name: "criu-log-level", Value: 4, Usage: "CRIU's -v for its log in the image directory (0-4)"},
		&ucli.StringSliceFlag{Name: "criu-opt", Usage: "any other CRIU option, as CRIU's configuration file writes it, e.g. --criu-opt 'ghost-limit 10M' (repeatable)"},
	}
}

// criuSetup is what a checkpoint, a restore or a migration gives package
// checkpoint: CRIU's options (criuOptions) and its environment
// (criuEnvironment).
func criuSetup(c *ucli.Context) (checkpoint.CRIU, checkpoint.Environment, error) {
	o, err := criuOptions(c)
	if err != nil {
		return o, checkpoint.Environment{}, err
	}
	env, err := criuEnvironment(c.String("socket"))
	return o, env, err
}

// criuOptions builds the CRIU options of a checkpoint, a restore or a
// migration from the command line: the CRIU binary and the plugin (searched
// as findPlugin says), the deadline, --shell-job and CRIU's own options.
func criuOptions(c *ucli.Context) (checkpoint.CRIU, error) {
	var o checkpoint.CRIU
	bin, err := criuBinary()
	if err != nil {
		return o, err
	}
	plugin, err := findPlugin(c.String("plugin-dir"))
	if err != nil {
		return o, err
	}
	if c.Duration("criu-timeout") <= 0 {
		return o, usageError{fmt.Errorf("--criu-timeout %v: must be positive", c.Duration("criu-timeout"))}
	}
	o = checkpoint.CRIU{Binary: bin, PluginDir: plugin.Dir, Timeout: c.Duration("criu-timeout"), ShellJob: c.Bool("shell-job"),
		TCPEstablished: c.Bool("tcp-established"), TCPClose: c.Bool("tcp-close"), TCPSkipInFlight: c.Bool("skip-in-flight"),
		ExtUnixSockets: c.Bool("ext-unix-sk"), FileLocks: c.Bool("file-locks"), LinkRemap: c.Bool("link-remap"),
		External: c.StringSlice("external"), ManageCgroups: c.String("manage-cgroups"), NetworkLock: c.String("network-lock"), LogLevel: c.Int("criu-log-level"),
		Extra: c.StringSlice("criu-opt")}
	if plugin.Dir == "" {
		o.NoPlugin = plugin.notFound()
	}
	return o, nil
}

// criuBinary is the CRIU to run: $GPUCR_CRIU, else criu on PATH. As root,
// only one that root alone can change (package trusted): the environment
// (GPUCR_CRIU, PATH) may be a user's, kept by `sudo -E`, and name their own
// program. On PATH, one that root cannot trust is passed over; the system's
// directories come after PATH's.
func criuBinary() (string, error) {
	p := os.Getenv("GPUCR_CRIU")
	if os.Geteuid() != 0 {
		if p != "" {
			return p, nil
		}
		found, err := exec.LookPath("criu")
		if err != nil {
			return "", fmt.Errorf("no criu on PATH (scripts/install-criu.sh installs CRIU 4.2): %w", err)
		}
		return found, nil
	}
	if p != "" {
		real, err := trusted.Path(p)
		if err != nil {
			return "", fmt.Errorf("GPUCR_CRIU=%s: %w (as root, gpucr runs a CRIU that the environment names only where root alone can change it)", p, err)
		}
		return real, nil
	}
	found, _, err := trusted.LookPath("criu", os.Getenv("PATH"))
	if err != nil {
		return "", fmt.Errorf("%w (scripts/install-criu.sh installs CRIU 4.2)", err)
	}
	return found, nil
}

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

// criuEnvironment is what of this process's environment CRIU and the plugin
// get: the helper's socket, PATH (for root the system's: a user's PATH kept
// by `sudo -E` could name their programs), a private temporary directory,
// and GPUCR_LOG and GPUCR_PLUGIN_TIMEOUT_S, which only tune what the plugin
// says and how long it waits.
func criuEnvironment(socket string) (checkpoint.Environment, error) {
	tmp, err := privateTempDir()
	if err != nil {
		return checkpoint.Environment{}, err
	}
	e := checkpoint.Environment{Socket: client.SocketPath(socket), TempDir: tmp, Path: os.Getenv("PATH")}
	if os.Geteuid() == 0 || e.Path == "" {
		e.Path = strings.Join(trusted.SystemPath, ":")
	}
	for _, k := range []string{"GPUCR_LOG", "GPUCR_PLUGIN_TIMEOUT_S"} {
		if v, ok := os.LookupEnv(k); ok {
			e.PluginEnv = append(e.PluginEnv, k+"="+v)
		}
	}
	return e, nil
}
