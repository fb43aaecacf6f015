package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"

	ucli "github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/helper/daemon"
	"github.com/gpucr/gpucr/helper/inventory"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

func socketFlag() *ucli.StringFlag {
	return &ucli.StringFlag{Name: "socket", Usage: "the helper's unix socket (default $GPUCR_SOCKET, else " + client.DefaultSocket + ")"}
}

// helperCommand is `gpucr helper`: the daemon (package daemon).
func helperCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "helper",
		Usage: "run the helper daemon that owns the GPU memory of gpucr-run applications (until SIGTERM/SIGINT)",
		Flags: []ucli.Flag{
			socketFlag(),
			&ucli.StringFlag{Name: "socket-mode", Value: "0600", Usage: "permissions of the socket (octal)"},
			&ucli.StringFlag{Name: "socket-group", Usage: "group of the socket (name or gid)"},
			&ucli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&ucli.StringFlag{Name: "log-format", Value: "json", Usage: "json or console"},
		},
		Action: runHelper,
	}
}

func helperLogger(level, format string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, usageError{fmt.Errorf("--log-level: %v", err)}
	}
	cfg := zap.NewProductionConfig()
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	switch format {
	case "json":
		cfg.EncoderConfig.TimeKey = "time"
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	case "console":
		cfg.Encoding = "console"
		cfg.EncoderConfig = zap.NewDevelopmentEncoderConfig()
	default:
		return nil, usageError{fmt.Errorf("--log-format: %q is neither json nor console", format)}
	}
	return cfg.Build()
}

func runHelper(c *ucli.Context) error {
	if c.Args().Present() {
		return usageError{fmt.Errorf("helper: unexpected arguments %q", c.Args().Slice())}
	}
	mode, err := strconv.ParseUint(c.String("socket-mode"), 8, 32)
	if err != nil || mode > 0o777 {
		return usageError{fmt.Errorf("--socket-mode: %q is not an octal permission", c.String("socket-mode"))}
	}
	log, err := helperLogger(c.String("log-level"), c.String("log-format"))
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	lib := cuda.LibraryPath()
	drv, loadErr := cuda.Load(lib)
	inv := inventory.Collect(drv, loadErr)
	cfg := daemon.Config{
		Socket:      client.SocketPath(c.String("socket")),
		SocketMode:  os.FileMode(mode),
		SocketGroup: c.String("socket-group"),
		Log:         log,
		Version:     Version,
		// Fault injection for failure tests: GPUCR_FAULT=STEP makes that
		// checkpoint step fail (see daemon.Config.Fault).
		Fault:  os.Getenv("GPUCR_FAULT"),
		Driver: driverInfo(lib, drv),
	}
	if loadErr != nil {
		cfg.Unavailable = fmt.Sprintf("driver %s: %v", lib, loadErr)
		log.Error("no usable GPU driver; serving status only", zap.String("library", lib), zap.Error(loadErr))
	} else {
		defer drv.Close()
		cfg.Devices = daemon.CUDADevices(drv)
		// The copy engines' lanes (a thread, a stream and 4 MiB of pinned
		// staging each; GOMAXPROCS per device) start now rather than in
		// the first checkpoint or restore.
		for _, d := range drv.Devices {
			go func() {
				if err := d.WarmLanes(runtime.GOMAXPROCS(0), image.DefaultChunkSize); err != nil {
					log.Warn("starting copy lanes", zap.Int("device", d.Ordinal), zap.Error(err))
				}
			}()
		}
	}
	for _, d := range inv.Devices {
		log.Info("device", zap.Int("ordinal", d.Ordinal), zap.String("uuid", d.UUID), zap.String("name", d.Name),
			zap.Uint64("total_memory", d.TotalMemory), zap.Uint64("granularity", d.Granularity))
	}
	log.Info("inventory", zap.String("driver_version", inv.DriverVersion), zap.String("source", inv.Source),
		zap.Strings("notes", inv.Notes))

	srv := daemon.New(cfg)
	if err := srv.Listen(); err != nil {
		return fmt.Errorf("helper: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = srv.Serve(ctx)
	log.Info("helper exiting")
	return err
}

// driverInfo describes the driver library lib for Status: the loaded
// driver's version, else what a look at the library alone finds (a driver
// without the checkpoint API does not load).
func driverInfo(lib string, drv *cuda.Driver) *helperpb.DriverInfo {
	d := &helperpb.DriverInfo{Library: lib}
	p, err := cuda.Probe(lib)
	if err != nil {
		d.Error = err.Error()
		return d
	}
	d.Path, d.Version, d.CheckpointApiMissing = p.Path, int32(p.Version), p.MissingCheckpointAPI
	d.CheckpointApi = len(p.MissingCheckpointAPI) == 0
	if drv != nil {
		d.Version = int32(drv.Version)
	}
	return d
}
