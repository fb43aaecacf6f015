package cli

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/devicemap"
	"github.com/gpucr/gpucr/image/level"
)

// restoreCommand is `gpucr restore -D DIR` (checkpoint.Restore).
func restoreCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "restore",
		Usage: "restore a process tree from DIR (CRIU with gpucr's plugin)",
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "images-dir", Aliases: []string{"D"}, Usage: "image directory, or an image on an object store (s3://BUCKET/PATH, pulled into --pull-dir first)"},
			&ucli.StringFlag{Name: "pull-dir", Value: "/dev/shm/gpucr-pulled", Usage: "with -D s3://...: where images are pulled to (a directory per image, which the next restore of it uses)"},
			&ucli.StringFlag{Name: "endpoint", Usage: "with -D s3://...: the object store's URL (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS S3)"},
			&ucli.StringFlag{Name: "profile", Usage: "with -D s3://...: the credentials file's profile"},
			shellJobFlag(),
			pluginDirFlag(), socketFlag(), criuTimeoutFlag(),
			&ucli.BoolFlag{Name: "lazy-pages", Usage: "run the restored tree before its host memory is read back: CRIU's lazy-pages daemon serves the pages it touches first, the rest in the background (the kernel's userfaultfd; `gpucr check` says whether it has it)"},
			deviceMapFlag(),
			onDemandFlag(),
			&ucli.BoolFlag{Name: "wait-time-wait", Usage: "wait (up to a minute) for the connections closed on the image's listening TCP ports to end their TIME_WAIT, instead of ending them (they keep CRIU from binding a listener without SO_REUSEADDR)"},
			&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}}, criuOptionFlags()...),
		Action: func(c *ucli.Context) error {
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) > 0 {
				return usageError{fmt.Errorf("restore: unexpected arguments %q (usage: gpucr restore -D DIR)", pos)}
			}
			dir := c.String("images-dir")
			if dir == "" {
				return usageError{errors.New("restore: -D DIR is required")}
			}
			pulledLine := ""
			if level.IsURL(dir) {
				r, st, err := levelStore(c, dir)
				if err != nil {
					return err
				}
				base, err := filepath.Abs(c.String("pull-dir"))
				if err != nil {
					return err
				}
				local, stats, pulled, err := st.PullCached(c.Context, r, base)
				if err != nil {
					return fmt.Errorf("restore: %w", err)
				}
				pulledLine = fmt.Sprintf("restore: %s is %s (already pulled)\n", r, local)
				if pulled {
					pulledLine = fmt.Sprintf("restore: pulled %s into %s: %d files, %s, %.3f s\n", r, local, stats.Files,
						humanBytes(uint64(stats.Bytes)), stats.Seconds)
				}
				if !c.Bool("json") {
					fmt.Fprint(c.App.ErrWriter, pulledLine)
				}
				dir = local
			}
			if dir, err = filepath.Abs(dir); err != nil {
				return err
			}
			devMap, err := joinDeviceMap(c.StringSlice("device-map"))
			if err != nil {
				return usageError{err}
			}
			criu, env, err := criuSetup(c)
			if err != nil {
				return err
			}
			ctx, stop := interruptible(c.Context)
			defer stop()
			events := newEventPrinter(c.App.Writer, c.App.ErrWriter, c.Bool("json"))
			res, err := checkpoint.Restore(ctx, checkpoint.RestoreOptions{Dir: dir, CRIU: criu, Env: env, Events: events.handle,
				LazyPages: c.Bool("lazy-pages"), DeviceMap: devMap, OnDemand: c.Bool("on-demand"),
				WaitClosedPorts: c.Bool("wait-time-wait")})
			if err != nil {
				return err
			}
			line := fmt.Sprintf("restore: pid %d running again after %.3f s", res.Pid, res.Seconds)
			line += "\n  steps: " + stepsText(res.Phases)
			if res.Ready.GPUResident > 0 {
				line += fmt.Sprintf("\n  ready: first instruction %.3f s, GPU launches %.3f s, all GPU data resident %.3f s",
					res.Ready.FirstInstruction, res.Ready.GPULaunch, res.Ready.GPUResident)
			}
			if res.Ready.HostResident > 0 {
				line += fmt.Sprintf("\n  lazy pages: the tree ran after %.3f s, all its host memory was in after %.3f s",
					res.Ready.FirstInstruction, res.Ready.HostResident)
			}
			if s := res.CRIU; s != nil {
				line += fmt.Sprintf("\n  CRIU: forking %.3f s, restoring the tasks %.3f s, %d pages restored",
					s.ForkingSeconds, s.RestoreSeconds, s.PagesRestored)
			}
			for _, g := range res.GPUProcesses {
				if len(g.Phases) > 0 {
					line += fmt.Sprintf("\n  pid %d in the helper: %s", g.Pid, stepsText(g.Phases))
				}
			}
			if g := res.GPU.String(); g != "" {
				line = "  " + g + "\n" + line
			}
			return report(c, res, line, res.PluginMessages)
		},
	}
}

// onDemandFlag is --on-demand, of restore and of migrate (for the target's
// restore).
func onDemandFlag() *ucli.BoolFlag {
	return &ucli.BoolFlag{Name: "on-demand", Usage: "let the restored processes run before their GPU data is all loaded: a GPU call that may touch memory not loaded yet waits until it is (kernels whose PTX shows that they follow pointers read from memory wait for everything), what they wait for loads first, the rest behind; the command returns once all of it is in"}
}

// deviceMapFlag is --device-map, of restore and of migrate (for the
// target's restore).
func deviceMapFlag() *ucli.StringSliceFlag {
	return &ucli.StringSliceFlag{Name: "device-map", Usage: "put the image's GPUs onto other GPUs here, `OLD=NEW`[,OLD=NEW...]: each side a GPU UUID (or a unique start of one) or an ordinal (OLD as gpucr image inspect shows the image's, NEW as gpucr status shows this machine's); GPUs not named go to their own GPU where it has room, else to a free GPU of the same model"}
}

// joinDeviceMap joins the --device-map flags into one map for the helper,
// refusing what is not OLD=NEW (the helper resolves the names).
func joinDeviceMap(vals []string) (string, error) {
	m := strings.Join(vals, ",")
	if _, err := devicemap.Parse(m); err != nil {
		return "", fmt.Errorf("--%v", err)
	}
	return m, nil
}
