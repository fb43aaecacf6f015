package cli

// gpucr image push|pull|ls: images on a level that outlives the machine, an
// S3-compatible object store (image/level).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/internal/printable"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image/level"
)

func levelFlags(jsonFlag ucli.Flag) []ucli.Flag {
	return []ucli.Flag{jsonFlag,
		&ucli.StringFlag{Name: "endpoint", Usage: "the object store's URL, http(s)://HOST[:PORT] (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS S3)"},
		&ucli.StringFlag{Name: "profile", Usage: "the credentials file's profile (default: $AWS_PROFILE; the environment's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY come first)"},
		&ucli.IntFlag{Name: "jobs", Value: 8, Usage: "files moved at once"},
	}
}

func imagePushCommand(jsonFlag ucli.Flag) *ucli.Command {
	return &ucli.Command{
		Name:      "push",
		Usage:     "copy an image directory (the GPU image and CRIU's files) to an object store, s3://BUCKET/PATH; only the files the bucket lacks travel",
		ArgsUsage: "DIR s3://BUCKET/PATH",
		Flags: append(levelFlags(jsonFlag), &ucli.BoolFlag{Name: "record", Hidden: true,
			Usage: "record the push's progress where gpucr status finds drains (checkpoint --drain)"}, keepFlag()),
		Action: func(c *ucli.Context) error {
			pos, err := commandArgs(c, 2, 2)
			if err != nil {
				return err
			}
			r, st, err := levelStore(c, pos[1])
			if err != nil {
				return err
			}
			dir, err := filepath.Abs(pos[0])
			if err != nil {
				return err
			}
			if c.IsSet("keep") && c.Int("keep") < 1 {
				return usageError{fmt.Errorf("image push --keep %d: at least the newest image must stay", c.Int("keep"))}
			}
			stats, pruned, perr, err := pushImage(c.Context, c, st, r, dir, c.Bool("record"))
			if err != nil {
				return err
			}
			line := fmt.Sprintf("%s: %s", r, pushedText(stats)) + prunedText(pruned)
			if err := report(c, pushReport{Stats: stats, Pruned: pruned}, line, nil); err != nil {
				return err
			}
			return perr
		},
	}
}

func imagePullCommand(jsonFlag ucli.Flag) *ucli.Command {
	return &ucli.Command{
		Name:      "pull",
		Usage:     "copy an image from an object store into a new directory, every file checked against its hash",
		ArgsUsage: "s3://BUCKET/PATH DIR",
		Flags:     levelFlags(jsonFlag),
		Action: func(c *ucli.Context) error {
			pos, err := commandArgs(c, 2, 2)
			if err != nil {
				return err
			}
			r, st, err := levelStore(c, pos[0])
			if err != nil {
				return err
			}
			dir, err := filepath.Abs(pos[1])
			if err != nil {
				return err
			}
			stats, err := st.Pull(c.Context, r, dir)
			if err != nil {
				return err
			}
			return report(c, stats, fmt.Sprintf("%s: %d files, %s into %s, %.3f s", r, stats.Files, humanBytes(uint64(stats.Bytes)), dir,
				stats.Seconds), nil)
		},
	}
}

func imageLsCommand(jsonFlag ucli.Flag) *ucli.Command {
	return &ucli.Command{
		Name:      "ls",
		Usage:     "list the images an object store holds at or below s3://BUCKET[/PATH]",
		ArgsUsage: "s3://BUCKET[/PATH]",
		Flags:     levelFlags(jsonFlag),
		Action: func(c *ucli.Context) error {
			pos, err := commandArgs(c, 1, 1)
			if err != nil {
				return err
			}
			r, st, err := levelStore(c, pos[0])
			if err != nil {
				return err
			}
			list, err := st.List(c.Context, r)
			if err != nil {
				return err
			}
			if list == nil {
				list = []level.Listed{}
			}
			var b strings.Builder
			for i, l := range list {
				if i > 0 {
					b.WriteString("\n")
				}
				fmt.Fprintf(&b, "%s  %s", l.Written.UTC().Format("2006-01-02T15:04:05Z"), l.URL)
			}
			if len(list) == 0 {
				b.WriteString("no images at " + r.String())
			}
			return report(c, list, b.String(), nil)
		},
	}
}

