package daemon

// Resident images: an image's GPU data kept in device memory the helper
// holds (`gpucr image load DIR`), loaded from storage and checked against
// its hashes once. A restore of that image then copies each buffer on the
// device into the process's new memory instead of reading it from storage
// and moving it over PCIe, and the resident copy stays for the next restore
// (replicas of a warmed-up server). The copies take memory beyond what the
// restored processes hold; the helper bounds them all by its budget
// (--resident-memory) and gives them up when a device runs out of memory
// for a process (create), so that they never make a job's allocation fail.
//
// A resident copy is of one image directory (device and inode) and one
// image in it (the manifest's image id): a checkpoint written into the
// directory since, or another directory, is read from storage as before.
//
// A resident copy is its loader's GPU memory: it counts against the
// loader's limit (--max-gpu-memory-per-uid) like the loader's processes'
// memory, only the loader (or root) may give it up, and only the loader
// (and root) sees it in Status. It serves only restores of an image of the
// owner whose image it was loaded from.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/served"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// residentKey names an image directory: its device and inode.
type residentKey struct{ dev, ino uint64 }

func residentKeyOf(f *os.File) (residentKey, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return residentKey{}, err
	}
	return residentKey{uint64(st.Dev), st.Ino}, nil
}

// resident is one image's GPU data in helper memory.
type resident struct {
	key   residentKey
	dir   string
	id    []byte // the manifest's image id
	owner uint32 // who loaded it: its memory is this uid's
	// imageOwner owns the image it was loaded from (the loader itself,
	// unless root loaded another user's image).
	imageOwner uint32
	regions    []engine.Region // one per image buffer, in image order
	made       []*alloc
	bytes      uint64
	loaded     time.Time
	restores   atomic.Uint64

	// mu: restores copying from it hold it shared; giving it up takes it
	// whole, so the memory goes only once no copy reads it.
	mu   sync.RWMutex
	gone bool // given up (under mu)
}

// residentSet is the helper's resident images, by directory, and the bytes
// of loads under way. It has its own lock, which it never holds while it
// takes another.
type residentSet struct {
	mu      sync.Mutex
	byKey   map[residentKey]*resident
	pending uint64
}

func (rs *residentSet) get(key residentKey) *resident {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.byKey[key]
}

// reserve counts size bytes of a load of the image id into key's place
// against limit: false, with the bytes held now, when they do not fit;
// already when that image is resident there. unreserve gives them back.
func (rs *residentSet) reserve(key residentKey, id []byte, size, limit uint64) (ok, already bool, held uint64) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if old := rs.byKey[key]; old != nil && bytes.Equal(old.id, id) {
		return false, true, 0
	}
	held = rs.pending
	for _, r := range rs.byKey {
		held += r.bytes
	}
	if held+size > limit {
		return false, false, held
	}
	rs.pending += size
	return true, false, held
}

func (rs *residentSet) unreserve(size uint64) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.pending -= size
}

// put makes r the resident image of its directory, returning the one it
// replaces (nil: none).
func (rs *residentSet) put(r *resident) (old *resident) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.byKey == nil {
		rs.byKey = map[residentKey]*resident{}
	}
	old = rs.byKey[r.key]
	rs.byKey[r.key] = r
	return old
}

// take removes and returns key's resident image, if uid may unload it
// (root, or the uid that loaded it); refused: it is another's, and stays.
func (rs *residentSet) take(key residentKey, uid uint32) (r *resident, refused bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r = rs.byKey[key]
	if r != nil && uid != 0 && r.owner != uid {
		return r, true
	}
	delete(rs.byKey, key)
	return r, false
}

// bytesOf is the device memory uid's resident copies hold.
func (rs *residentSet) bytesOf(uid uint32) uint64 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var n uint64
	for _, r := range rs.byKey {
		if r.owner == uid {
			n += r.bytes
		}
	}
	return n
}

