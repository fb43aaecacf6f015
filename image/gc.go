package image

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// GCReport says what GC did (or, dry run, would do).
type GCReport struct {
	DryRun        bool
	Dirs          []GCDir // the kept images first, in keep order, then their ancestors
	ChunksDeleted int
	BytesFreed    int64
	Pruned        []string // ancestors marked pruned
}

// GCDir is one image directory GC looked at.
type GCDir struct {
	Dir           string // resolved path
	Kept          bool   // named in keep
	ChunksKept    int    // chunk files some kept image refers to
	ChunksDeleted int
	BytesFreed    int64 // chunk files and temporary files
	TempRemoved   []string
	Pruned        bool // marked pruned by this GC
	WasPruned     bool // already pruned before
}

// gcNode is one image directory of the kept images' chains.
type gcNode struct {
	dir   string
	g     *fsDir // DIR/gpucr, open: everything gc touches is beneath it
	own   *Owner // whose image it is (its gpucr/'s owner): what gc writes there stays theirs
	m     *imagepb.Manifest
	kept  bool
	chain []*gcNode // itself, then its ancestors as far as they resolve
	refs  map[chunkHash]bool
	rep   *GCDir
}

// GC keeps the images in keep and every chunk file they refer to, in their
// own directories and along their parent chains as far as their chunks
// reach. In each directory of those chains it deletes the chunk files no
// kept image refers to and leftover temporary files. An ancestor that is
// not in keep and loses chunks it needs has its manifest marked pruned
// first (atomically), so that it is refused with ErrPruned instead of
// failing later on a missing chunk; its kept descendants stay restorable.
// An image no kept image reads a chunk from is not touched: a
// self-contained image (Options.SelfContained) needs none of its
// ancestors, so gc of it leaves them whole. With dryRun nothing is
// changed.
//
// GC refuses to run (and changes nothing) if a kept image cannot be opened
// or an ancestor its chunks need is missing: what they need would be unknown.
func GC(keep []string, dryRun bool) (*GCReport, error) {
	return GCWith(keep, GCOptions{DryRun: dryRun})
}

// GCOptions are GCWith's settings.
type GCOptions struct {
	DryRun bool
	// Confined: every image GC reads or changes must belong to the owner of
	// the path that each keep names, as that path itself is seen (a
	// symlink's own owner; a process other than root: the process's own
	// uid), and be reached through no symlink of another user than that
	// owner or root. An image of another user, a kept one or an ancestor,
	// makes GC refuse (ErrOwner), changing nothing. For a root that runs gc
	// on paths users may have named or made.
	Confined bool
}

// GCWith is GC with options.
func GCWith(keep []string, opts GCOptions) (*GCReport, error) {
	dryRun := opts.DryRun
	order, err := gcGraph(keep, opts.Confined)
	defer func() {
		for _, n := range order {
			n.g.close()
		}
	}()
	if err != nil {
		return nil, err
	}
	// What the kept images need, per directory.
	for _, n := range order {
		if n.kept {
			if err := n.eachNeeded(func(at *gcNode, h chunkHash) { at.refs[h] = true }); err != nil {
				return nil, err
			}
		}
	}
	rep := &GCReport{DryRun: dryRun}
	for _, n := range order {
		n.rep = &GCDir{Dir: n.dir, Kept: n.kept, WasPruned: n.m.GetPruned()}
		rep.Dirs = append(rep.Dirs, *n.rep)
	}
	if !dryRun {
		for _, n := range order {
			lock, err := lockDir(n.g, n.own)
			if err != nil {
				return nil, fmt.Errorf("gc: %w", err)
			}
			defer lock.Close()
		}
	}

	// 1. Mark pruned before deleting: a crash in between leaves a pruned
	// image whose chunks are all still there, never an unmarked image with
	// chunks missing.
	for _, n := range order {
		if n.kept || n.m.GetPruned() {
			continue
		}
		loses := false
		// Chunks in ancestors beyond the walked chain are in directories
		// gc does not sweep: they are not lost.
		n.eachKnown(func(at *gcNode, h chunkHash) {
			if !at.refs[h] {
				loses = true
			}
		})
		if !loses {
			continue
		}
		n.rep.Pruned = true
		rep.Pruned = append(rep.Pruned, n.dir)
		if !dryRun {
			m := cloneManifest(n.m)
			m.Pruned = true
			if _, err := storeManifest(n.g, m, n.own); err != nil {
				return nil, fmt.Errorf("gc: mark %s pruned: %w", n.dir, err)
			}
		}
	}
	// 2. Delete unreferenced chunk files and temporary files.
	var errs []error
	for _, n := range order {
		if err := n.sweep(dryRun); err != nil {
			errs = append(errs, err)
		}
		rep.ChunksDeleted += n.rep.ChunksDeleted
		rep.BytesFreed += n.rep.BytesFreed
	}
	for i, n := range order {
		rep.Dirs[i] = *n.rep
	}
	return rep, errors.Join(errs...)
}

