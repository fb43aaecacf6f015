package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
	ucli "github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// checkReport says whether this host can checkpoint and restore GPU processes.
type checkReport struct {
	CRIUVersion int    `json:"criu_version,omitempty"`
	CRIUError   string `json:"criu_error,omitempty"`
	Driver      string `json:"driver,omitempty"`
	DriverError string `json:"driver_error,omitempty"`
	Simulated   bool   `json:"simulated_driver"`
	// The helper is reported, not required: check is about the host.
	HelperSocket  string `json:"helper_socket"`
	HelperVersion string `json:"helper_version,omitempty"`
	HelperError   string `json:"helper_error,omitempty"`
	HelperNoGPU   string `json:"helper_unavailable,omitempty"`
	OK            bool   `json:"ok"`
}

// minCRIUVersion is CRIU 4.0: the first with the device plugin hooks gpucr uses.
const minCRIUVersion = 40000

func checkCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "check",
		Usage: "check that CRIU and a CUDA driver are usable here",
		Flags: []ucli.Flag{&ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}, socketFlag()},
		Action: func(c *ucli.Context) error {
			log := logger(c)
			defer func() { _ = log.Sync() }()
			r := runCheck(log)
			checkHelper(&r, client.SocketPath(c.String("socket")))
			if c.Bool("json") {
				if err := writeJSON(c.App.Writer, r); err != nil {
					return err
				}
			} else {
				printCheck(c, r)
			}
			if !r.OK {
				return fmt.Errorf("this host cannot checkpoint GPU processes (see above)")
			}
			return nil
		},
	}
}

func runCheck(log *zap.Logger) checkReport {
	var r checkReport
	v, err := criu.MakeCriu().GetCriuVersion()
	switch {
	case err != nil:
		r.CRIUError = fmt.Sprintf("cannot run criu: %v (scripts/install-criu.sh installs CRIU 4.x)", err)
	case v < minCRIUVersion:
		r.CRIUVersion = v
		r.CRIUError = fmt.Sprintf("criu %s is too old: gpucr needs 4.0 or newer (scripts/install-criu.sh)", formatCRIUVersion(v))
	default:
		r.CRIUVersion = v
	}
	log.Debug("criu", zap.Int("version", v), zap.Error(err))
	r.Driver, r.Simulated, err = findDriver()
	if err != nil {
		r.DriverError = err.Error()
	}
	r.OK = r.CRIUError == "" && r.DriverError == ""
	return r
}

func printCheck(c *ucli.Context, r checkReport) {
	w := c.App.Writer
	if r.CRIUError != "" {
		fmt.Fprintf(w, "criu:   FAIL %s\n", r.CRIUError)
	} else {
		fmt.Fprintf(w, "criu:   ok %s\n", formatCRIUVersion(r.CRIUVersion))
	}
	switch {
	case r.DriverError != "":
		fmt.Fprintf(w, "driver: FAIL %s\n", r.DriverError)
	case r.Simulated:
		fmt.Fprintf(w, "driver: ok %s (simulated driver: no GPU)\n", r.Driver)
	default:
		fmt.Fprintf(w, "driver: ok %s\n", r.Driver)
	}
	switch {
	case r.HelperError != "":
		fmt.Fprintf(w, "helper: none (%s)\n", r.HelperError)
	case r.HelperNoGPU != "":
		fmt.Fprintf(w, "helper: %s on %s answers, but has no GPU: %s\n", r.HelperVersion, r.HelperSocket, r.HelperNoGPU)
	default:
		fmt.Fprintf(w, "helper: ok %s on %s\n", r.HelperVersion, r.HelperSocket)
	}
}

// checkHelper says whether a helper answers Status on socket.
func checkHelper(r *checkReport, socket string) {
	r.HelperSocket = socket
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
	if err != nil {
		r.HelperError = err.Error()
		return
	}
	defer conn.Close()
	st, err := conn.Status(ctx)
	if err != nil {
		r.HelperError = err.Error()
		return
	}
	r.HelperVersion = st.HelperVersion
	r.HelperNoGPU = st.Unavailable
}

func formatCRIUVersion(v int) string {
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
}

// findDriver locates the libcuda.so.1 a CUDA program started now would load:
// LD_LIBRARY_PATH first, then the usual system locations. The simulated driver
// is recognised by the marker symbol file next to it.
func findDriver() (path string, simulated bool, err error) {
	var dirs []string
	if lp := os.Getenv("LD_LIBRARY_PATH"); lp != "" {
		dirs = append(dirs, strings.Split(lp, ":")...)
	}
	dirs = append(dirs, "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64")
	for _, d := range dirs {
		if d == "" {
			continue
		}
		p := filepath.Join(d, "libcuda.so.1")
		if _, err := os.Stat(p); err == nil {
			return p, isSimulatedDriver(p), nil
		}
	}
	return "", false, fmt.Errorf("no libcuda.so.1 found (no NVIDIA driver installed; for the simulated driver set LD_LIBRARY_PATH=build/sim)")
}

// isSimulatedDriver reports whether the library at p is gpucr's simulated
// driver, which embeds a recognisable marker string.
func isSimulatedDriver(p string) bool {
	b, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	return strings.Contains(string(b), simDriverMarker)
}

// simDriverMarker is a string the simulated driver library contains
// (tests/sim: the name it reports for its devices).
const simDriverMarker = "gpucr simulated GPU"
