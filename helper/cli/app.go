// Package cli is gpucr's command line: the subcommands users and scripts run.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"strings"

	"github.com/gpucr/gpucr/helper/checkpoint"

	ucli "github.com/urfave/cli/v2"
)

// Version is set at build time with -ldflags "-X .../cli.Version=...".
var Version = "0.1.0-dev"

// Exit codes scripts can rely on. A checkpoint, a restore or a migration
// interrupted by a signal exits 128 + the signal's number (130 for SIGINT,
// 143 for SIGTERM), as a shell reports a program the signal killed; `gpucr
// run` exits 126 or 127 where a shell would (ExitCannotRun, ExitNotFound).
const (
	ExitOK        = 0
	ExitFailure   = 1   // the operation ran and failed
	ExitUsage     = 2   // bad command line
	ExitCannotRun = 126 // gpucr run: the program is not executable
	ExitNotFound  = 127 // gpucr run: no such program
)

// exitError is a failure with an exit code of its own (ExitCannotRun,
// ExitNotFound).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// usageError marks errors that come from a bad command line.
type usageError struct{ error }

func init() {
	// urfave/cli's version flag is -v/--version. Users of CRIU and of most
	// command lines read -v as "more verbose": `gpucr -v checkpoint PID`
	// printed the version and exited 0 without checkpointing, and a script
	// carried on as if it had. gpucr keeps --version alone and refuses -v
	// (noVerboseFlag says what to use instead).
	ucli.VersionFlag = &ucli.BoolFlag{Name: "version", Usage: "print the version"}
}

// noVerboseFlag explains a refused -v (-v4, -vv, --verbose) in err, a
// usage error of urfave/cli or of flagsAnywhere: gpucr has no verbosity
// flag, and -v is not its version either.
func noVerboseFlag(err error) error {
	if err == nil {
		return nil
	}
	_, flag, ok := strings.Cut(err.Error(), "flag provided but not defined: ")
	if !ok {
		return err
	}
	flag = strings.TrimSpace(flag)
	if flag != "--verbose" && flag != "-verbose" && !(strings.HasPrefix(flag, "-v") && !strings.HasPrefix(flag, "-ve")) {
		return err
	}
	return fmt.Errorf("%w: gpucr has no %s, and no verbosity flag: `gpucr --version` prints its version; "+
		"checkpoint and restore print each step, and --criu-log-level 0-4 sets CRIU's own log in the image directory "+
		"(CRIU's -v); `gpucr helper --log-level debug` makes the helper say more", err, flag)
}

// jsonDone marks the failure of a command that has already written its
// --json document, which tells the failure (image verify's problems): no
// second JSON object follows it.
type jsonDone struct{ error }

// Run runs the gpucr command line and returns the process exit code. A
// failure is one line on stderr (a CRIU failure: what CRIU and the plugin
// said, indented below it), or with --json one JSON object on stdout.
func Run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	caught := &caughtSignal{}
	err := app.RunContext(context.WithValue(context.Background(), caughtKey{}, caught), args)
	if err == nil {
		return ExitOK
	}
	code := ExitFailure
	var ue usageError
	var ec ucli.ExitCoder // urfave's own: `gpucr help NOSUCH`
	// urfave's own exit codes (`gpucr help NOSUCH`), not a program's that
	// failed underneath (*exec.ExitError has an ExitCode too)
	var xe *exec.ExitError
	var own exitError
	switch {
	case errors.As(err, &own):
		code = own.code
	case errors.As(err, &ue) || (errors.As(err, &ec) && !errors.As(err, &xe)):
		code = ExitUsage
	}
	if sig := caught.signal(); sig != 0 {
		// It stopped because of the signal: say so as a shell would.
		code = 128 + int(sig)
	}
	if wantsJSON(args) {
		var done jsonDone
		if errors.As(err, &done) {
			return code
		}
		if jerr := writeJSON(stdout, errorJSON(err, code)); jerr == nil {
			return code
		}
	}
	fmt.Fprintf(stderr, "gpucr: %v\n", err)
	return code
}

// wantsJSON says whether the command line asks for --json (flags may stand
// after the arguments; everything after "--" belongs to another program).
func wantsJSON(args []string) bool {
	for _, a := range args[min(1, len(args)):] {
		switch a {
		case "--":
			return false
		case "--json", "-json", "--json=true", "-json=true":
			return true
		}
	}
	return false
}

