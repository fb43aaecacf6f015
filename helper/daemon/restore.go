package daemon

// The restore path: PrepareRestore makes new helper memory for every buffer of
// an image and loads it in the background while CRIU restores the processes;
// Restored hands each restored process its memory (lifecycle.go).

import (
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/devicemap"
	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/fault"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// restoreLoad is the load of one PrepareRestore's image into the memory it
// made, running while CRIU restores the processes.
type restoreLoad struct {
	done chan struct{} // closed when the load has ended
	err  error         // its result; read only after done

	// onDemand: the processes run before it has ended (set before the
	// PrepareRestore is answered). started is closed once live (the
	// running load, nil if it could not start: err then) is set.
	onDemand bool
	started  chan struct{}
	live     *engine.Loading
}

// startedFor waits (at most d) until an on-demand load is running, and
// returns it (nil and its error if it failed to start or has failed).
func (l *restoreLoad) startedFor(d time.Duration) (*engine.Loading, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.started:
	case <-t.C:
		return nil, fmt.Errorf("the GPU image did not begin to load within %v", d)
	}
	if l.live == nil {
		<-l.done
		return nil, l.err
	}
	select {
	case <-l.done:
		if l.err != nil {
			return nil, l.err
		}
	default:
	}
	return l.live, nil
}

// wait blocks until the load has ended and returns its error.
func (l *restoreLoad) wait() error {
	if l == nil {
		return nil
	}
	<-l.done
	return l.err
}

// loadTimeout bounds how long a restored process waits for its GPU image to
// load (storage that hangs must not hold CRIU, or the process, forever).
const loadTimeout = 10 * time.Minute

// waitFor is wait, at most d.
func (l *restoreLoad) waitFor(d time.Duration) error {
	if l == nil {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.done:
		return l.err
	case <-t.C:
		return fmt.Errorf("the GPU image did not load within %v", d)
	}
}

// restorePlan is the helper memory made for (part of) an image, filled by its
// load and claimed by the restored processes. Only the plugin connection that
// made it (or the adoption of an orphan) claims its clients.
type restorePlan struct {
	im       *image.Image
	dir      string
	resident *resident // the image's resident copy it copies from (held until then), or nil
	clients  []*client // one per process of the image, in image order; prepared until claimed
	regions  []engine.Region
	bufs     []int // image buffer of each region
	made     []*alloc
	load     *restoreLoad
	out      *outcomes
}

func (p *restorePlan) undo() {
	for _, al := range p.made {
		_ = al.dev.Release(al.handle)
	}
}

// prepareRestore runs a PrepareRestore request. Everything that can refuse
// the restore cheaply is checked before it answers, while nothing has been
// changed: the manifest, every chunk file's presence and size, a GPU for
// every buffer, and new helper memory for each (out of memory refuses it).
// Then it answers and fills that memory from the image in the background, so
// that the GPU data moves while CRIU restores the CPU side; Restored waits for
// the load. Damage inside a chunk file is only found by that load: Restored
// then fails, and the plugin kills the restored process (see restored).
// dir is the image directory CRIU restores from (the plugin passes CRIU's
// descriptor), nil for req.ImageDir by path.
func (s *Server) prepareRestore(id uint64, req *helperpb.PrepareRestore, dir *os.File) (*helperpb.Response, *restorePlan) {
	if dir != nil {
		defer dir.Close()
	}
	im, owner, err := openRestorable(dir, req.ImageDir, image.ReadOptions{HashCheckedByCaller: true}) // on the GPU, by engine.Load
	if err != nil {
		s.log.Warn("restore refused", zap.String("image", req.ImageDir), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "GPU image: %v", err), nil
	}
	// Its memory is the image owner's until each process is back.
	release, err := s.gpus.reserve(owner, imageBytes(im, 0), "restoring the GPU image in "+im.Dir())
	if err != nil {
		_ = im.Close()
		s.log.Warn("restore refused", zap.String("image", req.ImageDir), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "%v", err), nil
	}
	defer release() // once trackPlan counts it
	spec, err := devicemap.Parse(req.DeviceMap)
	var place placement
	if err == nil {
		place, err = placeGPUs(imageGPUs(im, 0), s.cfg.Devices, im.Manifest().GetOrigin().GetGpuModel(), spec, s.pool.restoreRoom)
	}
	if err != nil {
		_ = im.Close()
		s.log.Warn("restore refused", zap.String("image", req.ImageDir), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "%v", err), nil
	}
	made := time.Now()
	plan, e := s.planRestore(im, im.Dir(), 0, owner, place)
	if e != nil {
		_ = im.Close()
		s.log.Warn("restore refused", zap.String("image", req.ImageDir), zap.String("error", e.Message))
		return &helperpb.Response{Id: id, Error: e}, nil
	}
	// What a pool of memory made ahead would save a restore.
	s.log.Info("restore memory made", zap.String("image", req.ImageDir), zap.Int("allocations", len(plan.made)),
		zap.Duration("took", time.Since(made)), zap.Bool("on_demand", req.OnDemand))
	if dir != nil {
		plan.resident = s.residents.servingFor(s.log, dir, im, owner, place)
	}
	// A copy from a resident image is on the GPU: faster than any process
	// could wait for it.
	plan.load.onDemand = req.OnDemand && plan.resident == nil
	s.reg.trackPlan(plan)
	s.recent.remember(req.ImageDir, plan.out)
	go s.runLoad(plan)
	return okResp(id), plan
}

