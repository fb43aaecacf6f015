package daemon

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// client is one application process: its calls connection, allocations and
// control connection.
type client struct {
	pid     int32
	uid     uint32
	program string
	token   uint64
	log     *zap.Logger

	mu     sync.Mutex
	allocs map[uint64]*alloc
	bytes  uint64
	ctrl   *control
	calls  *conn // its calls connection, while it is served
	state  helperpb.ClientState

	// opSem: one control exchange (or op sequence) at a time.
	opSem chan struct{}

	// Where it is in its lifecycle (lifecycle.go), the start time of its
	// process (0: not read yet; tells a reused pid apart), and what to do
	// once it is attached again (run when its control connection is up).
	// Guarded by mu.
	phase    phase
	start    uint64
	onAttach func()
	nsPid    int32        // prepared/restored: the pid inside its namespace, from the image
	wakeAs   int32        // prepared/restored: the pid its wake file is named after (the one it detached as)
	load     *restoreLoad // prepared/restored: the background load that fills its memory
	out      *outcomes    // prepared/restored, until it runs or fails: where its restore's result goes
}

type alloc struct {
	id, handle, size, address uint64
	dev                       Device
	kind                      helperpb.AllocKind
	flags                     image.AllocFlags // properties the memory was created with
}

func (s *Server) serveCalls(c *conn, helloID uint64, h *helperpb.Hello) {
	if s.cfg.Unavailable != "" {
		_ = c.send(errResp(helloID, helperpb.ErrorCode_ERROR_UNAVAILABLE, "helper has no GPU: %s", s.cfg.Unavailable), nil)
		return
	}
	var cl *client
	if h.ClientToken != 0 {
		// A detached or restored process coming back.
		if cl = s.reattach(c.cred.Pid, h.ClientToken); cl == nil {
			_ = c.send(errResp(helloID, helperpb.ErrorCode_ERROR_NOT_FOUND,
				"no detached or restored process with pid %d and this token", c.cred.Pid), nil)
			return
		}
		cl.mu.Lock()
		cl.uid, cl.program = c.cred.Uid, h.Program
		cl.mu.Unlock()
		cl.log.Info("client reattached")
	} else {
		cl = &client{pid: c.cred.Pid, uid: c.cred.Uid, program: h.Program, token: newToken(),
			allocs: map[uint64]*alloc{}, state: helperpb.ClientState_CLIENT_STATE_RUNNING, opSem: make(chan struct{}, 1)}
		cl.log = s.log.With(zap.Int32("pid", cl.pid), zap.Uint32("uid", cl.uid), zap.String("program", cl.program))
		s.mu.Lock()
		s.byToken[cl.token] = cl
		s.byPID[cl.pid] = cl
		s.mu.Unlock()
		cl.log.Info("client registered")
	}
	c.log = cl.log
	cl.mu.Lock()
	cl.calls = c
	cl.mu.Unlock()
	defer func() {
		cl.mu.Lock()
		if cl.calls == c {
			cl.calls = nil
		}
		cl.mu.Unlock()
	}()
	defer s.dropClient(cl)
	if err := c.send(&helperpb.Response{Id: helloID, Body: &helperpb.Response_Hello{Hello: &helperpb.HelloReply{
		ProtocolVersion: wire.Version, ClientToken: cl.token, HelperVersion: s.cfg.Version, Devices: s.devicesInfo()}}}, nil); err != nil {
		return
	}
	for {
		req := c.next()
		if req == nil {
			return
		}
		var resp *helperpb.Response
		var fd = -1
		switch b := req.Body.(type) {
		case *helperpb.Request_Alloc:
			resp, fd = s.alloc(cl, req.Id, b.Alloc)
		case *helperpb.Request_Mapped:
			resp = s.mapped(cl, req.Id, b.Mapped)
		case *helperpb.Request_Free:
			resp = s.free(cl, req.Id, b.Free)
		default:
			c.reject(req.Id, "%T is not allowed on a calls connection", req.Body)
			return
		}
		var fds []int
		if fd >= 0 {
			fds = []int{fd}
		}
		err := c.send(resp, fds)
		if fd >= 0 {
			unix.Close(fd)
		}
		if err != nil {
			cl.log.Info("calls connection write failed", zap.Error(err))
			return
		}
	}
}

