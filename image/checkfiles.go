package image

import (
	"errors"
	"io/fs"
	"os"

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
			if err := checkFile(file, c); err != nil {
				return &ChunkError{Image: im.dir, Buffer: bi, Address: b.GetAddress(), Chunk: ci, File: file, Err: err}
			}
		}
	}
	return nil
}

func checkFile(file string, c *imagepb.Chunk) error {
	info, err := os.Lstat(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return corruptf("chunk file missing")
	case err != nil:
		return err
	case info.Mode()&fs.ModeSymlink != 0:
		return corruptf("chunk file is a symlink")
	case !info.Mode().IsRegular() || info.Size() != int64(c.GetStoredSize()):
		return corruptf("chunk file has %d bytes, manifest says %d (truncated or replaced)", info.Size(), c.GetStoredSize())
	}
	return nil
}
