package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unicode"

	ucli "github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/cuda"
	"github.com/gpucr/gpucr/helper/daemon"
	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/fault"
	"github.com/gpucr/gpucr/helper/inventory"
	"github.com/gpucr/gpucr/helper/served"
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
			&ucli.StringFlag{Name: "log-format", Value: "json", Usage: "json, or text (console: the same)"},
			&ucli.StringFlag{Name: "log-file", Usage: "append the log to this file (created 0640) instead of writing it to stderr"},
			&ucli.DurationFlag{Name: "frame-timeout", Value: daemon.DefaultFrameTimeout,
				Usage: "a request begun must be complete within this, else its connection is closed (idle connections stay)"},
			&ucli.IntFlag{Name: "max-connections-per-uid", Value: daemon.DefaultMaxConnsPerUID,
				Usage: "open connections of one uid (root: no limit); 0: no limit"},
			&ucli.IntFlag{Name: "max-pending-connections", Value: daemon.DefaultMaxPending,
				Usage: "connections not past Hello yet, of all uids but root (a quarter of them per uid); 0: no limit"},
			&ucli.StringFlag{Name: "max-gpu-memory-per-uid", Value: "unlimited",
				Usage: "GPU memory the helper holds for one uid's processes (root: no limit), e.g. 40G; allocations beyond it fail with out of memory"},
			&ucli.StringSliceFlag{Name: "max-gpu-memory-for", Usage: "USER=SIZE (user name or uid; SIZE or unlimited): that uid's limit instead, root too (repeatable)"},
			&ucli.IntFlag{Name: "max-exports-per-uid", Value: daemon.DefaultExportsPerUID,
				Usage: "allocations of one uid the helper keeps an export of (a descriptor each; root: no limit); 0: no limit"},
			&ucli.StringFlag{Name: "module-analysis-memory", Value: "256M",
				Usage: "bytes of module images (and the PTX they hold compressed) the helper analyses at once, for all users but root; an analysis waits a moment for room, then is refused (its kernels count as writing everything they point into)"},
			&ucli.StringFlag{Name: "module-analysis-memory-per-uid", Value: "128M",
				Usage: "the same for one uid: an analysis past it is refused at once"},
			&ucli.StringFlag{Name: "alloc-pool", Value: "0",
				Usage: "GPU memory per device the helper may hold in allocations made ahead of time for sizes processes keep asking for (0: none)"},
			&ucli.StringFlag{Name: "snapshot-reserve", Value: "2G",
				Usage: "GPU memory per device a concurrent checkpoint leaves free for the process running on (its snapshot takes what is free beyond; buffers that do not fit go to a copy-on-write window, or are copied while the process waits with --concurrent-mode snapshot)"},
			&ucli.StringFlag{Name: "resident-memory", Value: "0",
				Usage: "GPU memory (a `SIZE` like 16G) the helper may hold in all for resident images (gpucr image load DIR: an image's GPU data kept on the device, so that its restores copy it there instead of reading storage; given up when a process needs the memory); 0: none"},
			&ucli.StringFlag{Name: "concurrent-mode", Value: "auto",
				Usage: "how a concurrent checkpoint keeps each buffer while the process runs on: auto (a snapshot in spare GPU memory where it fits, a copy-on-write window for the rest), snapshot (the rest is copied while the process waits), copy-on-write (every buffer in the window, no snapshot memory)"},
			// Benchmarks set it to compare.
			&ucli.IntFlag{Name: "background-lanes", Value: 0, Hidden: true,
				Usage: "lanes per device of a concurrent checkpoint's background copy (0: a quarter of the CPUs, at least 2)"},
			// Benchmarks turn it off to measure what it saves.
			&ucli.IntFlag{Name: "served-pool", Value: 0,
				Usage: "served mode: keep N workers per device ready, each with its context made (0: served mode off)"},
			&ucli.IntFlag{Name: "served-max-per-uid", Value: served.DefaultMaxPerUID,
				Usage: "served mode: the most workers one uid's processes may have at a time"},
			&ucli.StringFlag{Name: "served-cublas",
				Usage: "served mode: a directory with NVIDIA's libcublas.so.13 and libcublasLt.so.13, which each worker loads while it waits (a served process that asks for these files then finds them loaded)"},
			&ucli.BoolFlag{Name: "export-keeper", Value: true, Hidden: true,
				Usage: "hold one small exported allocation per device, which keeps the driver's exports fast"},
		},
		Action: runHelper,
	}
}