func (s *Server) alloc(cl *client, id uint64, a *helperpb.Alloc) (*helperpb.Response, int) {
	dev := s.device(a.DeviceUuid)
	if dev == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no device %q", a.DeviceUuid), -1
	}
	info := dev.Info()
	g := info.Granularity
	if g == 0 {
		g = 1
	}
	if a.Size == 0 || a.Size > math.MaxUint64-g {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "bad allocation size %d", a.Size), -1
	}
	size := (a.Size + g - 1) / g * g
	if info.TotalMemory != 0 && size > info.TotalMemory {
		return errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "%d bytes requested; device %s has %d",
			size, info.Uuid, info.TotalMemory), -1
	}
	unreserve, refused := s.reserveGPU(cl, id, size)
	if refused != nil {
		return refused, -1
	}
	defer unreserve() // once cl.bytes counts it, or it failed
	var flags image.AllocFlags
	if a.GpuDirectRdma {
		flags |= image.AllocFlagGPUDirectRDMA
	}
	t0 := time.Now()
	h, err := dev.Create(size, flags)
	tCreate := time.Since(t0)
	if err != nil {
		var oom OutOfMemory
		if errors.As(err, &oom) && oom.OutOfMemory() {
			return errResp(id, helperpb.ErrorCode_ERROR_OUT_OF_MEMORY, "%v", err), -1
		}
		cl.log.Warn("allocation failed", zap.Uint64("size", size), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "%v", err), -1
	}
	t1 := time.Now()
	fd, err := dev.Export(h)
	tExport := time.Since(t1)
	if err != nil {
		if rerr := dev.Release(h); rerr != nil {
			cl.log.Warn("release after failed export", zap.Error(rerr))
		}
		cl.log.Warn("export failed", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "%v", err), -1
	}
	al := &alloc{id: s.nextAlloc.Add(1), handle: h, size: size, dev: dev, kind: a.Kind, flags: flags}
	cl.mu.Lock()
	cl.allocs[al.id] = al
	cl.bytes += size
	cl.mu.Unlock()
	s.mu.Lock()
	s.owner[al.id] = cl
	s.mu.Unlock()
	cl.log.Debug("alloc", zap.Uint64("alloc_id", al.id), zap.Uint64("size", size), zap.String("device", info.Uuid),
		zap.Stringer("kind", a.Kind), zap.Duration("create", tCreate), zap.Duration("export", tExport))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Alloc{Alloc: &helperpb.AllocReply{AllocId: al.id, Size: size}}}, fd
}

// ownAlloc finds id among cl's allocations; the error response says whether
// it is someone else's or nobody's. Called with cl.mu held.
func (s *Server) ownAlloc(cl *client, reqID, id uint64) (*alloc, *helperpb.Response) {
	if al := cl.allocs[id]; al != nil {
		return al, nil
	}
	s.mu.Lock()
	other := s.owner[id]
	s.mu.Unlock()
	if other != nil {
		cl.log.Warn("client named another client's allocation", zap.Uint64("alloc_id", id), zap.Int32("owner_pid", other.pid))
		return nil, errResp(reqID, helperpb.ErrorCode_ERROR_PERMISSION, "allocation %d is not yours", id)
	}
	return nil, errResp(reqID, helperpb.ErrorCode_ERROR_NOT_FOUND, "no allocation %d", id)
}

func (s *Server) mapped(cl *client, id uint64, m *helperpb.Mapped) *helperpb.Response {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	al, er := s.ownAlloc(cl, id, m.AllocId)
	if er != nil {
		return er
	}
	al.address = m.Address
	return okResp(id)
}

