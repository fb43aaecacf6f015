// Command filebench measures ways of putting chunk-sized pieces of memory
// into files and back, to choose how an image stores its chunks:
//
//	filebench [-dir DIR] [-size MB] [-chunk MiB] [-threads 1,4,16] [-ways a,b] [-runs N]
//
// Each way moves SIZE MB from per-thread source buffers (as the helper's
// copy lanes do from their pinned staging buffers) into files in DIR, then
// reads them back into per-thread buffers; it prints the median GB/s per
// way and thread count. The ways:
//
//	files      one new file per chunk: create, one write, close (what images do)
//	falloc     the same with fallocate(chunk) before the write
//	big        one file per thread, chunks written at their offsets (pwrite)
//	bigfalloc  the same, the file preallocated with fallocate first (timed)
//	writev     one file per 4 chunks, one pwritev of 4 buffers
//	mmap       one file per thread, preallocated, mapped, chunks copied in
//	direct     one new file per chunk opened O_DIRECT (aligned buffers)
//
// Reading is pread into the thread's buffer for every way except mmap
// (copy out of the mapping) and direct (O_DIRECT reads).
// It is a host-only tool, built statically (CGO_ENABLED=0) so that it runs
// on the GPU machine as well.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/image/mountinfo"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

var allWays = []string{"files", "falloc", "big", "bigfalloc", "writev", "mmap", "direct"}

type config struct {
	dir     string
	size    int64
	chunk   int
	threads []int
	ways    []string
	runs    int
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "filebench: %v\n", err)
		return 2
	}
	fsName := "unknown"
	if m, err := mountinfo.Of(cfg.dir); err == nil {
		fsName = m.String()
	}
	fmt.Fprintf(stdout, "filebench: dir %s (%s), %d MiB per run, chunk %d MiB, median of %d runs, GB/s = 1e9 bytes/s\n\n",
		cfg.dir, fsName, cfg.size>>20, cfg.chunk>>20, cfg.runs)
	fmt.Fprintf(stdout, "| way | threads | write GB/s | read GB/s |\n|---|---|---|---|\n")
	for _, way := range cfg.ways {
		for _, t := range cfg.threads {
			w, r, err := measure(cfg, way, t)
			if err != nil {
				fmt.Fprintf(stdout, "| %s | %d | %v | |\n", way, t, err)
				continue
			}
			fmt.Fprintf(stdout, "| %s | %d | %.2f | %.2f |\n", way, t, w, r)
		}
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("filebench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	var sizeMB, chunkMiB int
	var threads, ways string
	fs.StringVar(&cfg.dir, "dir", os.TempDir(), "directory to write in (e.g. /dev/shm)")
	fs.IntVar(&sizeMB, "size", 1024, "MB (2^20 bytes) moved per run")
	fs.IntVar(&chunkMiB, "chunk", 4, "chunk size in MiB")
	fs.StringVar(&threads, "threads", "1,4", "comma-separated thread counts")
	fs.StringVar(&ways, "ways", strings.Join(allWays, ","), "comma-separated ways: "+strings.Join(allWays, ", "))
	fs.IntVar(&cfg.runs, "runs", 3, "runs per row; the table shows medians")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	if sizeMB <= 0 || chunkMiB <= 0 || cfg.runs <= 0 {
		return cfg, fmt.Errorf("-size, -chunk and -runs must be positive")
	}
	cfg.chunk = chunkMiB << 20
	cfg.size = int64(sizeMB) << 20 / int64(cfg.chunk) * int64(cfg.chunk)
	for _, s := range strings.Split(threads, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return cfg, fmt.Errorf("-threads: %q is not a positive number", s)
		}
		cfg.threads = append(cfg.threads, n)
	}
	for _, w := range strings.Split(ways, ",") {
		w = strings.TrimSpace(w)
		if !slices.Contains(allWays, w) {
			return cfg, fmt.Errorf("unknown way %q (ways: %s)", w, strings.Join(allWays, ", "))
		}
		cfg.ways = append(cfg.ways, w)
	}
	if st, err := os.Stat(cfg.dir); err != nil || !st.IsDir() {
		return cfg, fmt.Errorf("-dir %s is not a directory", cfg.dir)
	}
	return cfg, nil
}

// measure runs one way with n threads cfg.runs times in fresh directories.
func measure(cfg config, way string, n int) (float64, float64, error) {
	var ws, rs []float64
	bufs := make([][]byte, n)
	for i := range bufs {
		b, err := unix.Mmap(-1, 0, cfg.chunk*4, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			return 0, 0, err
		}
		defer unix.Munmap(b)
		for j := range b {
			b[j] = byte(i + j*7)
		}
		bufs[i] = b
	}
	for range cfg.runs {
		dir, err := os.MkdirTemp(cfg.dir, "filebench-")
		if err != nil {
			return 0, 0, err
		}
		w, r, err := once(cfg, way, dir, bufs)
		if rmErr := os.RemoveAll(dir); err == nil {
			err = rmErr
		}
		if err != nil {
			return 0, 0, err
		}
		ws, rs = append(ws, w), append(rs, r)
	}
	return median(ws), median(rs), nil
}

