package cli

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
	ucli "github.com/urfave/cli/v2"
)

// Manual pages, written as markdown and turned into roff by md2man (what
// urfave's own ToMan uses). urfave's page of a command made the command's
// options its GLOBAL OPTIONS (the page came from an App standing in for the
// command) and had neither examples nor exit codes: these pages put a
// command's options under OPTIONS, its subcommands' under each, and add
// EXAMPLES and EXIT STATUS.

// example is one command line of a page's EXAMPLES and what it does.
type example struct{ cmd, what string }

// manExamples are the EXAMPLES of each command's page ("" is gpucr.1's).
// They are the documented forms; tests/e2e runs most of them.
var manExamples = map[string][]example{
	"": {
		{"gpucr helper &", "start the helper (one per host; scripts/gpucr-helper.service runs it under systemd)"},
		{"setsid gpucr run -- python3 train.py </dev/null >train.log 2>&1 &", "run a program so that it can be checkpointed: in its own session, stdin from /dev/null (or pass --shell-job to checkpoint and restore)"},
		{"gpucr checkpoint PID -D /var/lib/gpucr/train", "checkpoint it; the process ends"},
		{"gpucr restore -D /var/lib/gpucr/train", "bring it back, GPU memory and all"},
	},
	"version": {{"gpucr version --json", "the version and the features a migration's source asks its target for"}},
	"check": {
		{"gpucr check", "can this host checkpoint GPU processes? item by item"},
		{"gpucr check -D /var/lib/gpucr --json", "the same, with the image directory's file system, for a script"},
	},
	"image": {
		{"gpucr image inspect DIR", "what the GPU image in DIR holds: origin, parent, buffers, chunks"},
		{"gpucr image verify DIR", "check every chunk's CRC and hash and every parent reference"},
		{"gpucr image diff base/1 base/2", "which buffers changed between two images"},
		{"gpucr image gc --dry-run base/3 base/4", "which chunks of the series no kept image needs"},
	},
	"helper": {
		{"gpucr helper", "run the helper on /run/gpucr/helper.sock until SIGTERM or SIGINT"},
		{"gpucr helper --socket-mode 0666 --max-gpu-memory-per-uid 40G", "open it to every user of the host, each within a limit"},
	},
	"status": {
		{"gpucr status", "the helper, its GPUs, and each client: checkpointable or why not"},
		{"gpucr status PID --json", "one client, for a script"},
	},
	"run": {
		{"gpucr run -- python3 train.py", "run a program with the interposer, so that the helper holds its GPU memory"},
		{"setsid gpucr run -- ./server </dev/null >server.log 2>&1 &", "in a session of its own, as gpucr checkpoint needs without --shell-job"},
	},
	"torchrun": {
		{"setsid gpucr torchrun --standalone --nproc-per-node 2 train.py </dev/null >train.log 2>&1 &", "a two-rank job as torchrun would run it, in a tree gpucr can checkpoint"},
		{"gpucr checkpoint LAUNCHER_PID -D /var/lib/gpucr/train --tcp-established", "checkpoint the launcher and its ranks, with the connections between them"},
		{"gpucr torchrun --nnodes 2 --node-rank 1 --master-addr node0 --nproc-per-node gpu train.py", "the second node of a two-node job, one rank per GPU"},
	},
	"client": {{"gpucr client PID stats", "the interposer's counters of one application (debugging)"}},
	"checkpoint": {
		{"gpucr checkpoint PID -D /var/lib/gpucr/job", "dump the process tree of PID into the directory; the tree ends"},
		{"gpucr checkpoint PID -D /var/lib/gpucr/job --leave-running --force", "dump it and let it run on, replacing the image the directory held"},
		{"gpucr checkpoint PID -D base/7 --leave-running --auto-parent", "one of a series: only GPU chunks the previous image lacks are written"},
		{"gpucr checkpoint PID -D DIR --shell-job", "a process started from a shell, not in a session of its own"},
		{"gpucr checkpoint PID -D DIR --json | tail -1", "the report as one JSON object, for a script"},
	},
	"restore": {
		{"gpucr restore -D /var/lib/gpucr/job", "restore the tree dumped there (with the CRIU options the dump used that a restore must repeat)"},
		{"gpucr restore -D DIR --on-demand", "let it run before its GPU data is all loaded"},
		{"gpucr restore -D DIR --device-map 0=1", "put the image's GPU 0 onto GPU 1 of this machine"},
	},
	"migrate": {
		{"gpucr migrate PID --to gpu2", "move the tree to gpu2 over ssh; the source ends once it runs there"},
		{"gpucr migrate PID --to gpu2 --shared -D /nfs/gpucr/job", "through a file system both machines see"},
	},
	"job": {
		{"gpucr job checkpoint --part root@gpu1=PID1 --part root@gpu2=PID2 -D /var/lib/gpucr/job",
			"checkpoint both hosts' parts of a job at one cut, their connections to each other included; they end"},
		{"gpucr job restore --part root@gpu1 --part root@gpu2 -D /var/lib/gpucr/job", "restore every part, each on its host"},
	},
	"completion": {{"eval \"$(gpucr completion bash)\"", "complete gpucr's commands and flags in this bash"}},
	"man":        {{"gpucr man /tmp/man && man -l /tmp/man/gpucr-checkpoint.1", "write the pages and read one"}},
	"resume": {
		{"gpucr checkpoint PID -D DIR --gpu-only", "save the GPU state only; the process waits without its GPU memory"},
		{"gpucr resume PID", "give it its GPU memory back"},
	},
}