// openRestorable opens the image beneath dir (nil: at path) and checks,
// before anything is changed, what loading it needs: a restorable image,
// every chunk file there with its size. It returns the image and its
// owner; on an error nothing stays open.
func openRestorable(dir *os.File, path string, opts image.ReadOptions) (*image.Image, uint32, error) {
	var im *image.Image
	var err error
	if dir != nil {
		im, err = image.OpenAt(dir, opts)
	} else {
		im, err = image.OpenWith(path, opts)
	}
	if err != nil {
		return nil, 0, err
	}
	err = im.CheckRestorable()
	if err == nil {
		err = im.CheckFiles()
	}
	var owner uint32
	if err == nil {
		owner, err = im.OwnerUID()
	}
	if err != nil {
		_ = im.Close()
		return nil, 0, err
	}
	return im, owner, nil
}

// imageBytes is the GPU memory im's buffers take (only those of pid only,
// if not 0).
func imageBytes(im *image.Image, only int) uint64 {
	var n uint64
	for _, b := range im.Buffers() {
		if only == 0 || b.Pid == only {
			n += b.Size
		}
	}
	return n
}

// planRestore makes new helper memory for every buffer of im (only those of
// pid only, if not 0), each on the GPU place gives its GPU; nothing is kept
// if any of it fails. The memory is uid's (for the limits) until each
// process is back. A process whose GPUs move has its driver restore told
// so.
func (s *Server) planRestore(im *image.Image, dir string, only int, uid uint32, place placement) (*restorePlan, *helperpb.Error) {
	p := &restorePlan{im: im, dir: dir, load: &restoreLoad{done: make(chan struct{}), started: make(chan struct{})}, out: newOutcomes()}
	byPid := map[int]*client{}
	fail := func(code helperpb.ErrorCode, format string, a ...any) (*restorePlan, *helperpb.Error) {
		p.undo()
		return nil, &helperpb.Error{Code: code, Message: fmt.Sprintf(format, a...)}
	}
	newClient := func(pid, ns int) *client {
		cl := byPid[pid]
		if cl == nil {
			cl = newPreparedClient(s.log.With(pidField("image_pid", proc.Pid(pid)), zap.String("restored_from", dir)),
				proc.Pid(pid), proc.Pid(ns), uid, p.load, p.out)
			byPid[pid] = cl
			p.clients = append(p.clients, cl)
		}
		return cl
	}
	// Every process, also those without buffers: they wait to be woken too.
	for _, pr := range im.Processes() {
		if only == 0 || pr.Pid == only {
			newClient(pr.Pid, pr.NsPid)
		}
	}
	for i, b := range im.Buffers() {
		if only != 0 && b.Pid != only {
			continue
		}
		dev := place.deviceOf(b)
		if dev == nil {
			return fail(helperpb.ErrorCode_ERROR_NOT_FOUND, "buffer %d (pid %d, 0x%x): no GPU %s (ordinal %d) here", i, b.Pid, b.Address, b.GPUUUID, b.Device)
		}
		gpu := dev.GPU()
		if gpu == nil {
			return fail(helperpb.ErrorCode_ERROR_STATE, "buffer %d: device has no driver behind it", i)
		}
		h, err := s.mem.create(dev, b.Size, b.Flags)
		if err != nil {
			if isOOM(err) {
				return fail(helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "buffer %d (%d bytes): %v", i, b.Size, err)
			}
			return fail(helperpb.ErrorCode_ERROR_DRIVER, "buffer %d: %v", i, err)
		}
		al := &alloc{id: s.mem.nextID.Add(1), handle: h, size: b.Size, address: b.Address, dev: dev, kind: protoKind(b.Kind),
			flags: b.Flags}
		p.made = append(p.made, al)
		cl := newClient(b.Pid, b.NsPid)
		cl.allocs[al.id] = al
		cl.bytes += al.size
		cl.restoreIdx = append(cl.restoreIdx, len(p.regions))
		p.regions = append(p.regions, engine.Region{Device: gpu, Handle: h, Size: b.Size, Pid: b.Pid,
			Address: b.Address, Kind: b.Kind, Flags: b.Flags})
		p.bufs = append(p.bufs, i)
	}
	if only != 0 && len(p.clients) == 0 {
		return fail(helperpb.ErrorCode_ERROR_NOT_FOUND, "the GPU image in %s has no process %d", dir, only)
	}
	if err := s.reg.planImports(p, byPid); err != nil {
		return fail(helperpb.ErrorCode_ERROR_BAD_REQUEST, "%v", err)
	}
	bufsOf := map[int][]image.BufferInfo{}
	for _, b := range im.Buffers() {
		bufsOf[b.Pid] = append(bufsOf[b.Pid], b)
	}
	for _, pr := range im.Processes() {
		cl := byPid[pr.Pid]
		if cl == nil {
			continue
		}
		pairs, err := place.pairs(bufsOf[pr.Pid], pr.GPUs, s.cfg.Devices)
		if err != nil {
			return fail(helperpb.ErrorCode_ERROR_NOT_FOUND, "process %d of the image: %v", pr.Pid, err)
		}
		cl.gpuPairs = pairs
		for _, gp := range pairs {
			if gp.Old != gp.New {
				cl.log.Info("restored onto another GPU", zap.String("image_gpu", gp.Old), zap.String("gpu", gp.New))
			}
		}
	}
	return p, nil
}