// takeOldestOn removes and returns the oldest resident image holding memory
// on dev (nil: none does).
func (rs *residentSet) takeOldestOn(dev Device) *resident {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var oldest *resident
	for _, r := range rs.byKey {
		for _, al := range r.made {
			if al.dev == dev {
				if oldest == nil || r.loaded.Before(oldest.loaded) {
					oldest = r
				}
				break
			}
		}
	}
	if oldest != nil {
		delete(rs.byKey, oldest.key)
	}
	return oldest
}

// status lists every resident image for Status (residentsSeenBy picks a
// caller's).
// templates counts each directory's templates (templatesOf).
func (rs *residentSet) status(templates map[string]uint32) []*helperpb.ResidentImage {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []*helperpb.ResidentImage
	for _, r := range rs.byKey {
		out = append(out, &helperpb.ResidentImage{ImageDir: r.dir, Bytes: r.bytes, Buffers: uint32(len(r.made)),
			OwnerUid: r.owner, LoadedUnixMs: r.loaded.UnixMilli(), Restores: r.restores.Load(),
			Templates: templates[templateTag(r.key)]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ImageDir < out[j].ImageDir })
	return out
}

// errNeedDirFD: a caller other than root names an image directory by path.
// The helper opens no path for it: that would tell whether a directory the
// caller cannot read holds a resident image, or exists at all.
func errNeedDirFD(id uint64, uid uint32, dir string) *helperpb.Response {
	return errResp(id, helperpb.ErrorCode_ERROR_PERMISSION,
		"uid %d: the image directory %s must come with the request as a descriptor the caller opened", uid, dir)
}

// loadResident runs a LoadResident request: dir is the image directory the
// caller passed (nil: the path, root only).
func (s *Server) loadResident(c *conn, id uint64, req *helperpb.LoadResident, dir *os.File) *helperpb.Response {
	if dir == nil {
		if c.cred.Uid != 0 {
			return errNeedDirFD(id, c.cred.Uid, req.ImageDir)
		}
		fd, err := unix.Open(req.ImageDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "image directory %s: %v", req.ImageDir, err)
		}
		dir = os.NewFile(uintptr(fd), req.ImageDir)
	}
	defer dir.Close()
	if s.cfg.ResidentMemory == 0 {
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "this helper keeps no resident images: start it with --resident-memory SIZE (the device memory they may take)")
	}
	key, err := residentKeyOf(dir)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "image directory %s: %v", req.ImageDir, err)
	}
	opts := image.ReadOptions{HashCheckedByCaller: true} // on the GPU, by engine.Load
	if c.cred.Uid != 0 {
		// Every image of the chain the caller's: a parent of another
		// user's would put that user's data into memory the caller
		// restores from.
		opts.Owner = &image.Owner{UID: int(c.cred.Uid)}
	}
	im, owner, err := openRestorable(dir, "", opts)
	if errors.Is(err, image.ErrOwner) {
		return errResp(id, helperpb.ErrorCode_ERROR_PERMISSION, "uid %d may make only its own images resident: %v", c.cred.Uid, err)
	}
	if err != nil {
		return errResp(id, imageErrCode(err), "GPU image in %s: %v", req.ImageDir, err)
	}
	defer im.Close()
	imgID := im.Manifest().GetImageId()
	size := imageBytes(im, 0)
	// The copy is the loader's memory, within its limit like an allocation
	// of its processes (held from here until it is counted as resident).
	releaseGPU, err := s.gpus.reserve(c.cred.Uid, size, "the resident copy of the GPU image in "+req.ImageDir)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "%v", err)
	}
	defer releaseGPU()
	ok, already, held := s.residents.reserve(key, imgID, size, s.cfg.ResidentMemory)
	if already && !req.Template {
		return okResp(id)
	}
	if !ok {
		return errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY,
			"the GPU image in %s needs %s: resident images may take %s (--resident-memory), and take %s already (gpucr image unload DIR gives one up)",
			req.ImageDir, sizeStr(size), sizeStr(s.cfg.ResidentMemory), sizeStr(held))
	}
	if !already {
		defer s.residents.unreserve(size)
	}

	place, err := placeGPUs(imageGPUs(im, 0), s.cfg.Devices, im.Manifest().GetOrigin().GetGpuModel(), nil, s.pool.restoreRoom)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "%v", err)
	}
	if already { // resident since an earlier load: its templates only
		return s.makeTemplates(c, id, im, owner, key, req.ImageDir, place)
	}
	r := &resident{key: key, dir: req.ImageDir, id: imgID, owner: c.cred.Uid, imageOwner: owner, bytes: size, loaded: time.Now()}
	var bufs []int
	for i, b := range im.Buffers() {
		dev := place.deviceOf(b)
		if dev == nil || dev.GPU() == nil {
			r.release()
			return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "buffer %d (0x%x): no GPU %s here", i, b.Address, b.GPUUUID)
		}
		// Its own creation: a resident load pushes nothing out.
		h, err := dev.Create(b.Size, b.Flags)
		if err != nil {
			r.release()
			code := helperpb.ErrorCode_ERROR_DRIVER
			if isOOM(err) {
				code = helperpb.ErrorCode_ERROR_OUT_OF_MEMORY
			}
			return errResp(id, code, "buffer %d (%d bytes): %v", i, b.Size, err)
		}
		r.made = append(r.made, &alloc{handle: h, size: b.Size, address: b.Address, dev: dev, flags: b.Flags})
		r.regions = append(r.regions, engine.Region{Device: dev.GPU(), Handle: h, Size: b.Size, Pid: b.Pid,
			Address: b.Address, Kind: b.Kind, Flags: b.Flags})
		bufs = append(bufs, i)
	}
	tr := s.transfers.beginFor(c.cred.Uid, im.Dir(), false, size, nil)
	err = engine.Load(r.regions, im, bufs, engine.Options{Progress: tr.progress})
	tr.finish(err)
	if err != nil {
		r.release()
		s.log.Warn("an image could not be made resident", zap.String("image", req.ImageDir), zap.Error(err))
		return errResp(id, loadErrCode(err), "loading the GPU image in %s: %v", req.ImageDir, err)
	}
	if old := s.residents.put(r); old != nil { // another image written into the directory since
		old.giveUp()
		if s.served != nil {
			s.served.DropTemplates(templateTag(key))
		}
	}
	s.log.Info("image resident", zap.String("image", req.ImageDir), zap.Uint64("bytes", size),
		zap.Int("buffers", len(r.regions)), zap.Duration("took", time.Since(r.loaded)))
	if req.Template {
		return s.makeTemplates(c, id, im, owner, key, req.ImageDir, place)
	}
	return okResp(id)
}