// signalCommands catch SIGINT and SIGTERM, stop CRIU and give the processes
// their GPU back before they exit (interruptible).
var signalCommands = []string{"checkpoint", "restore", "migrate"}

// exitStatus is a page's EXIT STATUS (cmd "" for gpucr.1).
func exitStatus(cmd string) string {
	var b strings.Builder
	b.WriteString("**0**\n: done\n\n")
	if cmd == "run" {
		b.WriteString("**126**\n: the program was found but cannot be run (not executable, or not a program)\n\n" +
			"**127**\n: the program was not found\n\n" +
			"Otherwise gpucr run becomes the program (it execs it): its exit status is the program's.\n\n" +
			"**1**\n: failed before the program started (no interposer found)\n\n**2**\n: bad command line\n")
		return b.String()
	}
	if cmd == "torchrun" {
		b.WriteString("Otherwise the first failing rank's exit status (128+N for a rank killed by signal N), " +
			"or 128+N when gpucr torchrun was sent signal N and passed it on.\n\n" +
			"**1**\n: a rank failed with 1, or the ranks could not start\n\n**2**\n: bad command line, or torchrun options gpucr torchrun does not support (an elastic --nnodes, --max-restarts, --redirects)\n\n" +
			"**126**, **127**\n: python3 (or the --no-python program) cannot be run, or was not found\n")
		return b.String()
	}
	b.WriteString("**1**\n: the operation ran and failed (the message says why; with --json, the JSON object's \"error\")\n\n" +
		"**2**\n: bad command line (an unknown command or flag, a missing argument)\n")
	if cmd == "" || slices.Contains(signalCommands, cmd) {
		b.WriteString("\n**130**, **143**\n: interrupted by SIGINT (Ctrl-C) or SIGTERM: CRIU was stopped and the processes of a dump run on with their GPU\n")
	}
	if cmd == "" {
		b.WriteString("\n**126**, **127**\n: gpucr run: the program cannot be run, or was not found\n")
	}
	return b.String()
}

// flagDoc is one flag as a definition list entry: its names, a value
// placeholder, then its usage and default.
func flagDoc(f ucli.Flag) string {
	var names []string
	for _, n := range f.Names() {
		if len(n) == 1 {
			names = append(names, "**-"+n+"**")
		} else {
			names = append(names, "**--"+n+"**")
		}
	}
	term := strings.Join(names, ", ")
	d, ok := f.(ucli.DocGenerationFlag)
	if !ok {
		return term + "\n\n"
	}
	usage := d.GetUsage()
	if d.TakesValue() {
		term += "=*VALUE*"
		if def := d.GetDefaultText(); def != "" {
			usage += " (default: " + def + ")"
		} else if v := d.GetValue(); v != "" && v != `""` && v != "[]" {
			usage += " (default: " + v + ")"
		}
	}
	return term + "\n: " + manText(usage) + "\n\n"
}

// manText keeps a usage string from being read as markdown that it is not:
// a leading character that would start a list or a heading.
func manText(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if s != "" && strings.ContainsRune("#*-+>", rune(s[0])) {
		s = "\\" + s
	}
	return s
}

// visibleFlags are the flags of a page, --help last.
func visibleFlags(flags []ucli.Flag) []ucli.Flag {
	var out []ucli.Flag
	for _, f := range flags {
		if v, ok := f.(interface{ IsVisible() bool }); ok && !v.IsVisible() {
			continue
		}
		if slices.Contains(f.Names(), "help") {
			continue
		}
		out = append(out, f)
	}
	return out
}

