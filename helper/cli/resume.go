package cli

import (
	"fmt"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/client"
)

// resumeCommand is `gpucr resume PID`: a process that `gpucr checkpoint
// --gpu-only` left checkpointed gets its GPU back.
func resumeCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "resume",
		Usage:     "give a process left checkpointed by `gpucr checkpoint --gpu-only` its GPU back",
		ArgsUsage: "PID",
		Flags:     []ucli.Flag{socketFlag(), &ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}},
		Action: func(c *ucli.Context) error {
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) != 1 {
				return usageError{fmt.Errorf("usage: gpucr resume PID")}
			}
			pid, err := parsePid("resume", pos[0])
			if err != nil {
				return err
			}
			r, err := checkpoint.Resume(c.Context, client.SocketPath(c.String("socket")), pid)
			if err != nil {
				return err
			}
			return reportGPU(c, r, fmt.Sprintf("resume %d", pid), pid, "")
		},
	}
}