// errorJSON is a failure for --json: {"error": ..., "exit_code": ...}, and
// for a CRIU failure what CRIU and the plugin said.
func errorJSON(err error, code int) map[string]any {
	m := map[string]any{}
	var f *checkpoint.Failure
	if errors.As(err, &f) {
		maps.Copy(m, f.Fields())
		m["error"] = f.Summary
	} else {
		m["error"] = err.Error()
	}
	m["exit_code"] = code
	return m
}

func newApp(stdout, stderr io.Writer) *ucli.App {
	onUsageError := func(_ *ucli.Context, err error, _ bool) error {
		return usageError{noVerboseFlag(err)}
	}
	app := &ucli.App{
		Name:      "gpucr",
		Usage:     "checkpoint and restore processes that use NVIDIA GPUs",
		Version:   Version,
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "debug", Usage: "log debug messages to stderr"},
			// urfave adds its -h/--help only with its own help command,
			// which helpCommand replaces.
			ucli.HelpFlag,
		},
		OnUsageError: onUsageError,
		// Errors come back to Run, which chooses the exit code (urfave's
		// default handler calls os.Exit for some).
		ExitErrHandler: func(*ucli.Context, error) {},
		// Reached only when no command matches.
		Action: func(c *ucli.Context) error {
			if c.Args().Present() {
				return usageError{fmt.Errorf("unknown command %q (`gpucr help` lists them)", c.Args().First())}
			}
			return ucli.ShowAppHelp(c)
		},
		Commands: []*ucli.Command{
			versionCommand(),
			checkCommand(),
			imageCommand(),
			helperCommand(),
			statusCommand(),
			runCommand(),
			torchrunCommand(),
			clientCommand(),
			checkpointCommand(),
			restoreCommand(),
			migrateCommand(),
			jobCommand(),
			jobAgentCommand(),
			servedWorkerCommand(),
			completionCommand(),
			manCommand(),
			resumeCommand(),
			helpCommand(),
		},
	}
	for _, c := range app.Commands {
		c.OnUsageError = onUsageError
	}
	return app
}

// writeJSON writes v as one line of JSON: every --json document, success
// or failure, so that a script can take the last line of the output.
func writeJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// helpCommand is `gpucr help [COMMAND [SUBCOMMAND]]`. urfave's own reads
// only the first word: `gpucr help image gc` printed image's help. This one
// follows every word down the commands and shows what `COMMAND SUBCOMMAND
// --help` shows.
func helpCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "help",
		Aliases:   []string{"h"},
		Usage:     "show the commands, or one command's help (gpucr help image gc)",
		ArgsUsage: "[COMMAND [SUBCOMMAND]]",
		Action: func(c *ucli.Context) error {
			args := c.Args().Slice()
			if len(args) == 0 {
				return ucli.ShowAppHelp(c)
			}
			path, err := commandPath(c.App.Commands, args)
			if err != nil {
				return err
			}
			return c.App.RunContext(c.Context, append(append([]string{c.App.Name}, path...), "--help"))
		},
	}
}

// commandPath resolves words (aliases included) to the names of a command
// and its subcommands, or says which word names none.
func commandPath(cmds []*ucli.Command, words []string) ([]string, error) {
	var path []string
	for _, w := range words {
		var found *ucli.Command
		for _, cmd := range cmds {
			if cmd.HasName(w) {
				found = cmd
				break
			}
		}
		if found == nil {
			what := strings.Join(append(path, w), " ")
			return nil, usageError{fmt.Errorf("help: no command %q (`gpucr help` lists them)", what)}
		}
		path = append(path, found.Name)
		cmds = found.Subcommands
	}
	return path, nil
}

func versionCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "version",
		Usage: "print gpucr's version",
		Flags: []ucli.Flag{&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}},
		Action: func(c *ucli.Context) error {
			if c.Bool("json") {
				// features (comma-separated, so that every value stays a
				// string): what a migration's source asks of its target
				// before it stops anything
				return writeJSON(c.App.Writer, map[string]string{"version": Version, "features": checkpoint.FeatureReceive + "," + checkpoint.FeatureJobAgent})
			}
			_, err := fmt.Fprintf(c.App.Writer, "gpucr %s\n", Version)
			return err
		},
	}
}
