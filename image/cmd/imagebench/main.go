// Command imagebench measures how fast gpucr writes and reads GPU images
// (package image) against plain files holding the same bytes in the same
// directory, in one run, so that the ratio means something on any machine.
//
//	imagebench [-dir DIR] [-size MB] [-runs N] [-cases a,b,...] [-json]
//
// For each case it generates SIZE MB of data of one kind, writes it as an
// image through image.Writer and reads it back through image.Reader, then
// writes and reads the same bytes as plain files (4 MiB writes, fsync), and
// prints the median throughput of each over the runs. It is built statically
// (CGO_ENABLED=0) so that it runs on the GPU machine, which has no Go
// toolchain: scripts/bench-image.sh runs it.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/image/internal/benchio"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// benchCase is one row of the table.
type benchCase struct {
	name        string
	kind        dataKind
	compression image.Compression
}

var allCases = []benchCase{
	{"random", kindRandom, image.CompressionNone},
	{"dup50", kindDup50, image.CompressionNone},
	{"zero30", kindZero30, image.CompressionNone},
	{"random+zstd", kindRandom, image.CompressionZstd},
	{"compressible+zstd", kindCompressible, image.CompressionZstd},
}

type config struct {
	dir       string
	sizeMB    int
	runs      int
	cases     []benchCase
	buffers   int
	workers   int
	api       string // "chunks" or "stream"
	profile   string // CPU profile file, "" for none
	chunkSize int
	streams   int
	json      bool
}

// result is one case's medians; the JSON names are what scripts read.
type result struct {
	Case          string  `json:"case"`
	WriteGBps     float64 `json:"write_gbps"`
	ReadGBps      float64 `json:"read_gbps"`
	RawWriteGBps  float64 `json:"raw_write_gbps"`
	RawReadGBps   float64 `json:"raw_read_gbps"`
	WriteRatio    float64 `json:"write_ratio"`
	ReadRatio     float64 `json:"read_ratio"`
	LogicalBytes  int64   `json:"logical_bytes"`
	StoredBytes   int64   `json:"stored_bytes"`
	DedupRatio    float64 `json:"dedup_ratio"`
	TargetRatioOK bool    `json:"target_ratio_ok"`
	// Targeted: the throughput targets below apply (uncompressed cases; zstd
	// is for slow storage and is shown for what it costs, not held to them).
	Targeted bool `json:"targeted"`
}

type report struct {
	CPUs       int      `json:"cpus"`
	GOMAXPROCS int      `json:"gomaxprocs"`
	Dir        string   `json:"dir"`
	Filesystem string   `json:"filesystem"`
	SizeBytes  int64    `json:"size_bytes"`
	ChunkSize  int      `json:"chunk_size"`
	Workers    int      `json:"workers"`
	Buffers    int      `json:"buffers"`
	API        string   `json:"api"`
	RawStreams int      `json:"raw_streams"`
	Runs       int      `json:"runs"`
	Results    []result `json:"results"`
}

