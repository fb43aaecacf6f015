// Command gpucr checkpoints and restores processes that use NVIDIA GPUs.
package main

import (
	"os"

	"github.com/gpucr/gpucr/helper/cli"
)

func main() {
	os.Exit(cli.Run(os.Args, os.Stdout, os.Stderr))
}
