package daemon

// Memory shared between clients, as the ranks of an NCCL job share it: one
// rank's allocation, exported (Export) and imported by its peers
// (ImportPeer). The helper keeps the one fd it exports of an allocation,
// and knows an imported fd for it by kcmp(2): the very file, passed on by
// SCM_RIGHTS or pidfd_getfd, whatever the fd's number in the importer
// (exports.go).
// An import is the importer's from then on: it maps it (Mapped), drops and
// reimports it with its own memory around a checkpoint, and a restore maps
// the owner's restored memory at the same address again. The owner's data
// goes into the image once, with the owner.
//
// The relation is kept in the registry, under its lock: who imports which
// allocation, and where it maps it.

import (
	"fmt"
	"slices"
	"sort"

	"github.com/gpucr/gpucr/image"
)

// shares is the sharing part of the registry.
type shares struct {
	// importers: for each allocation, the clients that import it and
	// where each maps it (0: not mapped yet).
	importers map[uint64]map[*client]uint64
}

func newShares() shares {
	return shares{importers: map[uint64]map[*client]uint64{}}
}

// forget drops the imports of allocation id (its memory is released).
func (sh *shares) forget(id uint64) { delete(sh.importers, id) }

// importsOf lists the allocations cl imports and where it maps them (0: not
// mapped), by id.
func (sh *shares) importsOf(cl *client) map[uint64]uint64 {
	out := map[uint64]uint64{}
	for id, m := range sh.importers {
		if addr, ok := m[cl]; ok {
			out[id] = addr
		}
	}
	return out
}

// importersOf is the importers of allocation id, made empty if it had none.
func (sh *shares) importersOf(id uint64) map[*client]uint64 {
	m := sh.importers[id]
	if m == nil {
		m = map[*client]uint64{}
		sh.importers[id] = m
	}
	return m
}

// dropImporter forgets every import of cl (it is gone).
func (sh *shares) dropImporter(cl *client) {
	for id, m := range sh.importers {
		delete(m, cl)
		if len(m) == 0 {
			delete(sh.importers, id)
		}
	}
}

// heir is the importer that takes over allocation id when its owner lets
// it go while others still map it (nil: none maps it). The lowest pid, so
// that the choice does not depend on map order.
func (sh *shares) heir(id uint64) (*client, uint64) {
	var best *client
	var addr uint64
	for cl, a := range sh.importers[id] {
		if a != 0 && (best == nil || cl.pid < best.pid) {
			best, addr = cl, a
		}
	}
	return best, addr
}

// addImport records that cl imports allocation aid (the fd of an
// ImportPeer): the allocation and its owner, or why it is refused.
func (r *registry) addImport(cl *client, aid uint64) (*alloc, *client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	owner := r.owner[aid]
	if aid == 0 || owner == nil {
		return nil, nil, fmt.Errorf("not an export of memory the helper serves")
	}
	owner.mu.Lock()
	al := owner.allocs[aid]
	owner.mu.Unlock()
	if al == nil {
		return nil, nil, fmt.Errorf("allocation %d is gone", aid)
	}
	m := r.sh.importersOf(aid)
	if _, ok := m[cl]; !ok {
		m[cl] = 0 // where it maps it: Mapped says
	}
	return al, owner, nil
}

// mappedImport records where cl maps its import aid; false if it imports
// no such allocation.
func (r *registry) mappedImport(cl *client, aid, addr uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.sh.importers[aid]
	if _, ok := m[cl]; !ok {
		return false
	}
	m[cl] = addr
	return true
}

// endImport ends cl's import of aid (its Free); false if it had none.
func (r *registry) endImport(cl *client, aid uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.sh.importers[aid]
	if _, ok := m[cl]; !ok {
		return false
	}
	delete(m, cl)
	if len(m) == 0 {
		delete(r.sh.importers, aid)
	}
	return true
}