// unload runs an UnloadResident request.
// The templates made from the directory's image go too (pool: nil when
// served mode is off).
func (rs *residentSet) unload(log *zap.Logger, pool *served.Pool, c *conn, id uint64, req *helperpb.UnloadResident, dir *os.File) *helperpb.Response {
	var key residentKey
	var err error
	if dir != nil {
		key, err = residentKeyOf(dir)
		dir.Close()
	} else if c.cred.Uid != 0 {
		return errNeedDirFD(id, c.cred.Uid, req.ImageDir)
	} else {
		var st unix.Stat_t
		if err = unix.Stat(req.ImageDir, &st); err == nil {
			key = residentKey{uint64(st.Dev), st.Ino}
		}
	}
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "image directory %s: %v", req.ImageDir, err)
	}
	r, refused := rs.take(key, c.cred.Uid)
	if refused {
		return errResp(id, helperpb.ErrorCode_ERROR_PERMISSION, "uid %d may not unload the GPU image in %s (uid %d's)", c.cred.Uid, req.ImageDir, r.owner)
	}
	templates := 0
	if pool != nil && (r != nil || c.cred.Uid == 0 || pool.TemplatesOnlyOf(templateTag(key), c.cred.Uid)) {
		templates = pool.DropTemplates(templateTag(key))
	}
	if r == nil && templates == 0 {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "the GPU image in %s is not resident", req.ImageDir)
	}
	if r != nil {
		r.giveUp()
		log.Info("resident image given up", zap.String("image", r.dir), zap.Uint64("bytes", r.bytes), zap.Int("templates", templates))
	} else {
		log.Info("templates given up", zap.String("image", req.ImageDir), zap.Int("templates", templates))
	}
	return okResp(id)
}