// runLoad fills the plan's memory from its image and ends its load.
func (s *Server) runLoad(p *restorePlan) {
	start := time.Now()
	bytes := engine.TotalSize(p.regions)
	var pids []int64
	for _, cl := range p.clients {
		pids = append(pids, int64(cl.pid))
	}
	tr := s.transfers.begin(p.dir, false, bytes, pids)
	slow := time.Duration(0)
	if s.cfg.Fault.Is(fault.SlowLoad) {
		slow = 200 * time.Millisecond
	}
	switch {
	case p.resident != nil:
		close(p.load.started)
		tr.fromResident.Store(true)
		p.load.err = p.resident.copyFrom(p.regions, p.bufs, engine.Options{Progress: tr.progress})
	case p.load.onDemand:
		ranks := make([]uint32, len(p.bufs))
		for i, bi := range p.bufs {
			ranks[i] = p.im.Buffers()[bi].TouchRank
		}
		l, err := engine.StartLoad(p.regions, p.im, p.bufs, engine.LoadOrder(p.regions, ranks),
			engine.Options{Progress: tr.progress, PieceDelay: slow})
		p.load.live = l
		close(p.load.started)
		if err == nil {
			err = l.Err()
		}
		p.load.err = err
	default:
		close(p.load.started)
		p.load.err = engine.Load(p.regions, p.im, p.bufs, engine.Options{Progress: tr.progress, PieceDelay: slow})
	}
	_ = p.im.Close() // its chunks are read; its manifest stays
	tr.finish(p.load.err)
	took := time.Since(start)
	if p.load.err != nil {
		s.log.Error("loading the GPU image for a restore failed", zap.String("image", p.dir), zap.Error(p.load.err))
	} else {
		s.log.Info("GPU image loaded for restore", zap.String("image", p.dir), zap.Int("buffers", len(p.regions)),
			zap.Bool("from_resident", p.resident != nil),
			zap.Uint64("bytes", bytes), zap.Duration("took", took),
			zap.Float64("gb_per_s", float64(bytes)/1e9/max(took.Seconds(), 1e-9)))
	}
	close(p.load.done)
}