// handOver gives allocation al, which its owner lets go of, to an importer
// that still maps it: the memory lives on there (the driver would keep it
// for the importer's mapping too), and that process's image holds it from
// then on. Nil if nobody imports it: the caller releases it. heirUID is
// whom the memory counts against from then on.
func (r *registry) handOver(al *alloc) (heir *client, heirUID uint32) {
	r.mu.Lock()
	heir, addr := r.sh.heir(al.id)
	if heir == nil {
		r.sh.forget(al.id)
		r.mu.Unlock()
		return nil, 0
	}
	delete(r.sh.importers[al.id], heir)
	r.owner[al.id] = heir
	r.mu.Unlock()
	heir.mu.Lock()
	al.address = addr
	al.inherited = true
	heir.allocs[al.id] = al
	heir.bytes += al.size
	heirUID = heir.uid
	heir.mu.Unlock()
	return heir, heirUID
}

// importsOf lists the allocations cl imports and where it maps them (0: not
// mapped), by id.
func (r *registry) importsOf(cl *client) map[uint64]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sh.importsOf(cl)
}

// dropImporter forgets every import of cl (it is gone).
func (r *registry) dropImporter(cl *client) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sh.dropImporter(cl)
}

// peerGroup is cl and every client it shares memory with, directly or
// through others, by pid; just cl when it shares nothing.
func (r *registry) peerGroup(cl *client) []*client {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The edges: owner - importer, for every imported allocation.
	edges := map[*client][]*client{}
	for aid, m := range r.sh.importers {
		owner := r.owner[aid]
		if owner == nil {
			continue
		}
		for imp := range m {
			edges[owner] = append(edges[owner], imp)
			edges[imp] = append(edges[imp], owner)
		}
	}
	seen := map[*client]bool{cl: true}
	group := []*client{cl}
	for i := 0; i < len(group); i++ {
		for _, o := range edges[group[i]] {
			if !seen[o] {
				seen[o] = true
				group = append(group, o)
			}
		}
	}
	slices.SortFunc(group, func(a, b *client) int { return int(a.pid) - int(b.pid) })
	return group
}

// importInfos are cl's mapped imports as the image records them.
func (r *registry) importInfos(cl *client) []image.ImportInfo {
	var out []image.ImportInfo
	for _, e := range r.importEntries(cl) {
		if e.ownerAddress != 0 {
			out = append(out, image.ImportInfo{Address: e.address, Size: e.al.size, OwnerPid: int(e.owner.pid),
				OwnerAddress: e.ownerAddress})
		}
	}
	return out
}

// importEntries are cl's mapped imports, by address, with their owners'
// records.
func (r *registry) importEntries(cl *client) []importEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []importEntry
	for aid, addr := range r.sh.importsOf(cl) {
		owner := r.owner[aid]
		if addr == 0 || owner == nil {
			continue
		}
		owner.mu.Lock()
		al := owner.allocs[aid]
		var oaddr uint64
		if al != nil {
			oaddr = al.address
		}
		owner.mu.Unlock()
		if al != nil {
			out = append(out, importEntry{al: al, owner: owner, address: addr, ownerAddress: oaddr})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].address < out[j].address })
	return out
}

// importEntry is one import of a client: the owner's allocation, and where
// the client maps it.
type importEntry struct {
	al           *alloc
	owner        *client
	address      uint64 // where the client maps it
	ownerAddress uint64 // where its owner does
}

// planImports gives each restored client of p the imports its process had:
// the owner's restored allocation at the address the importer mapped it.
func (r *registry) planImports(p *restorePlan, byPid map[int]*client) (err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() {
		if err != nil {
			for _, cl := range byPid {
				r.sh.dropImporter(cl)
			}
		}
	}()
	for _, pr := range p.im.Processes() {
		cl := byPid[pr.Pid]
		if cl == nil {
			continue
		}
		for _, imp := range pr.Imports {
			owner := byPid[imp.OwnerPid]
			var al *alloc
			if owner != nil {
				for _, a := range owner.allocs {
					if a.address == imp.OwnerAddress {
						al = a
						break
					}
				}
			}
			if al == nil {
				return fmt.Errorf("process %d maps memory of process %d at 0x%x, which the image does not hold",
					pr.Pid, imp.OwnerPid, imp.OwnerAddress)
			}
			if al.size != imp.Size {
				return fmt.Errorf("process %d maps %d bytes of process %d's buffer at 0x%x, which has %d",
					pr.Pid, imp.Size, imp.OwnerPid, imp.OwnerAddress, al.size)
			}
			r.sh.importersOf(al.id)[cl] = imp.Address
		}
	}
	return nil
}