// giveUp releases r's memory once no restore copies from it.
func (r *resident) giveUp() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.gone {
		r.gone = true
		r.release()
	}
}

// release frees r's memory (its slices stay as they were: nothing reads
// them once it is gone).
func (r *resident) release() {
	for _, al := range r.made {
		_ = al.dev.Release(al.handle)
	}
}

// servingFor is the resident copy of the image im of owner read from the
// directory dir, held for a restore's copy (the caller calls done after it),
// or nil. It serves only a restore whose memory is on the GPUs it is on, of
// an image of the owner whose image it was loaded from (an image id is no
// secret: another user's manifest may carry it).
func (rs *residentSet) servingFor(log *zap.Logger, dir *os.File, im *image.Image, owner uint32, place placement) *resident {
	key, err := residentKeyOf(dir)
	if err != nil {
		return nil
	}
	r := rs.get(key)
	if r == nil || !bytes.Equal(r.id, im.Manifest().GetImageId()) {
		return nil
	}
	if r.imageOwner != owner {
		log.Warn("a restore reads its image from storage: the resident copy of its directory is of another owner's image",
			zap.String("image", r.dir), zap.Uint32("resident_owner", r.imageOwner), zap.Uint32("image_owner", owner))
		return nil
	}
	r.mu.RLock()
	if r.gone {
		r.mu.RUnlock()
		return nil
	}
	for i, b := range im.Buffers() {
		if d := place.deviceOf(b); d == nil || i >= len(r.made) || r.made[i].dev != d {
			r.mu.RUnlock()
			log.Info("a restore reads its image from storage: its GPUs are not those of the image's resident copy",
				zap.String("image", r.dir))
			return nil
		}
	}
	return r
}

// copyFrom fills regions (of image buffers bufs) from r on the device, and
// lets r go.
func (r *resident) copyFrom(regions []engine.Region, bufs []int, opts engine.Options) error {
	defer r.mu.RUnlock()
	src := make([]engine.Region, len(bufs))
	for i, bi := range bufs {
		if bi >= len(r.regions) {
			return errors.New("the resident copy lacks a buffer")
		}
		src[i] = r.regions[bi]
	}
	if err := engine.CopyOnDevice(regions, src, opts); err != nil {
		return fmt.Errorf("from the resident copy: %w", err)
	}
	r.restores.Add(1)
	return nil
}

// evict gives up the oldest resident image holding memory on dev;
// false if none does.
func (rs *residentSet) evict(log *zap.Logger, dev Device) bool {
	r := rs.takeOldestOn(dev)
	if r == nil {
		return false
	}
	r.giveUp()
	log.Warn("resident image given up: a process needs its device memory", zap.String("image", r.dir),
		zap.Uint64("bytes", r.bytes), zap.Int("device", int(dev.Info().Ordinal)))
	return true
}

// residentsSeenBy is what of the resident images all a caller of uid sees:
// root all of them, another uid its own (their directories are paths of the
// owner's, which the others need not know).
func residentsSeenBy(all []*helperpb.ResidentImage, uid uint32) []*helperpb.ResidentImage {
	if uid == 0 {
		return all
	}
	var own []*helperpb.ResidentImage
	for _, r := range all {
		if r.OwnerUid == uid {
			own = append(own, r)
		}
	}
	return own
}
