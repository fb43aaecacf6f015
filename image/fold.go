package image

// Folding an image's ancestors into it: every chunk the committed image in
// DIR reads from an ancestor's directory is hard-linked into DIR (copied
// where it cannot be linked), and the manifest is rewritten to read them
// there. Afterwards the image needs none of its ancestors. gpucr checkpoint
// folds a pre-copy's rounds (DIR/gpucr-pre-copy/..., which the image was
// written against) into the image once it is committed, and then removes
// them: the image directory holds the image once, not once per round.
//
// Crash safety: the links are made (and made durable) before the manifest
// is replaced, atomically; a crash before leaves the image as it was, with
// files no manifest names yet (the next write into DIR, or gc, removes
// them); a crash after leaves the folded image, and ancestors nothing
// reads any more.

import (
	"fmt"
	"io"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// FoldReport says what FoldParents did.
type FoldReport struct {
	Linked, Copied int // chunk files made in DIR
}

// FoldParents makes the committed image in dir read nothing from its
// ancestors (see the file's comment). own, as Options.Owner, must own the
// image and every ancestor it reads (nil: anyone's, unchecked). The
// manifest keeps a parent only where the chain leads out of dir (the image
// a pre-copy's first round was written against), as where the image came
// from; nothing reads it. An image that reads no ancestor is left as it is.
func FoldParents(dir string, own *Owner) (*FoldReport, error) {
	rep := &FoldReport{}
	real, err := realDir(dir)
	if err != nil {
		return nil, err
	}
	top, err := openDirPath(real)
	if err != nil {
		return nil, fmt.Errorf("fold %s: %w", dir, err)
	}
	defer top.close()
	g, err := openSubDir(top, own)
	if err != nil {
		return nil, err
	}
	defer g.close()
	lock, err := lockDir(g, own)
	if err != nil {
		return nil, fmt.Errorf("fold %s: %w", dir, err)
	}
	defer lock.Close()
	m, err := loadManifestAt(g, own)
	if err != nil {
		return nil, err
	}
	need := maxAncestor(m)
	if need == 0 {
		return rep, nil
	}
	// The chain through a descriptor of its own: resolveChain takes over
	// the one it is given.
	g2, err := top.openDir(SubDir, own)
	if err != nil {
		return nil, err
	}
	_, gdirs, err := resolveChain(real, g2, m, need, own)
	if err != nil {
		return nil, fmt.Errorf("fold %s: %w", dir, err)
	}
	defer func() {
		for _, d := range gdirs {
			d.close()
		}
	}()
	// Ancestors stay as they are meanwhile: gc takes their lock.
	for _, a := range gdirs[1:] {
		l, err := lockShared(a, own)
		if err != nil {
			return nil, fmt.Errorf("fold %s: %w", dir, err)
		}
		if l != nil {
			defer l.Close()
		}
	}
	chunks, _, err := g.mkdir(chunksName, own)
	if err != nil {
		return nil, fmt.Errorf("fold %s: %w", dir, err)
	}
	s := &chunkStore{g: g, chunks: chunks, own: own, local: map[chunkHash]*localChunk{}, tmpTag: "fold"}
	defer s.close()
	folded := cloneManifest(m)
	done := map[chunkHash]storedChunk{}
	for _, b := range folded.GetBuffers() {
		for _, c := range b.GetChunks() {
			if c.GetLocation() != imagepb.Location_LOCATION_PARENT {
				continue
			}
			h, _ := hashFromBytes(c.GetHash())
			meta, ok := done[h]
			if !ok {
				pc := storedChunk{loc: imagepb.Location_LOCATION_PARENT, ancestor: c.GetAncestor(), crc: c.GetCrc32C(),
					comp: c.GetCompression(), storedSize: c.GetStoredSize()}
				src := gdirs[c.GetAncestor()]
				meta = storedChunk{loc: imagepb.Location_LOCATION_LOCAL, crc: pc.crc, comp: pc.comp, storedSize: pc.storedSize}
				if s.link(h, pc, src) {
					meta.linked = true
					rep.Linked++
				} else {
					if err := s.copyFrom(h, pc, src); err != nil {
						_ = s.removeCreated()
						return nil, fmt.Errorf("fold %s: chunk %s of %s: %w", dir, h, src.path, err)
					}
					rep.Copied++
				}
				done[h] = meta
			}
			c.Location, c.Ancestor, c.Linked = imagepb.Location_LOCATION_LOCAL, 0, meta.linked
		}
	}
	folded.Parent = outsideParent(real, m, own)
	if err := s.sync(top); err != nil {
		_ = s.removeCreated()
		return nil, fmt.Errorf("fold %s: %w", dir, err)
	}
	if renamed, err := storeManifest(g, folded, own); err != nil {
		if !renamed {
			_ = s.removeCreated()
		}
		return nil, fmt.Errorf("fold %s: %w", dir, err)
	}
	return rep, nil
}

// copyFrom writes a copy of the ancestor's chunk file of h (in src, its
// gpucr/) into DIR, as writeFile does: where it cannot be linked (another
// file system). The stored bytes are copied as they are; every read checks
// them.
func (s *chunkStore) copyFrom(h chunkHash, pc storedChunk, src *fsDir) error {
	f, err := src.openFile(chunkRel(h), unix.O_RDONLY, s.own)
	if err != nil {
		return err
	}
	defer f.Close()
	data := make([]byte, pc.storedSize)
	if _, err := io.ReadFull(f, data); err != nil {
		return fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return s.writeFile(h, data)
}

// outsideParent is the parent reference the folded image keeps: the first
// image of its chain that lies outside dir, as seen from dir, with its id
// (nil if the chain stays inside dir, or cannot be followed).
func outsideParent(real string, m *imagepb.Manifest, own *Owner) *imagepb.Parent {
	cur, p := real, m.GetParent()
	for depth := 0; p != nil && depth <= MaxChainDepth; depth++ {
		next, err := realDir(filepath.Join(cur, p.GetPath()))
		if err != nil {
			return nil
		}
		if !within(next, real) {
			rel, err := filepath.Rel(real, next)
			if err != nil || checkParentPath(rel) != nil {
				return nil
			}
			return &imagepb.Parent{Path: rel, ImageId: p.GetImageId()}
		}
		top, err := openDirPath(next)
		if err != nil {
			return nil
		}
		g, err := openSubDir(top, own)
		top.close()
		if err != nil {
			return nil
		}
		pm, err := loadManifestAt(g, own)
		g.close()
		if err != nil || string(pm.GetImageId()) != string(p.GetImageId()) {
			return nil
		}
		cur, p = next, pm.GetParent()
	}
	return nil
}
