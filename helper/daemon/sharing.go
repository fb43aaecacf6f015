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
// The relation is kept in the registry, under the server's mu: who imports
// which allocation, and where it maps it.

import (
	"fmt"
	"slices"
	"sort"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
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

// importPeer runs an ImportPeer: the fd that came with it is the one the
// client's application imports.
func (s *Server) importPeer(c *conn, cl *client, id uint64) *helperpb.Response {
	f := c.takeFD()
	if f == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "ImportPeer without the fd imported")
	}
	defer f.Close()
	aid, err := s.exports.find(int(f.Fd()))
	if err != nil {
		cl.log.Warn("peer import not looked up", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "not known for an export of memory the helper serves: %v", err)
	}
	s.mu.Lock()
	owner := s.reg.ownerOf(aid)
	if aid == 0 || owner == nil {
		s.mu.Unlock()
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "not an export of memory the helper serves")
	}
	owner.mu.Lock()
	al := owner.allocs[aid]
	owner.mu.Unlock()
	if al == nil {
		s.mu.Unlock()
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "allocation %d is gone", aid)
	}
	m := s.reg.sh.importersOf(aid)
	if _, ok := m[cl]; !ok {
		m[cl] = 0 // where it maps it: Mapped says
	}
	s.mu.Unlock()
	cl.log.Debug("peer import", zap.Uint64("alloc_id", aid), pidField("owner_pid", owner.pid))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Alloc{Alloc: &helperpb.AllocReply{AllocId: aid, Size: al.size}}}
}

// mappedImport records where cl maps its import aid; false if it imports
// no such allocation.
func (s *Server) mappedImport(cl *client, aid, addr uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.reg.sh.importers[aid]
	if _, ok := m[cl]; !ok {
		return false
	}
	m[cl] = addr
	return true
}

// endImport ends cl's import of aid (its Free); false if it had none.
func (s *Server) endImport(cl *client, aid uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.reg.sh.importers[aid]
	if _, ok := m[cl]; !ok {
		return false
	}
	delete(m, cl)
	if len(m) == 0 {
		delete(s.reg.sh.importers, aid)
	}
	return true
}

// handOver gives allocation al, which its owner lets go of, to an importer
// that still maps it: the memory lives on there (the driver would keep it
// for the importer's mapping too), and that process's image holds it from
// then on. False if nobody imports it: the caller releases it.
func (s *Server) handOver(from *client, al *alloc) bool {
	s.mu.Lock()
	heir, addr := s.reg.sh.heir(al.id)
	if heir == nil {
		s.reg.sh.forget(al.id)
		s.mu.Unlock()
		s.exports.forget(al.id)
		return false
	}
	delete(s.reg.sh.importers[al.id], heir)
	s.reg.own(al.id, heir)
	s.mu.Unlock()
	heir.mu.Lock()
	al.address = addr
	al.inherited = true
	heir.allocs[al.id] = al
	heir.bytes += al.size
	uid := heir.uid
	heir.mu.Unlock()
	s.exports.moveTo(al.id, uid)
	from.log.Info("shared allocation handed over to a process that still maps it", zap.Uint64("alloc_id", al.id),
		pidField("to_pid", heir.pid))
	return true
}

// peerGroup is cl and every client it shares memory with, directly or
// through others, by pid; just cl when it shares nothing.
func (s *Server) peerGroup(cl *client) []*client {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The edges: owner - importer, for every imported allocation.
	edges := map[*client][]*client{}
	for aid, m := range s.reg.sh.importers {
		owner := s.reg.ownerOf(aid)
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
func (s *Server) importInfos(cl *client) []image.ImportInfo {
	var out []image.ImportInfo
	for _, e := range s.importEntries(cl) {
		if e.ownerAddress != 0 {
			out = append(out, image.ImportInfo{Address: e.address, Size: e.al.size, OwnerPid: int(e.owner.pid),
				OwnerAddress: e.ownerAddress})
		}
	}
	return out
}

// importEntries are cl's mapped imports, by address, with their owners'
// records.
func (s *Server) importEntries(cl *client) []importEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []importEntry
	for aid, addr := range s.reg.sh.importsOf(cl) {
		owner := s.reg.ownerOf(aid)
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
func (s *Server) planImports(p *restorePlan, byPid map[int]*client) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if err != nil {
			for _, cl := range byPid {
				s.reg.sh.dropImporter(cl)
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
			s.reg.sh.importersOf(al.id)[cl] = imp.Address
		}
	}
	return nil
}
