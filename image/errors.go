package image

import (
	"errors"
	"fmt"
)

// Sentinel errors; every error from this package that means one of these
// wraps it, so callers (the CLI's exit codes) can test with errors.Is.
var (
	// ErrCorrupt: stored bytes or the manifest do not match their checksums,
	// or the manifest breaks the format's rules.
	ErrCorrupt = errors.New("image corrupt")
	// ErrIncomplete: the write of the image was not finished (no committed
	// manifest, a buffer short of bytes, a Writer that failed or was aborted).
	ErrIncomplete = errors.New("image incomplete")
	// ErrVersion: the manifest's format version is not one this build reads.
	ErrVersion = errors.New("unknown image format version")
	// ErrMissingParent: a parent image the image needs is gone or replaced.
	ErrMissingParent = errors.New("parent image missing")
	// ErrPruned: gc deleted chunks of this image that only its kept
	// descendants needed; it can only be read through them.
	ErrPruned = errors.New("pruned by gc: not restorable by itself")
	// ErrBusy: another Writer or GC holds the image directory.
	ErrBusy = errors.New("image directory in use")
)

// ChunkError names the chunk a failure is about. Buffer is the buffer's index
// in the manifest (-1 when not about one buffer), Chunk the chunk's index in
// the buffer, File the chunk file (empty for a zero chunk or before one was
// chosen).
type ChunkError struct {
	Image   string // image directory DIR
	Buffer  int
	Address uint64 // the buffer's device address
	Chunk   int
	File    string
	Err     error
}

func (e *ChunkError) Error() string {
	s := fmt.Sprintf("image %s: buffer %d (0x%x) chunk %d", e.Image, e.Buffer, e.Address, e.Chunk)
	if e.File != "" {
		s += " (" + e.File + ")"
	}
	return s + ": " + errorWithout(e.Err, e.File)
}

// errorWithout is err's message, less the path file where err is only about
// that file's type (the message names it already).
func errorWithout(err error, file string) string {
	var fte *FileTypeError
	if errors.As(err, &fte) && fte.Path == file && err == error(fte) {
		return fte.what()
	}
	return err.Error()
}

func (e *ChunkError) Unwrap() error { return e.Err }

// ManifestError is about a manifest file: unreadable, corrupt, of an unknown
// version, or with a parent that cannot be found.
type ManifestError struct {
	File string
	Err  error
}

func (e *ManifestError) Error() string {
	return "manifest " + e.File + ": " + errorWithout(e.Err, e.File)
}

func (e *ManifestError) Unwrap() error { return e.Err }

// corruptf builds an error that wraps ErrCorrupt with a description.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}