// gcGraph loads the kept images and walks their parent chains. The nodes
// it returns (also with an error) hold their gpucr/ open.
func gcGraph(keep []string, confined bool) (order []*gcNode, err error) {
	nodes := map[string]*gcNode{}
	// get returns the node of dir, loading its manifest the first time; a
	// node is registered (and so swept) only once it is known to belong:
	// named in keep, or the ancestor a manifest's parent id names.
	get := func(dir string, wantID []byte) (*gcNode, error) {
		n, ok := nodes[dir]
		if !ok {
			top, err := openDirPath(dir)
			if err != nil {
				return nil, &ManifestError{File: ManifestPath(dir), Err: err}
			}
			g, err := openSubDir(top, nil)
			top.close()
			if err != nil {
				return nil, err
			}
			m, err := loadManifestAt(g, nil)
			if err != nil {
				g.close()
				return nil, err
			}
			n = &gcNode{dir: dir, g: g, m: m, refs: map[chunkHash]bool{}}
			if fi, err := g.f.Stat(); err == nil {
				st := fi.Sys().(*syscall.Stat_t)
				n.own = &Owner{UID: int(st.Uid), GID: int(st.Gid)}
			}
		}
		if wantID != nil && string(n.m.GetImageId()) != string(wantID) {
			if !ok {
				n.g.close()
			}
			return nil, fmt.Errorf("%s now holds another image", dir)
		}
		if !ok {
			nodes[dir] = n
			order = append(order, n)
		}
		return n, nil
	}
	// owners[i]: whose images keep[i]'s chain must be (-1: anyone's).
	owners := make([]int, len(keep))
	resolve := func(path string, uid int) (string, error) {
		if uid < 0 {
			return realDir(path)
		}
		return ownedPath(path, uid)
	}
	// check refuses a node that is not uid's.
	check := func(n *gcNode, uid int) error {
		if uid >= 0 && (n.own == nil || n.own.UID != uid) {
			got := -1
			if n.own != nil {
				got = n.own.UID
			}
			return &OwnerError{Path: filepath.Join(n.dir, SubDir), UID: got, Want: uid}
		}
		return nil
	}
	var kept []*gcNode
	for i, k := range keep {
		owners[i] = -1
		if confined {
			if owners[i], err = pathOwner(k); err != nil {
				return order, fmt.Errorf("gc: keep %s: %w", k, err)
			}
		}
		real, err := resolve(k, owners[i])
		if err != nil {
			return order, fmt.Errorf("gc: keep %s: %w", k, err)
		}
		n, err := get(real, nil)
		if err == nil {
			err = check(n, owners[i])
		}
		if err != nil {
			return order, fmt.Errorf("gc: keep %s: %w", k, err)
		}
		n.kept = true
		kept = append(kept, n)
	}
	// Walk each chain from its start as far as its chunks reach; an
	// ancestor reached from several kept images is loaded once.
	for i, start := range kept {
		need := maxAncestor(start.m)
		chain := []*gcNode{start}
		for cur := start; cur.m.GetParent() != nil && len(chain) <= need; {
			p := cur.m.GetParent()
			next, err := resolve(filepath.Join(cur.dir, p.GetPath()), owners[i])
			if errors.Is(err, ErrOwner) {
				return order, fmt.Errorf("gc: %s: its ancestor %d: %w", start.dir, len(chain), err)
			}
			var n *gcNode
			if err == nil {
				n, err = get(next, p.GetImageId())
			}
			if err == nil {
				if oerr := check(n, owners[i]); oerr != nil {
					return order, fmt.Errorf("gc: %s: its ancestor %d: %w", start.dir, len(chain), oerr)
				}
			}
			if err != nil {
				err = fmt.Errorf("%w: %w", ErrMissingParent, err)
			}
			if err != nil {
				return order, fmt.Errorf("gc: %s needs ancestor %d: %w", start.dir, len(chain), err)
			}
			if n == start || containsNode(chain, n) {
				return order, fmt.Errorf("gc: %s: %w", start.dir, corruptf("parent chain loops at %s", n.dir))
			}
			chain = append(chain, n)
			cur = n
		}
		for i, n := range chain {
			if len(n.chain) < len(chain)-i {
				n.chain = chain[i:]
			}
		}
	}
	for _, n := range order {
		if n.chain == nil {
			n.chain = []*gcNode{n}
		}
	}
	return order, nil
}