func (s *Server) free(cl *client, id uint64, f *helperpb.Free) *helperpb.Response {
	cl.mu.Lock()
	al, er := s.ownAlloc(cl, id, f.AllocId)
	if er != nil {
		cl.mu.Unlock()
		return er
	}
	delete(cl.allocs, al.id)
	cl.bytes -= al.size
	cl.mu.Unlock()
	s.mu.Lock()
	delete(s.owner, al.id)
	s.mu.Unlock()
	if err := al.dev.Release(al.handle); err != nil {
		cl.log.Warn("release failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "%v", err)
	}
	return okResp(id)
}

// dropClient forgets a client whose calls connection closed and releases
// every allocation it had.
func (s *Server) dropClient(cl *client) {
	if s.park(cl) {
		return // the client closes its control connection itself
	}
	// The client leaves the status list only after its memory is released,
	// so that whoever sees it gone also sees the memory back.
	defer func() {
		s.mu.Lock()
		delete(s.byToken, cl.token)
		if s.byPID[cl.pid] == cl {
			delete(s.byPID, cl.pid)
		}
		s.mu.Unlock()
	}()
	cl.mu.Lock()
	allocs := cl.allocs
	cl.allocs = map[uint64]*alloc{}
	bytes := cl.bytes
	cl.bytes = 0
	ctrl := cl.ctrl
	cl.mu.Unlock()
	if ctrl != nil {
		ctrl.conn.Close()
	}
	failed := 0
	for _, al := range allocs {
		s.mu.Lock()
		delete(s.owner, al.id)
		s.mu.Unlock()
		if err := al.dev.Release(al.handle); err != nil {
			failed++
			cl.log.Warn("release failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		}
	}
	cl.log.Info("client gone; its allocations released", zap.Int("allocations", len(allocs)),
		zap.Uint64("bytes", bytes), zap.Int("release_failures", failed))
}

// release gives back every allocation of cl (it is gone for good).
func (s *Server) release(cl *client) {
	s.dropDetachState(cl.pid)
	cl.mu.Lock()
	allocs := cl.allocs
	cl.allocs = map[uint64]*alloc{}
	cl.bytes = 0
	cl.mu.Unlock()
	for _, al := range allocs {
		s.mu.Lock()
		delete(s.owner, al.id)
		s.mu.Unlock()
		if err := al.dev.Release(al.handle); err != nil {
			cl.log.Warn("release failed", zap.Uint64("alloc_id", al.id), zap.Error(err))
		}
	}
}

// hangUp closes the helper's side of a detached client's connections. The
// client closes its own side when it detaches, but a process it forked may
// still hold copies of those sockets (the interposer drops them in forked
// children; anything else that keeps one would keep the helper from ever
// seeing the close): closing them here parks the client now.
func (cl *client) hangUp() {
	cl.mu.Lock()
	calls, ctl := cl.calls, cl.ctrl
	cl.mu.Unlock()
	if calls != nil {
		calls.UnixConn().Close()
	}
	if ctl != nil {
		ctl.conn.UnixConn().Close()
	}
}

// reimportEntries: the client's mapped allocations in id order, with a new
// fd each (the caller closes them). Allocations never mapped are skipped.
func (cl *client) reimportEntries() ([]*helperpb.ReimportEntry, []int, error) {
	cl.mu.Lock()
	var list []*alloc
	for _, al := range cl.allocs {
		if al.address != 0 {
			list = append(list, al)
		}
	}
	cl.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].id < list[j].id })
	var ents []*helperpb.ReimportEntry
	var fds []int
	for _, al := range list {
		fd, err := al.dev.Export(al.handle)
		if err != nil {
			wire.CloseFDs(fds)
			return nil, nil, fmt.Errorf("allocation %d: %w", al.id, err)
		}
		ents = append(ents, &helperpb.ReimportEntry{AllocId: al.id, Address: al.address, Size: al.size})
		fds = append(fds, fd)
	}
	return ents, fds, nil
}
