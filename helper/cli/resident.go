package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	ucli "github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// residentTimeout bounds a load of an image into device memory (storage
// that hangs must not hold the command forever).
const residentTimeout = 30 * time.Minute

// imageLoadCommand is `gpucr image load DIR`: the image's GPU data kept in
// the helper's device memory (LoadResident); imageUnloadCommand gives it up.
func imageLoadCommand(jsonFlag ucli.Flag) *ucli.Command {
	return residentCommand("load", "keep an image's GPU data in the helper's device memory: its restores copy it on the GPU instead of reading storage",
		jsonFlag, true)
}

func imageUnloadCommand(jsonFlag ucli.Flag) *ucli.Command {
	return residentCommand("unload", "give up an image's resident GPU data (gpucr image load)", jsonFlag, false)
}

func residentCommand(name, usage string, jsonFlag ucli.Flag, load bool) *ucli.Command {
	flags := []ucli.Flag{jsonFlag, socketFlag()}
	if load {
		flags = append(flags, &ucli.BoolFlag{Name: "template", Usage: "served mode: also make a template of each served process the image was checkpointed with --template: a worker that holds its GPU objects before the restore, which the restore attaches to"})
	}
	return &ucli.Command{
		Name:      name,
		Usage:     usage,
		ArgsUsage: "DIR",
		Flags:     flags,
		Action:    func(c *ucli.Context) error { return residentCall(c, load) },
	}
}

// residentReport is what load and unload print with --json.
type residentReport struct {
	ImagesDir string  `json:"images_dir"`
	Resident  bool    `json:"resident"`
	Bytes     uint64  `json:"bytes,omitempty"`
	Buffers   uint32  `json:"buffers,omitempty"`
	Templates uint32  `json:"templates,omitempty"`
	Seconds   float64 `json:"seconds"`
}

func residentCall(c *ucli.Context, load bool) error {
	pos, err := commandArgs(c, 1, 1)
	if err != nil {
		return err
	}
	dir, err := filepath.Abs(pos[0])
	if err != nil {
		return err
	}
	// The directory goes to the helper as a descriptor opened here: it
	// reads the image as what this caller may open.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("image directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	ctx, cancel := context.WithTimeout(c.Context, residentTimeout)
	defer cancel()
	conn, err := client.Dial(ctx, client.SocketPath(c.String("socket")), helperpb.Role_ROLE_CLI, "gpucr")
	if err != nil {
		return err
	}
	defer conn.Close()
	req := &helperpb.Request{Body: &helperpb.Request_UnloadResident{UnloadResident: &helperpb.UnloadResident{ImageDir: dir}}}
	what := "unload"
	if load {
		req = &helperpb.Request{Body: &helperpb.Request_LoadResident{LoadResident: &helperpb.LoadResident{ImageDir: dir,
			Template: c.Bool("template")}}}
		what = "load"
	}
	t := time.Now()
	if _, _, err := conn.CallFDs(ctx, req, []int{fd}); err != nil {
		return fmt.Errorf("image %s %s: %w", what, dir, err)
	}
	rep := residentReport{ImagesDir: dir, Resident: load, Seconds: time.Since(t).Seconds()}
	line := fmt.Sprintf("%s: GPU data given up", dir)
	if load {
		if st, err := conn.Status(ctx); err == nil {
			for _, r := range st.ResidentImages {
				if r.ImageDir == dir {
					rep.Bytes, rep.Buffers, rep.Templates = r.Bytes, r.Buffers, r.Templates
				}
			}
		}
		line = fmt.Sprintf("%s: GPU data resident, %s in %d buffers (%.3f s)", dir, humanBytes(rep.Bytes), rep.Buffers, rep.Seconds)
		if rep.Templates > 0 {
			line += fmt.Sprintf("; %d templates wait for its restore", rep.Templates)
		}
	}
	return report(c, rep, line, nil)
}