func containsNode(chain []*gcNode, n *gcNode) bool {
	for _, c := range chain {
		if c == n {
			return true
		}
	}
	return false
}

// eachNeeded calls f with the directory and hash of every chunk file n's
// manifest refers to.
func (n *gcNode) eachNeeded(f func(at *gcNode, h chunkHash)) error {
	for bi, b := range n.m.GetBuffers() {
		for ci, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_ZERO {
				continue
			}
			if int(c.GetAncestor()) >= len(n.chain) {
				return fmt.Errorf("gc: %s: buffer %d chunk %d: %w: ancestor %d not found", n.dir, bi, ci,
					ErrMissingParent, c.GetAncestor())
			}
			h, _ := hashFromBytes(c.GetHash())
			f(n.chain[c.GetAncestor()], h)
		}
	}
	return nil
}

// eachKnown is eachNeeded of the chunks whose ancestor is in n's chain as
// walked (the others are in directories gc leaves alone).
func (n *gcNode) eachKnown(f func(at *gcNode, h chunkHash)) {
	for _, b := range n.m.GetBuffers() {
		for _, c := range b.GetChunks() {
			if c.GetLocation() == imagepb.Location_LOCATION_ZERO || int(c.GetAncestor()) >= len(n.chain) {
				continue
			}
			h, _ := hashFromBytes(c.GetHash())
			f(n.chain[c.GetAncestor()], h)
		}
	}
}

// sweep deletes n's chunk files nobody kept refers to, and temporary files.
// Only names this package writes (chunks/HH/HASH with HH = HASH[:2]) are
// candidates, and only regular files; everything is reached beneath n's
// gpucr/, no symlink followed.
func (n *gcNode) sweep(dryRun bool) error {
	var errs []error
	cdir, err := n.g.openDir(chunksName, nil)
	var subs []fs.DirEntry
	if err == nil {
		defer cdir.close()
		subs, err = readDir(cdir)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gc: %w", err)
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].Name() < subs[j].Name() })
	for _, sub := range subs {
		if !sub.IsDir() || len(sub.Name()) != 2 {
			continue
		}
		if err := n.sweepSub(cdir, sub.Name(), dryRun); err != nil {
			errs = append(errs, err)
		}
	}
	temps, size, err := removeTemps(n.g, dryRun)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	n.rep.TempRemoved = temps
	n.rep.BytesFreed += size
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gc %s: %w", n.dir, err)
	}
	return nil
}

// sweepSub is sweep of one chunks/HH.
func (n *gcNode) sweepSub(cdir *fsDir, name string, dryRun bool) error {
	sd, err := cdir.openDir(name, nil)
	if err != nil {
		return err
	}
	defer sd.close()
	ents, err := readDir(sd)
	if err != nil {
		return err
	}
	var errs []error
	deleted := false
	for _, e := range ents {
		h, ok := parseHashName(e.Name())
		if !ok || e.Name()[:2] != name || !e.Type().IsRegular() {
			continue
		}
		if n.refs[h] {
			n.rep.ChunksKept++
			continue
		}
		if info, err := e.Info(); err == nil {
			n.rep.BytesFreed += info.Size()
		}
		if !dryRun {
			if err := unix.Unlinkat(sd.fd(), e.Name(), 0); err != nil && err != unix.ENOENT {
				errs = append(errs, &fs.PathError{Op: "remove", Path: sd.join(e.Name()), Err: err})
				continue
			}
			deleted = true
		}
		n.rep.ChunksDeleted++
	}
	if deleted {
		if err := sd.sync(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func cloneManifest(m *imagepb.Manifest) *imagepb.Manifest {
	return proto.Clone(m).(*imagepb.Manifest)
}