// Targets: the image costs at most 20% of plain-file throughput,
// and a 16-core host moves at least 20 GB/s each way into /dev/shm.
const (
	targetRatio   = 0.8
	targetGBps    = 20
	targetMinCPUs = 16
)

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "imagebench: %v\n", err)
		return 2
	}
	if cfg.profile != "" {
		f, err := os.Create(cfg.profile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(stderr, "imagebench: cpu profile: %v\n", err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	rep, err := bench(cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "imagebench: %v\n", err)
		return 1
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "imagebench: %v\n", err)
			return 1
		}
		return 0
	}
	printTable(stdout, rep)
	return 0
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("imagebench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	var cases string
	var chunkMiB int
	names := make([]string, len(allCases))
	for i, c := range allCases {
		names[i] = c.name
	}
	fs.StringVar(&cfg.dir, "dir", os.TempDir(), "directory to write images and files in (e.g. /dev/shm)")
	fs.IntVar(&cfg.sizeMB, "size", 256, "MB (2^20 bytes) of data per case")
	fs.IntVar(&cfg.runs, "runs", 3, "runs per case; the table shows medians")
	fs.StringVar(&cases, "cases", strings.Join(names, ","), "comma-separated cases")
	fs.IntVar(&cfg.buffers, "buffers", 4, "buffers per image, written concurrently")
	fs.StringVar(&cfg.api, "api", "hashed", "write API: hashed (WriteChunkHashed from -workers goroutines with the hashes computed beforehand, and reads that leave the hash check to the GPU, as the copy engines do), chunks (WriteChunk: the writer hashes on the CPU) or stream (Write, one goroutine per buffer)")
	fs.IntVar(&cfg.workers, "workers", 0, "image.Options.Workers (0: GOMAXPROCS); also the number of reading goroutines")
	fs.IntVar(&chunkMiB, "chunk", image.DefaultChunkSize>>20, "chunk size in MiB")
	fs.IntVar(&cfg.streams, "raw-streams", 0, "plain files written and read concurrently (0: GOMAXPROCS)")
	fs.BoolVar(&cfg.json, "json", false, "print JSON instead of the table")
	fs.StringVar(&cfg.profile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	if cfg.sizeMB <= 0 || cfg.runs <= 0 || cfg.buffers <= 0 || chunkMiB <= 0 || cfg.workers < 0 || cfg.streams < 0 {
		return cfg, fmt.Errorf("-size, -runs, -buffers and -chunk must be positive, -workers and -raw-streams not negative")
	}
	if cfg.api != "hashed" && cfg.api != "chunks" && cfg.api != "stream" {
		return cfg, fmt.Errorf("-api %q: want hashed, chunks or stream", cfg.api)
	}
	cfg.chunkSize = chunkMiB << 20
	if cfg.workers == 0 {
		cfg.workers = runtime.GOMAXPROCS(0)
	}
	if cfg.streams == 0 {
		cfg.streams = runtime.GOMAXPROCS(0)
	}
	for _, name := range strings.Split(cases, ",") {
		i := slices.IndexFunc(allCases, func(c benchCase) bool { return c.name == strings.TrimSpace(name) })
		if i < 0 {
			return cfg, fmt.Errorf("unknown case %q (cases: %s)", name, strings.Join(names, ", "))
		}
		cfg.cases = append(cfg.cases, allCases[i])
	}
	return cfg, nil
}

func bench(cfg config, log io.Writer) (*report, error) {
	if st, err := os.Stat(cfg.dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("-dir %s is not a directory", cfg.dir)
	}
	rep := &report{
		CPUs:       runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Dir:        cfg.dir,
		Filesystem: filesystemOf(cfg.dir),
		SizeBytes:  int64(cfg.sizeMB) << 20,
		ChunkSize:  cfg.chunkSize,
		Workers:    cfg.workers,
		Buffers:    cfg.buffers,
		API:        cfg.api,
		RawStreams: cfg.streams,
		Runs:       cfg.runs,
	}
	for _, c := range cfg.cases {
		fmt.Fprintf(log, "imagebench: %s: %d MB x %d runs\n", c.name, cfg.sizeMB, cfg.runs)
		r, err := benchOne(cfg, c, log)
		if err != nil {
			return nil, fmt.Errorf("case %s: %w", c.name, err)
		}
		rep.Results = append(rep.Results, r)
	}
	return rep, nil
}

// benchOne runs one case cfg.runs times. Each run writes into a fresh
// directory, so nothing is deduplicated against an earlier run, and removes it
// afterwards, so that a few GB fit in /dev/shm. Image and plain files take
// turns going first, so neither always finds the page cache in the state the
// other left.
func benchOne(cfg config, c benchCase, log io.Writer) (result, error) {
	n := cfg.sizeMB << 20
	data, err := genData(c.kind, n, cfg.chunkSize)
	if err != nil {
		return result{}, err
	}
	dst := make([]byte, n)
	prefault(dst) // so neither reader pays the first-touch page faults
	opts := image.Options{ChunkSize: cfg.chunkSize, Compression: c.compression, Workers: cfg.workers}
	var w, r, rw, rr []float64
	var stats image.WriteStats
	var hashes [][16]byte // the GPU's work in a dump: done before the timing
	if cfg.api == "hashed" {
		hashes = benchio.ChunkHashes(data, cfg.buffers, cfg.chunkSize)
	}
	for i := range cfg.runs {
		top, err := os.MkdirTemp(cfg.dir, "imagebench-")
		if err != nil {
			return result{}, err
		}
		imageRun := func() error {
			dir := filepath.Join(top, "image")
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
			clear(dst)
			runtime.GC()
			t := time.Now()
			var st image.WriteStats
			var err error
			switch cfg.api {
			case "hashed":
				st, err = benchio.ImageWriteChunks(dir, data, cfg.buffers, cfg.workers, opts, hashes)
			case "chunks":
				st, err = benchio.ImageWriteChunks(dir, data, cfg.buffers, cfg.workers, opts, nil)
			default:
				st, err = benchio.ImageWrite(dir, data, cfg.buffers, cfg.chunkSize, opts)
			}
			if err != nil {
				return err
			}
			w = append(w, gbps(n, time.Since(t)))
			stats = st
			runtime.GC()
			t = time.Now()
			if err := benchio.ImageRead(dir, dst, cfg.workers, cfg.api == "hashed"); err != nil {
				return err
			}
			r = append(r, gbps(n, time.Since(t)))
			if !bytes.Equal(dst, data) {
				return fmt.Errorf("the image read back differs from what was written")
			}
			return os.RemoveAll(dir)
		}
		rawRun := func() error {
			dir := filepath.Join(top, "raw")
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
			clear(dst)
			runtime.GC()
			t := time.Now()
			if err := benchio.RawWrite(dir, data, cfg.streams); err != nil {
				return err
			}
			rw = append(rw, gbps(n, time.Since(t)))
			runtime.GC()
			t = time.Now()
			if err := benchio.RawRead(dir, dst, cfg.streams); err != nil {
				return err
			}
			rr = append(rr, gbps(n, time.Since(t)))
			if !bytes.Equal(dst, data) {
				return fmt.Errorf("the plain files read back differ from what was written")
			}
			return os.RemoveAll(dir)
		}
		first, second := imageRun, rawRun
		if i%2 == 1 {
			first, second = rawRun, imageRun
		}
		err = first()
		if err == nil {
			err = second()
		}
		if rmErr := os.RemoveAll(top); err == nil {
			err = rmErr
		}
		if err != nil {
			return result{}, err
		}
		fmt.Fprintf(log, "imagebench: %s run %d: image write %.2f read %.2f, raw write %.2f read %.2f GB/s\n",
			c.name, i+1, w[i], r[i], rw[i], rr[i])
	}
	res := result{
		Case:         c.name,
		WriteGBps:    median(w),
		ReadGBps:     median(r),
		RawWriteGBps: median(rw),
		RawReadGBps:  median(rr),
		LogicalBytes: int64(n),
		StoredBytes:  storedBytes(stats),
	}
	res.WriteRatio = res.WriteGBps / res.RawWriteGBps
	res.ReadRatio = res.ReadGBps / res.RawReadGBps
	if res.StoredBytes > 0 {
		res.DedupRatio = float64(res.LogicalBytes) / float64(res.StoredBytes)
	}
	res.TargetRatioOK = res.WriteRatio >= targetRatio && res.ReadRatio >= targetRatio
	res.Targeted = c.compression == image.CompressionNone
	return res, nil
}

func storedBytes(st image.WriteStats) int64 { return int64(st.BytesStored) }

func gbps(n int, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func prefault(b []byte) {
	parallelFor((len(b)+(1<<20)-1)>>20, func(i int) {
		end := min(len(b), (i+1)<<20)
		for j := i << 20; j < end; j += 4096 {
			b[j] = 1
		}
	})
}

func printTable(w io.Writer, rep *report) {
	fmt.Fprintf(w, "imagebench: %d CPU cores (GOMAXPROCS %d), dir %s (%s)\n", rep.CPUs, rep.GOMAXPROCS, rep.Dir, rep.Filesystem)
	fmt.Fprintf(w, "%d MiB per case, chunk %d MiB, %d buffers, write API %s, %d image workers/readers, %d raw streams, median of %d runs; GB/s = 1e9 bytes/s of logical data\n\n",
		rep.SizeBytes>>20, rep.ChunkSize>>20, rep.Buffers, rep.API, rep.Workers, rep.RawStreams, rep.Runs)
	header := []string{"case", "write GB/s", "read GB/s", "raw write GB/s", "raw read GB/s", "write ratio", "read ratio", "stored bytes", "dedup ratio", "ratio >= 0.8"}
	rows := [][]string{header}
	for _, r := range rep.Results {
		ok := "met"
		switch {
		case !r.Targeted:
			ok = "n/a (zstd)"
		case !r.TargetRatioOK:
			ok = "MISSED"
		}
		rows = append(rows, []string{
			r.Case,
			fmt.Sprintf("%.2f", r.WriteGBps), fmt.Sprintf("%.2f", r.ReadGBps),
			fmt.Sprintf("%.2f", r.RawWriteGBps), fmt.Sprintf("%.2f", r.RawReadGBps),
			fmt.Sprintf("%.2f", r.WriteRatio), fmt.Sprintf("%.2f", r.ReadRatio),
			fmt.Sprintf("%d", r.StoredBytes), fmt.Sprintf("%.2f", r.DedupRatio), ok,
		})
	}
	widths := make([]int, len(header))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], len(cell))
		}
	}
	for k, row := range rows {
		cells := make([]string, len(row))
		for i, cell := range row {
			if i == 0 {
				cells[i] = fmt.Sprintf("%-*s", widths[i], cell)
			} else {
				cells[i] = fmt.Sprintf("%*s", widths[i], cell)
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
		if k == 0 {
			seps := make([]string, len(widths))
			for i, wd := range widths {
				seps[i] = strings.Repeat("-", wd)
			}
			fmt.Fprintf(w, "|-%s-|\n", strings.Join(seps, "-|-"))
		}
	}
	fmt.Fprintf(w, "\ntargets: write and read >= %.1f x raw (column above); >= %d GB/s each way on a %d-core host into /dev/shm: ",
		targetRatio, targetGBps, targetMinCPUs)
	if rep.CPUs < targetMinCPUs || !strings.HasPrefix(rep.Filesystem, "tmpfs") {
		fmt.Fprintf(w, "not applicable here (%d cores, %s)\n", rep.CPUs, fsType(rep.Filesystem))
		return
	}
	var missed []string
	for _, r := range rep.Results {
		if r.Targeted && (r.WriteGBps < targetGBps || r.ReadGBps < targetGBps) {
			missed = append(missed, r.Case)
		}
	}
	if len(missed) == 0 {
		fmt.Fprintln(w, "met by every uncompressed case")
	} else {
		fmt.Fprintf(w, "MISSED by %s\n", strings.Join(missed, ", "))
	}
}

func fsType(desc string) string {
	t, _, _ := strings.Cut(desc, " ")
	return t
}
