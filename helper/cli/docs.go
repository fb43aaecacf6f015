package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// Manual pages and shell completion, both made from the command line's own
// definitions: `gpucr man DIR` writes gpucr.1 and gpucr-COMMAND.1 for each
// command (the Makefile's `man` target), `gpucr completion bash|zsh` prints
// a completion script (commands, their subcommands and flags).

// manCommand is `gpucr man DIR` (the Makefile's `man` target runs it).
func manCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "man",
		Usage:     "write gpucr's manual pages (gpucr.1, gpucr-COMMAND.1) into DIR: man -l DIR/gpucr-checkpoint.1 reads one",
		ArgsUsage: "DIR",
		Action: func(c *ucli.Context) error {
			if c.NArg() != 1 {
				return usageError{fmt.Errorf("usage: gpucr man DIR")}
			}
			return writeManPages(c.App, c.Args().First())
		},
	}
}

// writeManPages writes the app's page and one per visible command
// (manpage.go).
func writeManPages(app *ucli.App, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("manual pages: %w", err)
	}
	write := func(name, markdown string) error {
		if err := os.WriteFile(filepath.Join(dir, name), roff(markdown), 0o644); err != nil {
			return fmt.Errorf("manual page %s: %w", name, err)
		}
		return nil
	}
	cmds := visible(app.Commands)
	if err := write("gpucr.1", topPage(app, cmds)); err != nil {
		return err
	}
	for _, cmd := range cmds {
		if err := write("gpucr-"+cmd.Name+".1", commandPage(cmd, app.Version)); err != nil {
			return err
		}
	}
	return nil
}

// visible are the commands a user sees: not hidden, and not urfave's own
// help command (each page and the script say how to get help).
func visible(cmds []*ucli.Command) []*ucli.Command {
	var out []*ucli.Command
	for _, c := range cmds {
		if !c.Hidden && c.Name != "help" {
			out = append(out, c)
		}
	}
	return out
}

// completionCommand is `gpucr completion bash|zsh`.
func completionCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: eval \"$(gpucr completion bash)\" (or zsh)",
		ArgsUsage: "bash|zsh",
		Action: func(c *ucli.Context) error {
			switch c.Args().First() {
			case "bash":
				_, err := fmt.Fprint(c.App.Writer, completionScript(c.App, false))
				return err
			case "zsh":
				_, err := fmt.Fprint(c.App.Writer, completionScript(c.App, true))
				return err
			}
			return usageError{fmt.Errorf("usage: gpucr completion bash|zsh")}
		},
	}
}

// flagWords are a command's flags as typed: --name and -n.
func flagWords(flags []ucli.Flag) []string {
	var out []string
	for _, f := range flags {
		if bf, ok := f.(interface{ IsVisible() bool }); ok && !bf.IsVisible() {
			continue
		}
		for _, n := range f.Names() {
			if len(n) == 1 {
				out = append(out, "-"+n)
			} else {
				out = append(out, "--"+n)
			}
		}
	}
	out = append(out, "--help")
	slices.Sort(out)
	return slices.Compact(out)
}

// completionScript is a bash function (zsh: through bashcompinit) that
// completes the first word from the commands, a later one from the
// command's subcommands and flags, and file names otherwise.
func completionScript(app *ucli.App, zsh bool) string {
	var b strings.Builder
	b.WriteString("# gpucr shell completion (made by `gpucr completion`)\n")
	if zsh {
		b.WriteString("autoload -U +X bashcompinit && bashcompinit\n")
	}
	b.WriteString("_gpucr_complete() {\n")
	b.WriteString("\tlocal cur=${COMP_WORDS[COMP_CWORD]} cmd=${COMP_WORDS[1]} words\n")
	b.WriteString("\tif [ \"$COMP_CWORD\" -eq 1 ]; then\n")
	var names []string
	for _, c := range visible(app.Commands) {
		names = append(names, c.Names()...)
	}
	names = append(names, "help")
	slices.Sort(names)
	fmt.Fprintf(&b, "\t\twords=%q\n", strings.Join(slices.Compact(names), " "))
	b.WriteString("\telse\n\t\tcase $cmd in\n")
	for _, c := range visible(app.Commands) {
		words := flagWords(c.Flags)
		for _, s := range visible(c.Subcommands) {
			words = append(words, s.Names()...)
		}
		fmt.Fprintf(&b, "\t\t%s) words=%q ;;\n", strings.Join(c.Names(), "|"), strings.Join(words, " "))
	}
	b.WriteString("\t\t*) words= ;;\n\t\tesac\n\tfi\n")
	b.WriteString("\tCOMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n}\n")
	b.WriteString("complete -o default -F _gpucr_complete gpucr\n")
	return b.String()
}