// commandPage is the markdown of gpucr-CMD.1.
func commandPage(cmd *ucli.Command, version string) string {
	var b strings.Builder
	name := "gpucr-" + cmd.Name
	fmt.Fprintf(&b, "%% %s 1 \"gpucr %s\"\n\n# NAME\n\n%s - %s\n\n", name, version, name, manText(cmd.Usage))
	fmt.Fprintf(&b, "# SYNOPSIS\n\n**gpucr %s**", cmd.Name)
	subs := visible(cmd.Subcommands)
	if len(subs) > 0 {
		b.WriteString(" *COMMAND*")
	}
	if len(visibleFlags(cmd.Flags)) > 0 || len(subs) > 0 {
		b.WriteString(" [*OPTIONS*]")
	}
	if cmd.ArgsUsage != "" {
		b.WriteString(" " + cmd.ArgsUsage)
	}
	b.WriteString("\n\n# DESCRIPTION\n\n")
	desc := cmd.Description
	if desc == "" {
		desc = cmd.Usage
	}
	b.WriteString(manText(desc) + ".\n\n")
	if flags := visibleFlags(cmd.Flags); len(flags) > 0 {
		b.WriteString("# OPTIONS\n\n")
		for _, f := range flags {
			b.WriteString(flagDoc(f))
		}
	}
	if len(subs) > 0 {
		b.WriteString("# COMMANDS\n\n")
		for _, s := range subs {
			fmt.Fprintf(&b, "## %s %s\n\n%s.\n\n", s.Name, s.ArgsUsage, manText(s.Usage))
			for _, f := range visibleFlags(s.Flags) {
				b.WriteString(flagDoc(f))
			}
		}
	}
	b.WriteString(examplesDoc(manExamples[cmd.Name]))
	b.WriteString("# EXIT STATUS\n\n" + exitStatus(cmd.Name) + "\n")
	b.WriteString("# SEE ALSO\n\n**gpucr**(1)")
	for _, other := range []string{"checkpoint", "restore"} {
		if other != cmd.Name {
			fmt.Fprintf(&b, ", **gpucr-%s**(1)", other)
		}
	}
	b.WriteString(", **criu**(8)\n")
	return b.String()
}

// topPage is the markdown of gpucr.1: its global options, its commands
// (each with its own page), examples and exit codes.
func topPage(app *ucli.App, cmds []*ucli.Command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%% gpucr 1 \"gpucr %s\"\n\n# NAME\n\ngpucr - %s\n\n", app.Version, manText(app.Usage))
	b.WriteString("# SYNOPSIS\n\n**gpucr** [*GLOBAL OPTIONS*] *COMMAND* [*OPTIONS*] [*ARGUMENTS*]\n\n")
	b.WriteString("# DESCRIPTION\n\ngpucr checkpoints and restores Linux processes that use NVIDIA GPUs: a CRIU plugin and a helper daemon " +
		"that owns the GPU memory of the programs started with **gpucr run**. Each command has a page of its own " +
		"(**gpucr-checkpoint**(1)); **gpucr help** *COMMAND* shows the same.\n\n")
	b.WriteString("# GLOBAL OPTIONS\n\n")
	for _, f := range visibleFlags(app.Flags) {
		b.WriteString(flagDoc(f))
	}
	b.WriteString("**--help**, **-h**\n: show help\n\n")
	b.WriteString("# COMMANDS\n\n")
	for _, c := range cmds {
		fmt.Fprintf(&b, "**%s**\n: %s (**gpucr-%s**(1))\n\n", c.Name, manText(c.Usage), c.Name)
	}
	b.WriteString(examplesDoc(manExamples[""]))
	b.WriteString("# EXIT STATUS\n\n" + exitStatus("") + "\n")
	b.WriteString("# SEE ALSO\n\n**criu**(8)\n")
	return b.String()
}

// examplesDoc is an EXAMPLES section: each command line as code, then what
// it does.
func examplesDoc(exs []example) string {
	if len(exs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("# EXAMPLES\n\n")
	for _, e := range exs {
		fmt.Fprintf(&b, "```\n%s\n```\n\n%s.\n\n", e.cmd, manText(e.what))
	}
	return b.String()
}

// roff renders a page's markdown.
func roff(markdown string) []byte { return md2man.Render([]byte(markdown)) }
