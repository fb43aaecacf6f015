package image

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// maxVerifyErrors bounds the errors Verify lists; the rest are counted.
const maxVerifyErrors = 1000

// Verify reads every chunk the image refers to, in this image and in its
// ancestors, and checks each file's size, CRC32C and content hash. A file
// shared by several chunks is read once. It returns nil or the errors joined
// (each a *ChunkError naming buffer, address, chunk and file; errors.Is
// ErrCorrupt), at most maxVerifyErrors of them, and those of the template
// scripts of served processes (ErrTemplateDamaged).
func (im *Image) Verify() error {
	type fileKey struct {
		ancestor   uint32
		hash       string
		crc        uint32
		comp       imagepb.Compression
		size, stor uint32
	}
	type task struct {
		bi, ci int
		err    error
	}
	keyOf := func(c *imagepb.Chunk) fileKey {
		return fileKey{c.GetAncestor(), string(c.GetHash()), c.GetCrc32C(), c.GetCompression(), c.GetSize(), c.GetStoredSize()}
	}
	tasks := map[fileKey]*task{}
	var order []*task
	for bi, b := range im.m.GetBuffers() {
		for ci, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_ZERO {
				continue
			}
			if _, ok := tasks[keyOf(c)]; !ok {
				t := &task{bi: bi, ci: ci}
				tasks[keyOf(c)] = t
				order = append(order, t)
			}
		}
	}

	work := make(chan *task)
	var wg sync.WaitGroup
	for w := 0; w < im.opts.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range work {
				buf := im.getBuf()
				c := im.m.GetBuffers()[t.bi].GetChunks()[t.ci]
				t.err = im.loadCheck(t.bi, t.ci, (*buf)[:c.GetSize()], true)
				im.putBuf(buf)
			}
		}()
	}
	for _, t := range order {
		work <- t
	}
	close(work)
	wg.Wait()

	// Report every chunk whose file failed, in manifest order.
	var errs []error
	more := 0
	for bi, b := range im.m.GetBuffers() {
		for ci, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_ZERO {
				continue
			}
			t := tasks[keyOf(c)]
			if t.err == nil {
				continue
			}
			if len(errs) == maxVerifyErrors {
				more++
				continue
			}
			var ce *ChunkError
			if errors.As(t.err, &ce) {
				errs = append(errs, &ChunkError{Image: im.dir, Buffer: bi, Address: b.GetAddress(), Chunk: ci,
					File: im.ChunkFile(bi, ci), Err: ce.Err})
			} else {
				errs = append(errs, t.err)
			}
		}
	}
	if more > 0 {
		errs = append(errs, fmt.Errorf("%w: %d more damaged chunks not listed", ErrCorrupt, more))
	}
	// Served processes' template scripts, against their size and hash.
	for _, p := range im.m.GetProcesses() {
		if p.GetTemplate() == nil {
			continue
		}
		f, err := im.TemplateScript(int(p.GetPid()))
		if err != nil {
			errs = append(errs, err)
		} else if f != nil {
			f.Close()
		}
	}
	return errors.Join(errs...)
}
