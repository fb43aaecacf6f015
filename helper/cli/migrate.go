package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/checkpoint"
)

// migrateCommand is `gpucr migrate PID --to HOST` (checkpoint.Migrate with
// an SSHTarget).
func migrateCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "migrate",
		Usage:     "move a running process tree to another machine (live migration over ssh)",
		ArgsUsage: "PID",
		Description: "The tree is dumped (CRIU with gpucr's plugin) and left stopped; the image goes to HOST over ssh, to its\n" +
			"`gpucr image receive` (or, with --shared, is read there from the same path); gpucr restore runs there, through that\n" +
			"machine's helper; then the source is killed. If anything fails before the target runs, the source is continued with\n" +
			"its GPU, and the target's copy is removed (`gpucr image discard`). Only this user's directories and regular files of\n" +
			"the image directory are sent. The target's gpucr must have `gpucr image receive` (`gpucr version --json`).",
		Flags: append([]ucli.Flag{socketFlag(),
			&ucli.StringFlag{Name: "to", Usage: "the target, [user@]host as ssh takes it"},
			&ucli.StringFlag{Name: "images-dir", Aliases: []string{"D"}, Usage: "local image directory (new or empty; default a new one under /var/tmp, removed once the target runs)"},
			&ucli.StringFlag{Name: "target-dir", Usage: "image directory at the target, missing or empty, never a symlink: made there anew, 0700 (default: the local path)"},
			&ucli.BoolFlag{Name: "shared", Usage: "the image directory is on a file system the target sees at the same path: nothing is sent"},
			&ucli.StringFlag{Name: "ssh", Value: "ssh", Usage: "the command that runs a command line on the target, split at blanks (ssh -p 2222 -i KEY)"},
			&ucli.StringFlag{Name: "target-gpucr", Value: "gpucr", Usage: "gpucr at the target, split at blanks (env GPUCR_SOCKET=/run/x.sock /opt/gpucr/bin/gpucr)"},
			preCopyFlag(),
			&ucli.BoolFlag{Name: "keep-image", Usage: "keep the local image after a migration that succeeded"},
			&ucli.BoolFlag{Name: "force", Usage: "replace an image the local directory -D already holds"},
			shellJobFlag(),
			pluginDirFlag(), criuTimeoutFlag(), deviceMapFlag(), onDemandFlag(),
			&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}}, criuOptionFlags()...),
		Action: func(c *ucli.Context) error {
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) != 1 || c.String("to") == "" {
				return usageError{fmt.Errorf("usage: gpucr migrate PID --to HOST [-D DIR] [--shared]")}
			}
			pid, err := parsePid("migrate", pos[0])
			if err != nil {
				return err
			}
			if _, err := joinDeviceMap(c.StringSlice("device-map")); err != nil {
				return usageError{err} // the target's restore takes the flags as they are
			}
			ssh, gpucr := strings.Fields(c.String("ssh")), strings.Fields(c.String("target-gpucr"))
			if len(ssh) == 0 || len(gpucr) == 0 {
				return usageError{fmt.Errorf("migrate: --ssh and --target-gpucr must name a command")}
			}
			dir, made := c.String("images-dir"), false
			if dir == "" {
				if c.Bool("shared") {
					return usageError{fmt.Errorf("migrate: --shared needs -D DIR on the shared file system")}
				}
				if dir, err = os.MkdirTemp("/var/tmp", "gpucr-migrate-"+pid.String()+"-"); err != nil {
					return fmt.Errorf("a local image directory: %w", err)
				}
				made = true
			}
			if dir, err = filepath.Abs(dir); err != nil {
				return err
			}
			criu, env, err := criuSetup(c)
			if err != nil {
				return err
			}
			target := &checkpoint.SSHTarget{SSH: ssh, Host: c.String("to"), Gpucr: gpucr, Dir: c.String("target-dir"),
				Shared: c.Bool("shared"), RestoreArgs: restoreArgsOf(c), TempDir: env.TempDir}
			ctx, stop := interruptible(c.Context)
			defer stop()
			events := newEventPrinter(c.App.Writer, c.App.ErrWriter, c.Bool("json"))
			res, err := checkpoint.Migrate(ctx, checkpoint.MigrateOptions{Pid: pid, Dir: dir, Force: c.Bool("force"), Target: target,
				PreCopy: checkpoint.PreCopy{Rounds: c.Int("pre-copy")}, CRIU: criu, Env: env, Events: events.handle})
			if err != nil {
				if made && !isMigrateError(err) {
					_ = os.RemoveAll(dir) // nothing was dumped into it
				}
				return err
			}
			if made && !c.Bool("keep-image") {
				if err := os.RemoveAll(dir); err != nil {
					fmt.Fprintf(c.App.ErrWriter, "gpucr: warning: the local image %s could not be removed: %v\n", dir, err)
				}
			}
			line := fmt.Sprintf("migrate %d: runs at %s as pid %d; downtime %.3f s (dump %.3f s, transfer %.3f s of %s, restore %.3f s)",
				pid, res.Target, res.TargetPid, res.DowntimeSeconds, res.DumpSeconds, res.TransferSeconds,
				humanBytes(uint64(res.TransferBytes)), res.RestoreSeconds)
			line += preCopyText(res.Dump.PreCopy)
			if len(res.Dump.AutoOptions) > 0 {
				line += "\n  CRIU options chosen by gpucr for what the tree holds: " + autoOptionsText(res.Dump.AutoOptions) +
					" (the target's restore repeats them from the image's dump record)"
			}
			if res.PreCopyBytesSent > 0 {
				line += fmt.Sprintf("\n  the pre-copy rounds went to the target before the stop (%s)", humanBytes(uint64(res.PreCopyBytesSent)))
			}
			return report(c, res, line, nil)
		},
	}
}

func isMigrateError(err error) bool {
	_, ok := err.(*checkpoint.MigrateError)
	return ok
}

// restoreArgsOf are the flags the target's `gpucr restore` gets: those of
// this command that a restore takes too, as they were given.
func restoreArgsOf(c *ucli.Context) []string {
	var out []string
	for _, f := range append([]ucli.Flag{shellJobFlag(), criuTimeoutFlag(), deviceMapFlag(), onDemandFlag()}, criuOptionFlags()...) {
		name := f.Names()[0]
		if !c.IsSet(name) {
			continue
		}
		switch f.(type) {
		case *ucli.BoolFlag:
			out = append(out, "--"+name+"="+strconv.FormatBool(c.Bool(name)))
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
