package image

import (
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

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
			f, err := im.openChunk(bi, ci)
			if err != nil {
				return &ChunkError{Image: im.dir, Buffer: bi, Address: b.GetAddress(), Chunk: ci, File: file, Err: err}
			}
			f.Close()
		}
	}
	return nil
}

// openChunk opens the file of chunk ci of buffer bi (not a zero chunk)
// beneath its image's DIR/gpucr and checks what can be checked without
// reading it: it is there, is a regular file (not a symlink, which is not
// followed, nor a FIFO, which is not waited on) and has the size the
// manifest says.
func (im *Image) openChunk(bi, ci int) (*os.File, error) {
	c := im.m.GetBuffers()[bi].GetChunks()[ci]
	h, _ := hashFromBytes(c.GetHash()) // validated with the manifest
	f, err := im.gdirs[c.GetAncestor()].openFile(chunkRel(h), unix.O_RDONLY, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, corruptf("chunk file missing")
	}
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err == nil && info.Size() != int64(c.GetStoredSize()) {
		err = corruptf("chunk file has %d bytes, manifest says %d (truncated or replaced)", info.Size(), c.GetStoredSize())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