func helperLogger(level, format, file string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, usageError{fmt.Errorf("--log-level: %v", err)}
	}
	out := "stderr"
	if file != "" {
		// zap opens it for appending; a new one is made here first, so
		// that its mode is 0640 whatever the umask
		f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o640)
		if err == nil {
			err = f.Chmod(0o640)
			f.Close()
		} else if errors.Is(err, fs.ErrExist) {
			f, err = os.OpenFile(file, os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0)
			if err == nil {
				f.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("--log-file: %w", err)
		}
		out = file
	}
	cfg := zap.NewProductionConfig()
	cfg.OutputPaths = []string{out}
	cfg.ErrorOutputPaths = []string{out}
	// an error names what failed; a Go stack trace tells an operator nothing
	cfg.DisableStacktrace = true
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	switch format {
	case "json":
		cfg.EncoderConfig.TimeKey = "time"
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	case "console", "text":
		cfg.Encoding = "console"
		cfg.EncoderConfig = zap.NewDevelopmentEncoderConfig()
	default:
		return nil, usageError{fmt.Errorf("--log-format: %q is neither json nor text", format)}
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
	limits, err := helperLimits(c)
	if err != nil {
		return err
	}
	// Fault injection for failure tests: GPUCR_FAULT=STEP makes that
	// step fail (package fault).
	injected, err := fault.Parse(os.Getenv("GPUCR_FAULT"), fault.Helper)
	if err != nil {
		return usageError{err}
	}
	log, err := helperLogger(c.String("log-level"), c.String("log-format"), c.String("log-file"))
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	lib := cuda.LibraryPath()
	drv, loadErr := cuda.Load(lib)
	inv := inventory.Collect(drv, loadErr)
	poolBytes, err := parseSize(c.String("alloc-pool"))
	if err != nil {
		return usageError{fmt.Errorf("--alloc-pool: %v", err)}
	}
	reserve, err := parseSize(c.String("snapshot-reserve"))
	if err != nil || strings.EqualFold(strings.TrimSpace(c.String("snapshot-reserve")), "unlimited") {
		return usageError{fmt.Errorf("--snapshot-reserve: %q is not a size (like 512M or 2G)", c.String("snapshot-reserve"))}
	}
	resident, err := parseSize(c.String("resident-memory"))
	if err != nil || strings.EqualFold(strings.TrimSpace(c.String("resident-memory")), "unlimited") {
		return usageError{fmt.Errorf("--resident-memory: %q is not a size (like 16G, or 0 for none)", c.String("resident-memory"))}
	}
	cmode, err := daemon.ParseConcurrentMode(c.String("concurrent-mode"))
	if err != nil {
		return usageError{fmt.Errorf("--concurrent-mode: %v", err)}
	}
	cfg := daemon.Config{
		ResidentMemory:  resident,
		SnapshotReserve: reserve,
		Concurrent:      cmode,
		BackgroundLanes: c.Int("background-lanes"),
		Pool:            daemon.PoolConfig{Budget: poolBytes},
		ExportKeeper:    c.Bool("export-keeper"),
		Socket:          client.SocketPath(c.String("socket")),
		SocketMode:      os.FileMode(mode),
		SocketGroup:     c.String("socket-group"),
		Log:             log,
		Version:         Version,
		Fault:           injected,
		Driver:          driverInfo(lib, drv),
		Limits:          limits,
	}
	if loadErr != nil {
		cfg.Unavailable = fmt.Sprintf("driver %s: %v", lib, loadErr)
		log.Warn("no usable GPU driver; serving status only", zap.String("library", lib), zap.Error(loadErr))
	} else {
		defer drv.Close()
		cfg.Devices = daemon.CUDADevices(drv)
		// The copy engines' lanes (a thread, a stream and pinned staging
		// for two chunks each; GOMAXPROCS per device) start now rather than
		// in the first checkpoint or restore.
		// gpucr's own kernels (the chunk hash) are loaded now too: the
		// driver compiles their PTX: on the H200 the first checkpoint hashed
		// 8 GB in 170 ms with it, later ones in 13 ms.
		for _, d := range drv.Devices {
			go func() {
				if err := d.WarmLanes(runtime.GOMAXPROCS(0), engine.LaneStaging(image.DefaultChunkSize)); err != nil {
					log.Warn("starting copy lanes", zap.Int("device", d.Ordinal), zap.Error(err))
				}
				if err := d.LoadKernels(); err != nil {
					log.Error("loading gpucr's GPU kernels: checkpoints of this device will fail", zap.Int("device", d.Ordinal), zap.Error(err))
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

	if n := c.Int("served-pool"); n < 0 {
		return usageError{fmt.Errorf("--served-pool: %d is negative", n)}
	} else if n > 0 && loadErr == nil {
		exe, args, native := workerCommand()
		if !native {
			log.Warn("served mode: no gpucr-worker beside gpucr: the workers run gpucr's own served-worker, whose Go heap " +
				"lies at a random address in each, so a process moved to a new worker may lose its device addresses")
		}
		cfg.Served = served.NewPool(served.PoolConfig{Exe: exe, Args: args, Native: native, Size: n, Devices: len(cfg.Devices), LibCUDA: lib,
			MaxPerUID: c.Int("served-max-per-uid"), CublasDir: c.String("served-cublas"), Log: log})
	} else if n > 0 {
		log.Warn("served mode: no driver, so no workers", zap.Error(loadErr))
	}
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

// helperLimits reads the limit flags of `gpucr helper`.
func helperLimits(c *ucli.Context) (daemon.Limits, error) {
	var l daemon.Limits
	if l.FrameTimeout = c.Duration("frame-timeout"); l.FrameTimeout <= 0 {
		return l, usageError{fmt.Errorf("--frame-timeout: %v is not a positive duration", l.FrameTimeout)}
	}
	count := func(name string) (int, error) {
		switch n := c.Int(name); {
		case n < 0:
			return 0, usageError{fmt.Errorf("--%s: %d is negative", name, n)}
		case n == 0:
			return -1, nil // daemon.Limits: negative is no limit
		default:
			return n, nil
		}
	}
	var err error
	if l.MaxConnsPerUID, err = count("max-connections-per-uid"); err != nil {
		return l, err
	}
	if l.MaxPending, err = count("max-pending-connections"); err != nil {
		return l, err
	}
	if l.ExportsPerUID, err = count("max-exports-per-uid"); err != nil {
		return l, err
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"module-analysis-memory", &l.AnalysisBytes}, {"module-analysis-memory-per-uid", &l.AnalysisBytesPerUID}} {
		n, err := parseSize(c.String(f.name))
		if err != nil || n == 0 || n > 1<<40 {
			return l, usageError{fmt.Errorf("--%s: %q is not a size (like 128M)", f.name, c.String(f.name))}
		}
		*f.v = int64(n)
	}
	if l.GPUMemoryPerUID, err = parseSize(c.String("max-gpu-memory-per-uid")); err != nil {
		return l, usageError{fmt.Errorf("--max-gpu-memory-per-uid: %v", err)}
	}
	for _, v := range c.StringSlice("max-gpu-memory-for") {
		who, size, ok := strings.Cut(v, "=")
		if !ok {
			return l, usageError{fmt.Errorf("--max-gpu-memory-for: %q is not USER=SIZE", v)}
		}
		uid, err := lookupUID(who)
		if err != nil {
			return l, usageError{fmt.Errorf("--max-gpu-memory-for %s: %v", v, err)}
		}
		n, err := parseSize(size)
		if err != nil {
			return l, usageError{fmt.Errorf("--max-gpu-memory-for %s: %v", v, err)}
		}
		if l.GPUMemoryByUID == nil {
			l.GPUMemoryByUID = map[uint32]uint64{}
		}
		l.GPUMemoryByUID[uid] = n
	}
	return l, nil
}

// lookupUID is a user name's uid, or a number's.
func lookupUID(who string) (uint32, error) {
	if n, err := strconv.ParseUint(who, 10, 32); err == nil {
		return uint32(n), nil
	}
	u, err := user.Lookup(who)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("user %s: uid %q: %w", who, u.Uid, err)
	}
	return uint32(n), nil
}

// parseSize reads a size: a number of bytes with an optional binary unit
// (K, M, G, T, with or without "iB" or "B": 1K = 1024), fractions allowed
// ("1.5G"); "unlimited" (or "none", "0") is 0, no limit.
func parseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	switch strings.ToLower(t) {
	case "unlimited", "none", "infinity":
		return 0, nil
	}
	num := strings.TrimRightFunc(t, unicode.IsLetter)
	unit := strings.ToUpper(strings.TrimSpace(t[len(num):]))
	unit = strings.TrimSuffix(strings.TrimSuffix(unit, "B"), "I")
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
	sh, ok := shift[unit]
	v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !ok || err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a size (like 512M, 40G, 1.5T or unlimited)", s)
	}
	b := v * float64(uint64(1)<<sh)
	if b >= math.MaxUint64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return uint64(math.Ceil(b)), nil
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

// workerCommand is how the helper starts its served-mode workers: served
// mode's worker program, gpucr-worker beside gpucr's file (no Go runtime,
// whose heap Go 1.26 places at random in each process, where a worker's
// driver would put its memory), else gpucr's own served-worker subcommand
// (GPUCR_SERVED_WORKER=go asks for that one); where a dynamic loader runs
// gpucr (the GPU bundle's launcher, scripts/make-gpucr-bundle.sh), through
// that loader with its directory as the library path. native: the worker is
// gpucr-worker.
func workerCommand() (exe string, args []string, native bool) {
	exe, err := os.Executable()
	if err != nil {
		return "/proc/self/exe", nil, false
	}
	loader := dynamicLoader.MatchString(filepath.Base(exe))
	real := exe
	if loader {
		if r, err := realExecutable(); err == nil && r != exe {
			real = r
		} else {
			loader = false
		}
	}
	if w := filepath.Join(filepath.Dir(real), "gpucr-worker"); os.Getenv("GPUCR_SERVED_WORKER") != "go" && fileExists(w) {
		if loader {
			return exe, []string{"--library-path", filepath.Dir(exe), w}, true
		}
		return w, nil, true
	}
	if !loader {
		return "/proc/self/exe", nil, false
	}
	return exe, []string{"--library-path", filepath.Dir(exe), real}, false
}