// claimPrepared finds, among the plans one plugin connection made, the
// prepared client of the restored process pid. CRIU restores a process
// under its old pid when it restores into the helper's own pid namespace;
// into a new one (a container), the pid inside is the old one, recorded in
// the image, and the host pid is new.
func claimPrepared(plans []*restorePlan, pid proc.Pid) *client {
	sameNS := proc.SamePidNS(pid)
	ns := proc.NsPid(pid)
	for _, p := range plans {
		for _, cl := range p.clients {
			if cl.preparedFor(pid, sameNS, ns) {
				return cl
			}
		}
	}
	return nil
}

// restored runs a Restored request of a plugin connection that made plans:
// the restored process will reattach once CRIU lets it run; then it gets
// its driver state and memory back.
//
// Why the driver restore happens then, on the running process, and not in
// RESUME_DEVICES_LATE while CRIU still holds the tasks ptrace-stopped: the
// driver's restore needs the process's own restore thread to run, which in
// RESUME_DEVICES_LATE means resuming one traced thread from inside CRIU's
// tracer and interrupting it again. Once CRIU has let the process go, every
// thread of it that could touch the GPU is blocked (application threads at
// the interposer's closed gate, the control thread polling its wake file),
// while threads doing only CPU work and pinned host memory are the kernel's
// business and need nothing from us; the restore then needs no ptrace at all.
// Measured on the GPU machine: the driver restore of the residual on the
// running, gated process works and takes 0.2-0.5 s.
func (s *Server) restored(id uint64, req *helperpb.Restored, plans []*restorePlan) *helperpb.Response {
	pid := proc.Pid(req.Pid)
	cl := claimPrepared(plans, pid)
	if cl == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no GPU memory prepared for pid %d by this restore", req.Pid)
	}
	load, out := cl.restoreLoad(), cl.outcomes()
	out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_PENDING, "")
	// The process may run only with all of its memory in place, or, on
	// demand, with the load running that its calls wait for.
	var live *engine.Loading
	var err error
	if load != nil && load.onDemand {
		live, err = load.startedFor(loadTimeout)
	} else {
		err = load.waitFor(loadTimeout)
	}
	if err != nil {
		out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_FAILED, "loading its GPU image: "+err.Error())
		select {
		case <-load.done:
			s.mem.release(cl)
		default:
			// Still loading: the engines write into that memory; it is
			// released once the load has ended, when the plugin's
			// connection closes (dropUnrestored).
		}
		code := loadErrCode(err)
		cl.log.Warn("restore failed: its GPU image did not load", pidField("pid", pid), zap.Error(err))
		return errResp(id, code, "pid %d: loading its GPU image: %v", req.Pid, err)
	}
	// CRIU holds the restored process stopped: the pid is that process's
	// until it runs, and from now on it is held.
	p, err := proc.Open(pid)
	if err != nil {
		out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_FAILED, err.Error())
		s.mem.release(cl)
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "restored pid %d: %v", req.Pid, err)
	}
	stale, err := s.reg.parkRestored(cl, p)
	if stale != nil {
		s.reap(stale, "its pid names another process now")
	}
	if err != nil {
		out.set(cl, pid, helperpb.RestoreState_RESTORE_STATE_FAILED, err.Error())
		s.mem.release(cl)
		cl.log.Warn("restore failed", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "restored pid %d: %v", req.Pid, err)
	}
	if live != nil {
		cl.mu.Lock()
		if len(cl.restoreIdx) > 0 {
			cl.demand = &demandLoad{l: live, mine: cl.restoreIdx, out: out}
		}
		cl.mu.Unlock()
	}
	if err := cl.arm(func() { s.giveBack(cl, true, nil, nil) }); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "restored pid %d: %v", req.Pid, err) // reaped meanwhile
	}
	// Named after the pid it detached as: that is what it waits for.
	if err := s.wakes.create(cl.wakesAs(), ""); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "pid %d: wake file: %v", req.Pid, err)
	}
	cl.log.Info("restored process handed its GPU memory; waiting for it to come back")
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
}

