package cli

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

var clientOps = map[string]helperpb.ClientOp_Op{
	"quiesce":  helperpb.ClientOp_OP_QUIESCE,
	"drain":    helperpb.ClientOp_OP_DRAIN,
	"drop":     helperpb.ClientOp_OP_DROP,
	"reimport": helperpb.ClientOp_OP_REIMPORT,
	"resume":   helperpb.ClientOp_OP_RESUME,
	"snapshot": helperpb.ClientOp_OP_SNAPSHOT,
	"stats":    helperpb.ClientOp_OP_STATS,
}

// clientCommand is `gpucr client PID OP`: a debugging and operations tool
// that runs one step of the quiesce cycle on one application through the
// helper. Checkpoints do not need it (the CRIU plugin drives the cycle);
// running drop by hand leaves the application stopped until reimport and
// resume.
func clientCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "client",
		Usage:     "debug/ops: run one control operation on an application (quiesce|drain|drop|reimport|resume|snapshot|stats)",
		ArgsUsage: "PID quiesce|drain|drop|reimport|resume|snapshot|stats",
		Flags: []ucli.Flag{socketFlag(), &ucli.BoolFlag{Name: "json", Usage: "machine-readable output"},
			&ucli.DurationFlag{Name: "timeout", Usage: "the operation's timeout (quiesce: passed to the application; 0: defaults)"}},
		Action: func(c *ucli.Context) error {
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) != 2 {
				return usageError{fmt.Errorf("usage: gpucr client [flags] %s", c.Command.ArgsUsage)}
			}
			pid, err := parsePid("client", pos[0])
			if err != nil {
				return err
			}
			op, ok := clientOps[strings.ToLower(pos[1])]
			if !ok {
				return usageError{fmt.Errorf("client: unknown operation %q", pos[1])}
			}
			timeout := c.Duration("timeout")
			socket := client.SocketPath(c.String("socket"))
			wait := timeout + 40*time.Second
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			conn, err := client.Dial(ctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
			if err != nil {
				return err
			}
			defer conn.Close()
			r, err := conn.ClientOp(ctx, int64(pid), op, timeout)
			if err != nil {
				return fmt.Errorf("client %d %s: %w", pid, pos[1], err)
			}
			var m proto.Message = r
			switch {
			case r.Table != nil:
				m = r.Table
			case r.Stats != nil:
				m = r.Stats
			}
			if c.Bool("json") {
				b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Multiline: true}.Marshal(m)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
				return err
			}
			if m == proto.Message(r) {
				_, err = fmt.Fprintf(c.App.Writer, "%s: ok\n", pos[1])
				return err
			}
			b, _ := protojson.MarshalOptions{UseProtoNames: true, Multiline: true}.Marshal(m)
			_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
			return err
		},
	}
}

// flagsAnywhere applies the command's flags wherever they stand among its
// arguments and returns the others: the documented form puts flags after the
// arguments (`gpucr client 42 stats --json --timeout 5s`), where urfave/cli no
// longer reads them. An argument like -5 is not a flag (a negative number).
func flagsAnywhere(c *ucli.Context) ([]string, error) {
	var pos []string
	args := c.Args().Slice()
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9') {
			pos = append(pos, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "h" || name == "help" {
			if l := c.Lineage(); len(l) > 1 {
				_ = ucli.ShowCommandHelp(l[1], c.Command.Name)
			}
			return nil, errHelpShown
		}
		known := false
		for _, f := range c.Command.Flags {
			for _, n := range f.Names() {
				if !known && n == name {
					// Set the primary name: c.Set on an alias does not reach it.
					known, name = true, f.Names()[0]
				}
			}
		}
		if !known {
			return nil, usageError{noVerboseFlag(fmt.Errorf("%s: flag provided but not defined: %s", commandName(c), a))}
		}
		if !hasVal {
			if isBoolFlag(c.Command, name) {
				val = "true"
			} else if i+1 < len(args) {
				i++
				val = args[i]
			} else {
				return nil, usageError{fmt.Errorf("%s: flag needs an argument: %s", commandName(c), a)}
			}
		}
		if err := c.Set(name, val); err != nil {
			return nil, usageError{fmt.Errorf("%s: invalid value %q for flag %s", commandName(c), val, a)}
		}
	}
	return pos, nil
}

// commandName is the command c runs as the user typed it, without
// "gpucr": "image diff", not "diff" (Command.FullName knows no parent
// command until urfave's help has run).
func commandName(c *ucli.Context) string {
	var names []string
	for _, l := range c.Lineage() {
		if l.Command != nil && l.Command.Name != "" && (l.App == nil || l.Command.Name != l.App.Name) {
			names = append([]string{l.Command.Name}, names...)
		}
	}
	if len(names) == 0 {
		return c.Command.FullName()
	}
	return strings.Join(slices.Compact(names), " ")
}

// parsePid reads a process id argument of command cmd.
func parsePid(cmd, arg string) (proc.Pid, error) {
	pid, err := strconv.ParseInt(arg, 10, 32)
	if err != nil || pid <= 0 {
		return 0, usageError{fmt.Errorf("%s: %q is not a pid", cmd, arg)}
	}
	return proc.Pid(pid), nil
}
