package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// rawBlock is the size of each plain write and read: the image's default
// chunk size, so both paths move the same amount per system call.
const rawBlock = 4 << 20

// rawWrite stores data as plain files in dir, the baseline the image writer
// is measured against: streams files written concurrently, each a contiguous
// part of data, sequentially in rawBlock writes, each fsynced at the end, then
// the directory fsynced (what a committed image pays for durability too).
func rawWrite(dir string, data []byte, streams int) error {
	parts := splitAligned(len(data), streams, rawBlock)
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = writeFile(rawName(dir, i), data[p[0]:p[1]])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return syncDir(dir)
}

func writeFile(name string, b []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	for len(b) > 0 {
		n := min(len(b), rawBlock)
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

// rawRead reads back what rawWrite stored, into dst, with the same streams
// and block size. Nothing is dropped from the page cache first, as nothing is
// before the image is read back either: both read what the write left there.
func rawRead(dir string, dst []byte, streams int) error {
	parts := splitAligned(len(dst), streams, rawBlock)
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = readFile(rawName(dir, i), dst[p[0]:p[1]])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func readFile(name string, b []byte) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	for len(b) > 0 {
		n := min(len(b), rawBlock)
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