// awaitLoad runs an AwaitLoad of a plugin connection that made plans: it
// answers once every plan's load has ended, with the first failure. CRIU
// asks at POST_FORKING, the last point where its failure stops the restore
// cleanly: the tasks exist and restore their own memory meanwhile, but none
// has run, and CRIU kills them all. (A failure found later, in Restored,
// relies on the plugin killing the task and CRIU failing to detach from it.)
// The memory of a failed plan is given back when the connection closes
// (dropUnrestored).
func awaitLoad(log *zap.Logger, id uint64, plans []*restorePlan) *helperpb.Response {
	for _, p := range plans {
		var err error
		if p.load.onDemand {
			// The processes run before it ends: only a load that could not
			// start, or has failed already, stops them here.
			_, err = p.load.startedFor(loadTimeout)
		} else {
			err = p.load.waitFor(loadTimeout)
		}
		if err == nil {
			continue
		}
		for _, cl := range p.clients {
			cl.outcomes().set(cl, 0, helperpb.RestoreState_RESTORE_STATE_FAILED, "loading its GPU image: "+err.Error())
		}
		code := loadErrCode(err)
		log.Warn("restore failed before its processes ran: the GPU image did not load", zap.String("image", p.dir), zap.Error(err))
		return errResp(id, code, "loading the GPU image %s: %v", p.dir, err)
	}
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
}

// loadErrCode is the code of a failed load: a damaged image is a bad
// request, anything else the driver's.
func loadErrCode(err error) helperpb.ErrorCode {
	if errors.Is(err, image.ErrCorrupt) {
		return helperpb.ErrorCode_ERROR_BAD_REQUEST
	}
	return helperpb.ErrorCode_ERROR_DRIVER
}

// dropUnrestored gives back the memory of a closing plugin connection's
// plans that no restored process claimed (the restore failed, or CRIU died).
func (s *Server) dropUnrestored(plans []*restorePlan) {
	for _, p := range plans {
		_ = p.load.wait() // the engines may still be writing into that memory
		for _, cl := range p.clients {
			if cl.lifeState() == lifePrepared {
				cl.outcomes().set(cl, 0, helperpb.RestoreState_RESTORE_STATE_FAILED,
					"CRIU did not restore this process (its restore failed or was stopped)")
				s.mem.release(cl)
				cl.log.Info("restore did not finish; the GPU memory prepared for it is released")
			}
		}
		s.reg.dropPlan(p)
	}
}

// samePlace puts each GPU of an image on the same GPU (UUID) if it is here,
// else the same ordinal: for a process that never left this machine.
func samePlace(devs []Device, im *image.Image, only int) placement {
	p := placement{dev: map[string]Device{}}
	for _, g := range imageGPUs(im, only) {
		if d := deviceByUUID(devs, g.uuid); d != nil {
			p.dev[g.key()] = d
			continue
		}
		for _, d := range devs {
			if int(d.Info().Ordinal) == g.ordinal {
				p.dev[g.key()] = d
				break
			}
		}
	}
	return p
}
