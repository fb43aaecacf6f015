package cli

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/fault"
)

// `gpucr job checkpoint|restore`: every host's part of a distributed job,
// checkpointed at one cut and restored together (checkpoint.CheckpointJob,
// checkpoint.RestoreJob), and the hidden `gpucr job-agent` that each host
// runs for it over ssh.

// jobHostFlags are how the hosts are reached, as gpucr migrate reaches its
// target.
func jobHostFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringSliceFlag{Name: "part", Usage: "a part of the job: HOST=PID[:DIR] to checkpoint (HOST as ssh takes it, PID in that host's pid namespace, DIR its own image directory), HOST[=DIR] to restore (repeatable, one a host; DIR: where the hosts share a file system, each part's own)"},
		&ucli.StringFlag{Name: "images-dir", Aliases: []string{"D"}, Usage: "the image directory of every part that names none, on its own host (absolute; new or empty for a checkpoint)"},
		&ucli.StringFlag{Name: "ssh", Value: "ssh", Usage: "the command that runs a command line on a host, split at blanks (ssh -p 2222 -i KEY)"},
		&ucli.StringFlag{Name: "remote-gpucr", Value: "gpucr", Usage: "gpucr on the hosts, split at blanks (env GPUCR_SOCKET=/run/x.sock /opt/gpucr/bin/gpucr)"},
		&ucli.DurationFlag{Name: "step-timeout", Value: 10 * time.Minute, Usage: "how long the coordinator waits for a host at each step"},
		&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"},
	}
}

// jobAgentFlags are the flags the coordinator hands on to every agent.
func jobAgentFlags() []ucli.Flag {
	return append([]ucli.Flag{shellJobFlag(),
		criuTimeoutFlag()}, criuOptionFlags()...)
}

func jobCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "job",
		Usage: "checkpoint or restore every host's part of a distributed job at one cut",
		Description: "Each host is reached over ssh (one shared connection each, opened before anything stops) and runs its part\n" +
			"through `gpucr job-agent` there. A checkpoint freezes every part, waits until no data of the job's connections\n" +
			"between hosts is in flight, dumps every part, and only then ends them; a failure on any host before that gives\n" +
			"every part back, running. A restore holds every part, its sockets in repair mode, until all are made.\n" +
			"See docs/job-checkpoint.md.",
		Subcommands: []*ucli.Command{jobCheckpointCommand(), jobRestoreCommand()},
	}
}

// jobTargets makes the hosts' SSHTargets from the command line.
func jobTargets(c *ucli.Context, hosts []string) ([]*checkpoint.SSHTarget, error) {
	ssh, gpucr := strings.Fields(c.String("ssh")), strings.Fields(c.String("remote-gpucr"))
	if len(ssh) == 0 || len(gpucr) == 0 {
		return nil, usageError{fmt.Errorf("job: --ssh and --remote-gpucr must name a command")}
	}
	env, err := criuEnvironment(c.String("socket"))
	if err != nil {
		return nil, err
	}
	var out []*checkpoint.SSHTarget
	for _, h := range hosts {
		out = append(out, &checkpoint.SSHTarget{SSH: ssh, Host: h, Gpucr: gpucr, Shared: true, TempDir: env.TempDir})
	}
	return out, nil
}

// jobDir is -D, which must be absolute: it names a directory on other hosts.
func jobDir(c *ucli.Context) (string, error) {
	d := c.String("images-dir")
	if d != "" && !filepath.IsAbs(d) {
		return "", usageError{fmt.Errorf("job: -D %s: the image directory must be absolute", d)}
	}
	if d == "" {
		return "", nil // each part names its own
	}
	return filepath.Clean(d), nil
}

// partDir is a part's image directory: its own (from --part, after the
// part's host and pid), else -D's (dir); one of them is needed.
func partDir(verb, part, own, dir string) (string, error) {
	switch {
	case own != "" && !filepath.IsAbs(own):
		return "", usageError{fmt.Errorf("job %s: --part %q: the part's image directory must be absolute", verb, part)}
	case own != "":
		return filepath.Clean(own), nil
	case dir == "":
		return "", usageError{fmt.Errorf("job %s: --part %q names no image directory, and there is no -D DIR (the same path on every host)", verb, part)}
	}
	return dir, nil
}

func jobCheckpointCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "checkpoint",
		Usage:     "checkpoint every part of a job at one cut",
		ArgsUsage: "--part HOST=PID[:DIR] --part HOST=PID[:DIR] ... [-D DIR]",
		Flags: append(append(jobHostFlags(),
			&ucli.BoolFlag{Name: "leave-running", Usage: "the parts run on after the checkpoint"},
			&ucli.DurationFlag{Name: "drain-timeout", Value: 10 * time.Second, Usage: "how long the frozen parts wait for the job's connections to have nothing in flight"},
			&ucli.DurationFlag{Name: "quiesce-timeout", Value: 30 * time.Second, Usage: "how long every GPU process has to reach the job's point (its count of NCCL collectives) and drain, before anything freezes"}),
			jobAgentFlags()...),
		Action: func(c *ucli.Context) error {
			dir, err := jobDir(c)
			if err != nil {
				return err
			}
			var hosts, pids, dirs []string
			for _, p := range c.StringSlice("part") {
				h, rest, ok := strings.Cut(p, "=")
				if !ok || h == "" {
					return usageError{fmt.Errorf("job checkpoint: --part %q: HOST=PID or HOST=PID:DIR", p)}
				}
				pid, own, _ := strings.Cut(rest, ":")
				d, err := partDir("checkpoint", p, own, dir)
				if err != nil {
					return err
				}
				hosts, pids, dirs = append(hosts, h), append(pids, pid), append(dirs, d)
			}
			if len(hosts) == 0 {
				return usageError{fmt.Errorf("usage: gpucr job checkpoint --part HOST=PID [--part HOST=PID ...] -D DIR")}
			}
			targets, err := jobTargets(c, hosts)
			if err != nil {
				return err
			}
			o := checkpoint.JobCheckpointOptions{LeaveRunning: c.Bool("leave-running"), DrainTimeout: c.Duration("drain-timeout"),
				QuiesceTimeout: c.Duration("quiesce-timeout"),
				AgentArgs:      jobAgentArgs(c), StepTimeout: c.Duration("step-timeout")}
			for i, t := range targets {
				pid, err := parsePid("job checkpoint", pids[i])
				if err != nil {
					return err
				}
				o.Parts = append(o.Parts, checkpoint.JobPartSpec{Target: t, Pid: pid, Dir: dirs[i]})
			}
			ctx, stop := interruptible(c.Context)
			defer stop()
			o.Events = newEventPrinter(c.App.Writer, c.App.ErrWriter, c.Bool("json")).handle
			res, err := checkpoint.CheckpointJob(ctx, o)
			if err != nil {
				return err
			}
			line := fmt.Sprintf("job checkpoint %s: %d parts, each in its image directory on its host; every part was frozen %.3f s before the commit",
				res.ID, len(res.Parts), res.FrozenSeconds)
			for _, p := range res.Parts {
				line += fmt.Sprintf("\n  %s: pid %d in %s, %d connections to other parts", p.Host, p.Pid, p.Dir, len(p.Conns))
				for _, n := range p.Notes {
					line += "\n    " + n
				}
			}
			return report(c, res, line, nil)
		},
	}
}

func jobRestoreCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "restore",
		Usage:     "restore every part of a job checkpoint together",
		ArgsUsage: "--part HOST[=DIR] --part HOST[=DIR] ... [-D DIR]",
		Flags:     append(jobHostFlags(), jobAgentFlags()...),
		Action: func(c *ucli.Context) error {
			dir, err := jobDir(c)
			if err != nil {
				return err
			}
			var hosts, dirs []string
			for _, p := range c.StringSlice("part") {
				h, own, _ := strings.Cut(p, "=")
				d, err := partDir("restore", p, own, dir)
				if err != nil {
					return err
				}
				hosts, dirs = append(hosts, h), append(dirs, d)
			}
			if len(hosts) == 0 {
				return usageError{fmt.Errorf("usage: gpucr job restore --part HOST[=DIR] [--part HOST[=DIR] ...] [-D DIR]")}
			}
			targets, err := jobTargets(c, hosts)
			if err != nil {
				return err
			}
			o := checkpoint.JobRestoreOptions{AgentArgs: jobAgentArgs(c), StepTimeout: c.Duration("step-timeout")}
			for i, t := range targets {
				o.Parts = append(o.Parts, checkpoint.JobRestorePart{Target: t, Dir: dirs[i]})
			}
			ctx, stop := interruptible(c.Context)
			defer stop()
			o.Events = newEventPrinter(c.App.Writer, c.App.ErrWriter, c.Bool("json")).handle
			res, err := checkpoint.RestoreJob(ctx, o)
			if err != nil {
				return err
			}
			line := fmt.Sprintf("job restore %s: %d parts run; held %.3f s at the barrier", res.ID, len(res.Parts), res.HeldSeconds)
			return report(c, res, line, nil)
		},
	}
}

// jobAgentArgs are the agent flags given on this command line, as given.
func jobAgentArgs(c *ucli.Context) []string {
	var out []string
	for _, f := range jobAgentFlags() {
		name := f.Names()[0]
		if !c.IsSet(name) {
			continue
		}
		switch f.(type) {
		case *ucli.BoolFlag:
			out = append(out, fmt.Sprintf("--%s=%t", name, c.Bool(name)))
		case *ucli.StringSliceFlag:
			for _, v := range c.StringSlice(name) {
				out = append(out, "--"+name, v)
			}
		default:
			out = append(out, "--"+name, fmt.Sprint(c.Value(name)))
		}
	}
	return out
}

// jobAgentCommand is the hidden `gpucr job-agent`: a part's agent, speaking
// line-delimited JSON on stdin and stdout (checkpoint.ServeJobAgent).
func jobAgentCommand() *ucli.Command {
	return &ucli.Command{
		Name:   "job-agent",
		Hidden: true,
		Usage:  "a job checkpoint's agent on this host (run by `gpucr job` over ssh)",
		Flags:  append([]ucli.Flag{socketFlag(), pluginDirFlag()}, jobAgentFlags()...),
		Action: func(c *ucli.Context) error {
			// The coordinator's session may end at any time: a write to it
			// then fails (EPIPE), rather than killing this process while
			// it holds a part stopped, which it then gives back.
			signal.Ignore(syscall.SIGPIPE, syscall.SIGHUP)
			injected, err := fault.Parse(os.Getenv("GPUCR_FAULT"), fault.Job)
			if err != nil {
				return usageError{err}
			}
			criu, env, err := criuSetup(c)
			if err != nil {
				return err
			}
			return checkpoint.ServeJobAgent(c.Context, os.Stdin, os.Stdout, checkpoint.JobAgentOptions{CRIU: criu, Env: env, Fault: injected,
				Events: func(ev checkpoint.Event) { fmt.Fprintf(os.Stderr, "gpucr job-agent: %s\n", ev.Text) }})
		},
	}
}
