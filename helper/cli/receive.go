package cli

import (
	"fmt"
	"path/filepath"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/image"
)

// The target's side of `gpucr migrate` (image.Send at the source): the
// image arrives as a tar stream on stdin and is made in a directory this
// command makes itself, which it names on stdout by its identity, so that
// a later part of the image, and the removal of a failed migration's copy,
// act on that directory and no other that a path leads to by then.

// receivedJSON is the line `gpucr image receive` prints as soon as the
// directory is there, before anything is read.
type receivedJSON struct {
	Dir  string `json:"dir"`
	ID   string `json:"id"`   // DEV:INO
	Made bool   `json:"made"` // false: an empty directory of this user's, used as it was
}

func imageReceiveCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "receive",
		Usage:     "make DIR from a tar stream on stdin: a migration's image at its target (gpucr migrate runs it there)",
		ArgsUsage: "DIR",
		Description: "DIR must be missing or empty (never a symlink); an empty one that is another user's, or that others may write, is\n" +
			"replaced by a new one. The archive may hold directories and regular files only, no absolute name and no \"..\"; they are\n" +
			"made 0700 and 0600, this user's, whatever the archive says. The first line on stdout names the directory\n" +
			"({\"dir\", \"id\": \"DEV:INO\", \"made\"}), the second what was received; --into ID adds a later part to that directory.",
		Flags: []ucli.Flag{&ucli.StringFlag{Name: "into", Usage: "the identity (DEV:INO) of the directory an earlier part made"}},
		Action: func(c *ucli.Context) error {
			pos, err := commandArgs(c, 1, 1)
			if err != nil {
				return helpOK(err)
			}
			dir, err := filepath.Abs(pos[0])
			if err != nil {
				return err
			}
			var r *image.Receiver
			if into := c.String("into"); into != "" {
				id, err := image.ParseDirID(into)
				if err != nil {
					return usageError{err}
				}
				r, err = image.OpenReceiver(dir, id)
				if err != nil {
					return err
				}
			} else if r, err = image.NewReceiver(dir); err != nil {
				return err
			}
			defer r.Close()
			// Named before the stream is read: if the transfer fails, the
			// sender knows what there is to remove.
			if err := writeJSON(c.App.Writer, receivedJSON{Dir: r.Path(), ID: r.ID().String(), Made: r.Made()}); err != nil {
				return err
			}
			res, err := r.Receive(c.App.Reader)
			if err != nil {
				return err
			}
			return writeJSON(c.App.Writer, res)
		},
	}
}

func imageDiscardCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "discard",
		Usage:     "remove what `gpucr image receive` made (a failed migration's copy at its target)",
		ArgsUsage: "DIR",
		Description: "DIR must still be the very directory receive made (--id, as receive printed it), this user's alone; what it holds is\n" +
			"removed without following a symlink, and then DIR itself unless --keep-dir. A DIR that leads elsewhere is left as it is.",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "id", Usage: "the identity (DEV:INO) receive printed", Required: true},
			&ucli.BoolFlag{Name: "keep-dir", Usage: "remove what DIR holds, not DIR (receive found it empty, and used it)"},
		},
		Action: func(c *ucli.Context) error {
			pos, err := commandArgs(c, 1, 1)
			if err != nil {
				return helpOK(err)
			}
			dir, err := filepath.Abs(pos[0])
			if err != nil {
				return err
			}
			id, err := image.ParseDirID(c.String("id"))
			if err != nil {
				return usageError{err}
			}
			if err := image.RemoveReceived(dir, id, c.Bool("keep-dir")); err != nil {
				return fmt.Errorf("discard: %w", err)
			}
			return nil
		},
	}
}
