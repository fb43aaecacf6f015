package cli

import (
	"os"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/served"
)

// servedWorkerCommand is a served-mode worker, which only the helper starts
// (its pool, helper/served), with its control socket at served.ControlFD.
func servedWorkerCommand() *ucli.Command {
	return &ucli.Command{
		Name:   served.WorkerCommand,
		Hidden: true,
		Usage:  "a served-mode worker (started by the helper)",
		Flags: []ucli.Flag{
			&ucli.IntFlag{Name: "device", Usage: "the device's ordinal"},
			&ucli.StringFlag{Name: "libcuda", Usage: "the driver library (default libcuda.so.1)"},
			&ucli.StringFlag{Name: "cublas", Usage: "a directory whose cuBLAS and cuBLASLt to load ahead"},
		},
		Action: func(c *ucli.Context) error {
			return served.RunWorker(c.Int("device"), c.String("libcuda"), c.String("cublas"),
				os.NewFile(served.ControlFD, "served-control"))
		},
	}
}