// once writes cfg.size bytes the given way with len(bufs) threads, each
// taking every len(bufs)-th chunk, then reads them back; GB/s each way.
func once(cfg config, way, dir string, bufs [][]byte) (float64, float64, error) {
	chunks := int(cfg.size / int64(cfg.chunk))
	n := len(bufs)
	mine := func(t int) []int {
		var c []int
		for i := t; i < chunks; i += n {
			c = append(c, i)
		}
		return c
	}
	start := time.Now()
	if err := parallel(n, func(t int) error { return writeWay(cfg, way, dir, t, mine(t), bufs[t]) }); err != nil {
		return 0, 0, fmt.Errorf("write: %w", err)
	}
	w := float64(cfg.size) / time.Since(start).Seconds() / 1e9
	start = time.Now()
	if err := parallel(n, func(t int) error { return readWay(cfg, way, dir, t, mine(t), bufs[t]) }); err != nil {
		return 0, 0, fmt.Errorf("read: %w", err)
	}
	r := float64(cfg.size) / time.Since(start).Seconds() / 1e9
	return w, r, nil
}

func chunkName(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("c%06d", i)) }
func bigName(dir string, t int) string   { return filepath.Join(dir, fmt.Sprintf("t%03d", t)) }

func writeWay(cfg config, way, dir string, t int, mine []int, buf []byte) error {
	src := buf[:cfg.chunk]
	size := int64(len(mine)) * int64(cfg.chunk)
	switch way {
	case "files", "falloc", "direct":
		flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
		if way == "direct" {
			flags |= unix.O_DIRECT
		}
		for _, i := range mine {
			f, err := os.OpenFile(chunkName(dir, i), flags, 0o600)
			if err != nil {
				return err
			}
			if way == "falloc" {
				err = unix.Fallocate(int(f.Fd()), 0, 0, int64(cfg.chunk))
			}
			if err == nil {
				_, err = f.Write(src)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
		return nil
	case "big", "bigfalloc", "mmap":
		f, err := os.OpenFile(bigName(dir, t), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if way != "big" && size > 0 {
			if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
				return err
			}
		}
		if way == "mmap" {
			if size == 0 {
				return nil
			}
			m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				return err
			}
			for k := range mine {
				copy(m[k*cfg.chunk:], src)
			}
			return unix.Munmap(m)
		}
		for k := range mine {
			if _, err := f.WriteAt(src, int64(k)*int64(cfg.chunk)); err != nil {
				return err
			}
		}
		return nil
	case "writev":
		// Groups of 4 of this thread's chunks, one file and one pwritev each.
		for g := 0; g < len(mine); g += 4 {
			f, err := os.OpenFile(chunkName(dir, mine[g]), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = unix.Pwritev(int(f.Fd()), groupIOV(buf, cfg.chunk, len(mine)-g), 0)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown way %q", way)
}

func readWay(cfg config, way, dir string, t int, mine []int, buf []byte) error {
	dst := buf[:cfg.chunk]
	switch way {
	case "files", "falloc", "direct":
		flags := os.O_RDONLY
		if way == "direct" {
			flags |= unix.O_DIRECT
		}
		for _, i := range mine {
			f, err := os.OpenFile(chunkName(dir, i), flags, 0)
			if err != nil {
				return err
			}
			_, err = io.ReadFull(f, dst)
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	case "big", "bigfalloc", "mmap":
		f, err := os.Open(bigName(dir, t))
		if err != nil {
			return err
		}
		defer f.Close()
		if way == "mmap" {
			size := len(mine) * cfg.chunk
			if size == 0 {
				return nil
			}
			m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				return err
			}
			for k := range mine {
				copy(dst, m[k*cfg.chunk:])
			}
			return unix.Munmap(m)
		}
		for k := range mine {
			if _, err := f.ReadAt(dst, int64(k)*int64(cfg.chunk)); err != nil {
				return err
			}
		}
		return nil
	case "writev":
		for g := 0; g < len(mine); g += 4 {
			f, err := os.Open(chunkName(dir, mine[g]))
			if err != nil {
				return err
			}
			_, err = unix.Preadv(int(f.Fd()), groupIOV(buf, cfg.chunk, len(mine)-g), 0)
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown way %q", way)
}

// groupIOV is the vector of one writev group: up to 4 chunks (fewer when
// only left remain) from consecutive chunk-sized pieces of buf.
func groupIOV(buf []byte, chunk, left int) [][]byte {
	var iov [][]byte
	for k := range min(4, left) {
		iov = append(iov, buf[k*chunk:(k+1)*chunk])
	}
	return iov
}

func parallel(n int, f func(int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for t := range n {
		wg.Go(func() { errs[t] = f(t) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