// levelStore parses the URL and opens the store the flags name.
func levelStore(c *ucli.Context, u string) (level.Ref, *level.Store, error) {
	r, err := level.Parse(u)
	if err != nil {
		return r, nil, usageError{err}
	}
	st, err := level.Open(level.Options{Endpoint: c.String("endpoint"), Profile: c.String("profile"), Jobs: c.Int("jobs")})
	return r, st, err
}

// keepFlag is --keep: the series' images kept locally once a push is done.
func keepFlag() ucli.Flag {
	return &ucli.IntFlag{Name: "keep", Usage: "once the push is done, remove the local images of DIR's series (the images beside it) past the newest K, each only if a finished drain of it is on record (it is safe at a level) and no image that stays reads its chunks"}
}

// pushReport is a push's --json: its stats and, with --keep, the prune.
type pushReport struct {
	level.Stats
	Pruned []level.Pruned `json:"pruned,omitempty"`
}

// pruneAfter prunes dir's series to --keep once its push succeeded
// (pushErr nil), recording the result in rec; a prune that could not run
// is an error of its own (the push stands).
func pruneAfter(c *ucli.Context, pushErr error, dir string, rec *level.Recorder) ([]level.Pruned, error) {
	if pushErr != nil || !c.IsSet("keep") {
		return nil, nil
	}
	pruned, err := level.PruneSeries(dir, c.Int("keep"))
	if rec != nil {
		rec.SetPruned(pruned)
	}
	if err != nil {
		return nil, fmt.Errorf("the push is done, but the series beside %s was not pruned: %w", dir, err)
	}
	return pruned, nil
}

// pushImage pushes dir to r; record: its progress and end where gpucr
// status finds drains. With --keep the series is pruned once the push is
// done (pruneAfter). err is the push's (or its record's); perr the
// prune's, the push standing.
func pushImage(ctx context.Context, c *ucli.Context, st *level.Store, r level.Ref, dir string,
	record bool) (stats level.Stats, pruned []level.Pruned, perr, err error) {
	var rec *level.Recorder
	if record {
		if rec, err = level.NewRecorder(dir, r.String()); err != nil {
			return stats, nil, nil, err
		}
		st.OnProgress = rec.Progress
	}
	stats, err = st.Push(ctx, dir, r)
	pruned, perr = pruneAfter(c, err, dir, rec)
	if rec != nil {
		if rerr := rec.End(err); rerr != nil && err == nil {
			err = rerr
		}
	}
	return stats, pruned, perr, err
}

// pushedText is what a push moved, for a terminal.
func pushedText(s level.Stats) string {
	return fmt.Sprintf("%d files, %s; %s sent (%d files the bucket had), %.3f s", s.Files, humanBytes(uint64(s.Bytes)),
		humanBytes(uint64(s.Moved)), s.BlobsHad, s.Seconds)
}

// prunedText is the prune's lines for a terminal.
func prunedText(pruned []level.Pruned) string {
	var b strings.Builder
	for _, p := range pruned {
		if p.Removed {
			fmt.Fprintf(&b, "\n  pruned %s (%s freed)", printable.String(p.Dir), humanBytes(uint64(p.BytesFreed)))
		} else {
			fmt.Fprintf(&b, "\n  kept %s: %s", printable.String(p.Dir), printable.String(p.Kept))
		}
	}
	return b.String()
}

// startDrain starts `gpucr image push DIR URL --record` in a session of its
// own, its output in a log beside its record, and returns its pid; keep > 0
// prunes the series to it once the push is done (--keep).
func startDrain(dir, url string, keep int) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	base := level.DrainDir()
	if err := os.MkdirAll(base, 0o700); err != nil {
		return 0, err
	}
	logf, err := os.CreateTemp(base, "drain-*.log")
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	args := []string{"image", "push", dir, url, "--record"}
	if keep > 0 {
		args = append(args, "--keep", strconv.Itoa(keep))
	}
	cmd := exec.Command(exe, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	// Not the checkpoint's process group: a ^C to it, or its end, is not the drain's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	return pid, level.StartRecord(pid, dir, url)
}

