package image

import (
	"errors"
	"io/fs"
	"os"
	"syscall"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// CheckFiles makes sure every chunk file the image refers to (here and in its
// ancestors) is there as a regular file of the size the manifest says,
// without reading any: a cheap check a restore runs before it changes
// anything, so that a missing or truncated file refuses it early. Damage
// inside a file is found when the chunk is read. The error is the first
// *ChunkError (errors.Is ErrCorrupt).
func (im *Image) CheckFiles() error {
	seen := map[string]bool{}
	for bi, b := range im.m.GetBuffers() {
		for ci, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_ZERO {
				continue
			}
			file := im.ChunkFile(bi, ci)
			if seen[file] {
				continue
			}
			seen[file] = true
			f, err := openChunkFile(file, c)
			if err != nil {
				return &ChunkError{Image: im.dir, Buffer: bi, Address: b.GetAddress(), Chunk: ci, File: file, Err: err}
			}
			f.Close()
		}
	}
	return nil
}

// openChunkFile opens a chunk file and checks what can be checked without
// reading it: it is there, is no symlink (O_NOFOLLOW: refused, not followed)
// and is a regular file of the size the manifest says.
func openChunkFile(file string, c *imagepb.Chunk) (*os.File, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, corruptf("chunk file missing")
	case errors.Is(err, syscall.ELOOP):
		return nil, corruptf("chunk file is a symlink")
	case err != nil:
		return nil, err
	}
	info, err := f.Stat()
	if err == nil && (!info.Mode().IsRegular() || info.Size() != int64(c.GetStoredSize())) {
		err = corruptf("chunk file has %d bytes, manifest says %d (truncated or replaced)", info.Size(), c.GetStoredSize())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
