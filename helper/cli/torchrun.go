package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/torchrun"
)

// stopGrace is how long ranks asked to stop (a rank failed, or the launcher
// was sent SIGINT or SIGTERM) have before they are killed: torchrun's 30 s.
const stopGrace = 30 * time.Second

const torchrunDescription = "a drop-in for torchrun that CRIU can checkpoint: it takes torchrun's " +
	"options and environment (PET_*), and starts the ranks itself, each under the interposer as " +
	"`gpucr run` starts a program, with the environment torchrun gives its workers (RANK, " +
	"LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...). Rank 0 hosts the store (env://, " +
	"USE_LIBUV=0). It stays the root of the tree: `gpucr checkpoint` of its pid dumps the whole " +
	"job. It passes SIGINT, SIGTERM, SIGHUP and SIGQUIT on to the ranks; when one rank fails it " +
	"stops the others and exits with that rank's code. torchrun's own agent cannot be dumped: its " +
	"TCPStore servers hold io_uring instances and it initialises CUDA. Options: --standalone, " +
	"--nproc-per-node N|gpu|cpu|auto, --nnodes N (no elastic MIN:MAX), --node-rank, " +
	"--master-addr, --master-port, --rdzv-backend static|c10d, --rdzv-endpoint HOST[:PORT], " +
	"--rdzv-id, --rdzv-conf (ignored), --max-restarts 0 (gpucr restores from a checkpoint " +
	"instead of restarting), --monitor-interval, --start-method, --role, --log-dir (nothing is " +
	"written there), --redirects 0, --tee 0, --local-addr, --run-path, -m/--module, " +
	"--no-python; dashes or underscores. Scripts and modules run as `python3 -u` (PATH's " +
	"python3). --socket PATH, before torchrun's options, names the helper's socket"

func torchrunCommand() *ucli.Command {
	return &ucli.Command{
		Name:        "torchrun",
		Usage:       "run a PyTorch job as torchrun does, with every rank under the interposer, in a tree gpucr can checkpoint",
		ArgsUsage:   "[--socket PATH] [TORCHRUN OPTIONS] SCRIPT [ARGS...]",
		Description: torchrunDescription,
		// torchrun's options are its own (both spellings, PET_ defaults):
		// package torchrun reads them.
		SkipFlagParsing: true,
		Action: func(c *ucli.Context) error {
			args := c.Args().Slice()
			if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
				return ucli.ShowCommandHelp(c.Lineage()[1], "torchrun") // the app's context knows the command
			}
			socket, args, err := socketArg(args)
			if err != nil {
				return err
			}
			return runTorchrun(args, client.SocketPath(socket), c.App.ErrWriter)
		},
	}
}

// socketArg takes gpucr's --socket PATH off the front of the arguments
// (torchrun has no such option).
func socketArg(args []string) (string, []string, error) {
	if len(args) == 0 {
		return "", args, nil
	}
	if v, ok := strings.CutPrefix(args[0], "--socket="); ok {
		return v, args[1:], nil
	}
	if args[0] == "--socket" {
		if len(args) < 2 {
			return "", nil, usageError{errors.New("torchrun: --socket needs a path")}
		}
		return args[1], args[2:], nil
	}
	return "", args, nil
}

// runTorchrun reads torchrun's command line, starts this node's ranks and
// waits for them; its error carries the exit status (exitError).
func runTorchrun(args []string, socket string, stderr io.Writer) error {
	opts, err := torchrun.Parse(args, os.Getenv)
	if err == nil {
		var plan *torchrun.Plan
		if plan, err = torchrun.NewPlan(opts, torchrun.ThisHost()); err == nil {
			return superviseRanks(plan, socket, stderr)
		}
	}
	var ue torchrun.UsageError
	if errors.As(err, &ue) {
		return usageError{fmt.Errorf("torchrun: %w", err)}
	}
	return fmt.Errorf("torchrun: %w", err)
}

// superviseRanks starts every rank of plan under the interposer, as `gpucr
// run` starts a program (prepareRun), and waits for them.
func superviseRanks(plan *torchrun.Plan, socket string, stderr io.Writer) error {
	for _, n := range plan.Notes {
		fmt.Fprintf(stderr, "gpucr torchrun: note: %s\n", n)
	}
	var procs []torchrun.Proc
	for _, r := range plan.Ranks() {
		path, env, err := prepareRun(plan.Argv[0], socket, plan.Env(os.Environ(), r))
		if err != nil {
			return fmt.Errorf("torchrun: rank %d: %w", r.Rank, err)
		}
		procs = append(procs, torchrun.Proc{Rank: r, Path: path, Argv: plan.Argv, Env: env})
	}
	fmt.Fprintf(stderr, "gpucr torchrun: %d ranks of %d (node %d of %d), master %s:%d, run id %s\n",
		plan.Nproc, plan.WorldSize(), plan.NodeRank, plan.Nnodes, plan.MasterAddr, plan.MasterPort, plan.RunID)
	out, err := torchrun.Supervise(procs, stderr, stopGrace)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return execFailed(plan.Argv[0], err)
		}
		return fmt.Errorf("torchrun: %w", err)
	}
	switch {
	case out.Code == 0:
		return nil
	case out.Signal != 0:
		return exitError{out.Code, fmt.Errorf("torchrun: stopped by %v", out.Signal)}
	default:
		return exitError{out.Code, fmt.Errorf("torchrun: rank %d failed (exit status %d)", out.Failed.Rank, out.Code)}
	}
}
