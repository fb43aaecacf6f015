package cli

// gpucr image push|pull|ls: images on a level that outlives the machine, an
// S3-compatible object store (image/level).

import (
	"fmt"
	"path/filepath"
	"strings"

	ucli "github.com/urfave/cli/v2"

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
		Flags:     levelFlags(jsonFlag),
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
			stats, err := st.Push(c.Context, dir, r)
			if err != nil {
				return err
			}
			return report(c, stats, fmt.Sprintf("%s: %d files, %s; %s sent (%d files the bucket had), %.3f s", r, stats.Files,
				humanBytes(uint64(stats.Bytes)), humanBytes(uint64(stats.Moved)), stats.BlobsHad, stats.Seconds), nil)
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
