package cli

import (
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/client"
)

// `gpucr check`, in the spirit of `criu check`: whether this host can
// checkpoint and restore GPU processes with gpucr, item by item.

// Check item states.
const (
	checkOK   = "ok"
	checkWarn = "warn" // works, with a drawback worth knowing
	checkFail = "fail" // gpucr cannot work so
)

// checkItem is one thing `gpucr check` looked at.
type checkItem struct {
	Name   string         `json:"name"`
	Status string         `json:"status"`
	Reason string         `json:"reason"`
	Info   map[string]any `json:"info,omitempty"` // machine-readable details
}

// checkReport is `gpucr check --json`.
type checkReport struct {
	OK    bool        `json:"ok"`
	Items []checkItem `json:"items"`
}

func (r *checkReport) add(name, status, reason string, info map[string]any) {
	r.Items = append(r.Items, checkItem{Name: name, Status: status, Reason: reason, Info: info})
}

// defaultCheckTimeout bounds each CRIU step of the check (a CRIU that hangs
// in every dump exists: Debian 13's 4.1.1 on Linux 6.18).
const defaultCheckTimeout = 30 * time.Second

func checkCommand() *ucli.Command {
	return &ucli.Command{
		Name: "check",
		Usage: "check that this host can checkpoint GPU processes: kernel, CRIU (a real dump and restore with gpucr's plugin), " +
			"the interposer, the helper and its driver, the image directory",
		Flags: []ucli.Flag{&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}, socketFlag(), pluginDirFlag(),
			&ucli.StringFlag{Name: "images-dir", Aliases: []string{"D"}, Usage: "also check this image directory's file system"},
			&ucli.DurationFlag{Name: "timeout", Value: defaultCheckTimeout, Usage: "limit for each CRIU step"}},
		Action: func(c *ucli.Context) error {
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) > 0 {
				return usageError{fmt.Errorf("check: unexpected arguments %q", pos)}
			}
			if c.Duration("timeout") <= 0 {
				return usageError{fmt.Errorf("check: --timeout must be positive")}
			}
			dir := c.String("images-dir")
			if dir != "" {
				if dir, err = filepath.Abs(dir); err != nil {
					return err
				}
			}
			criuBin, criuErr := criuBinary()
			r := runCheck(checkOptions{socket: client.SocketPath(c.String("socket")), pluginDir: c.String("plugin-dir"),
				imagesDir: dir, timeout: c.Duration("timeout"), criu: criuBin, criuErr: criuErr})
			if c.Bool("json") {
				if err := writeJSON(c.App.Writer, r); err != nil {
					return err
				}
				if !r.OK {
					return jsonDone{fmt.Errorf("this host cannot checkpoint GPU processes")}
				}
				return nil
			}
			printCheck(c, r)
			if !r.OK {
				var failed []string
				for _, it := range r.Items {
					if it.Status == checkFail {
						failed = append(failed, it.Name)
					}
				}
				return fmt.Errorf("this host cannot checkpoint GPU processes: %s failed (see above)", strings.Join(failed, ", "))
			}
			return nil
		},
	}
}

// checkOptions is what a check looks at.
type checkOptions struct {
	socket    string
	pluginDir string // --plugin-dir
	imagesDir string // "" for none
	timeout   time.Duration
	criu      string
	criuErr   error // why there is no CRIU to run (criu is "" then)
}

// runCheck checks every item.
func runCheck(o checkOptions) checkReport {
	var r checkReport
	checkKernel(&r)
	criuOK := false
	if o.criuErr != nil {
		r.add("criu", checkFail, o.criuErr.Error(), nil)
	} else {
		criuOK = checkCRIUVersion(&r, o.criu, o.timeout)
	}
	plugin, perr := findPlugin(o.pluginDir)
	checkCRIUWithPlugin(&r, o, criuOK, plugin, perr)
	if criuOK {
		checkCRIUFeatures(&r, o.criu, o.timeout)
	}
	checkInterposer(&r)
	st := checkHelper(&r, o.socket)
	if o.imagesDir != "" {
		checkImagesDir(&r, o.imagesDir, st)
	}
	r.OK = true
	for _, it := range r.Items {
		if it.Status == checkFail {
			r.OK = false
		}
	}
	return r
}

func printCheck(c *ucli.Context, r checkReport) {
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	for _, it := range r.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", it.Name, it.Status, it.Reason)
	}
	_ = tw.Flush()
}