// drainLine is a drain for a terminal: where it goes and how far it is.
func drainLine(d level.Drain) string {
	pct := 0.0
	if d.Bytes > 0 {
		pct = float64(d.BytesDone) / float64(d.Bytes)
	} else if d.State == "done" {
		pct = 1
	}
	const width = 20
	bar := strings.Repeat("#", int(pct*width)) + strings.Repeat(".", width-int(pct*width))
	s := fmt.Sprintf("  [%s] %3.0f%% %s -> %s: %s, %d/%d files, %s of %s (%s sent)", bar, pct*100, printable.String(d.Dir),
		printable.String(d.URL), d.State, d.FilesDone, d.Files, humanBytes(uint64(d.BytesDone)), humanBytes(uint64(d.Bytes)),
		humanBytes(uint64(d.BytesMoved)))
	if d.Error != "" {
		s += ": " + printable.String(d.Error)
	}
	removed := 0
	for _, p := range d.Pruned {
		if p.Removed {
			removed++
		}
	}
	if len(d.Pruned) > 0 {
		s += fmt.Sprintf("; then pruned %d older local images of its series (%d kept)", removed, len(d.Pruned)-removed)
	}
	return s
}

// drainedCheckpoint is `gpucr checkpoint --drain URL --wait`'s report: the
// checkpoint's, its push, and how long from the command's start (a
// preemption notice) until the image was safe in the store.
type drainedCheckpoint struct {
	*checkpoint.DumpResult
	Drain       level.Stats `json:"drain"`
	SafeSeconds float64     `json:"safe_seconds"`
	// Deadline (--deadline) and whether the image was safe by it.
	DeadlineSeconds float64 `json:"deadline_seconds,omitempty"`
	DeadlineMet     *bool   `json:"deadline_met,omitempty"`
	// Pruned: --keep's work on the series once the image was safe.
	Pruned []level.Pruned `json:"pruned,omitempty"`
}

// drainNow pushes the image a checkpoint just completed in dir to
// --drain's URL in the foreground, recorded where gpucr status finds
// drains, and reports both; past --deadline it says so and exits 1 (the
// image is safe all the same). A push that fails leaves the image in dir.
func drainNow(ctx context.Context, c *ucli.Context, began time.Time, pid proc.Pid, res *checkpoint.DumpResult, line, dir string) error {
	r, st, err := levelStore(c, c.String("drain"))
	if err != nil {
		return err
	}
	stats, pruned, perr, err := pushImage(ctx, c, st, r, dir, true)
	if err != nil {
		return fmt.Errorf("checkpoint %d is complete in %s, but its push to %s failed: %w", pid, dir, r, err)
	}
	out := drainedCheckpoint{DumpResult: res, Drain: stats, SafeSeconds: time.Since(began).Seconds(), Pruned: pruned}
	line += fmt.Sprintf("\n  pushed to %s: %s", r, pushedText(stats))
	line += fmt.Sprintf("\n  safe in the store %.3f s after the command started", out.SafeSeconds)
	line += prunedText(pruned)
	missed := perr
	if c.IsSet("deadline") {
		d := c.Duration("deadline")
		met := out.SafeSeconds <= d.Seconds()
		out.DeadlineSeconds, out.DeadlineMet = d.Seconds(), &met
		if met {
			line += fmt.Sprintf(": within the deadline of %s", d)
		} else {
			line += fmt.Sprintf(": PAST the deadline of %s", d)
			missed = fmt.Errorf("checkpoint %d: the image is safe at %s, but %.3f s after the command started, past the deadline of %s",
				pid, r, out.SafeSeconds, d)
		}
	}
	if err := report(c, out, line, res.PluginMessages); err != nil {
		return err
	}
	return missed
}
