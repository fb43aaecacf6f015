// Package benchio holds the write and read loops that the image benchmarks
// (image/bench_test.go) and imagebench share: the image path and the plain-file
// baseline it is measured against, so both measure exactly the same thing.
package benchio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// Block is the size of each plain write and read: the image's default
// chunk size, so both paths move the same amount per system call.
const Block = 4 << 20

// RawWrite stores data as plain files in dir, the baseline the image writer
// is measured against: streams files written concurrently, each a contiguous
// part of data, sequentially in Block writes, each fsynced at the end, then
// the directory fsynced (what a committed image pays for durability too).
func RawWrite(dir string, data []byte, streams int) error {
	err := eachPart(SplitAligned(len(data), streams, Block), func(i, lo, hi int) error {
		return writeFile(rawName(dir, i), data[lo:hi])
	})
	if err != nil {
		return err
	}
	return syncDir(dir)
}

// eachPart runs fn for every part [lo, hi) at once, each on its own
// goroutine, and returns their errors joined.
func eachPart(parts [][2]int, fn func(i, lo, hi int) error) error {
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i, p[0], p[1])
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func writeFile(name string, b []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	for len(b) > 0 {
		n := min(len(b), Block)
		if _, err := f.Write(b[:n]); err != nil {
			f.Close()
			return fmt.Errorf("write %s: %w", name, err)
		}
		b = b[n:]
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", name, err)
	}
	return f.Close()
}

// RawRead reads back what RawWrite stored, into dst, with the same streams
// and block size. Nothing is dropped from the page cache first, as nothing is
// before the image is read back either: both read what the write left there.
func RawRead(dir string, dst []byte, streams int) error {
	return eachPart(SplitAligned(len(dst), streams, Block), func(i, lo, hi int) error {
		return readFile(rawName(dir, i), dst[lo:hi])
	})
}

func readFile(name string, b []byte) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	for len(b) > 0 {
		n := min(len(b), Block)
		if _, err := io.ReadFull(f, b[:n]); err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		b = b[n:]
	}
	return nil
}

func rawName(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("raw-%03d", i)) }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
