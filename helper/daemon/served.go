package daemon

// Served mode's connections (ROLE_SERVED): a process that holds no driver
// state asks for a worker (Serve), and the helper's pool of workers
// (helper/served) assigns one that runs as the caller's user. The helper
// then has nothing more to do with that process: the two talk to each
// other over the socket pair made here.

import (
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/helper/served"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

func (s *Server) serveServed(c *conn, helloID uint64) {
	if err := c.send(&helperpb.Response{Id: helloID, Body: &helperpb.Response_Hello{Hello: &helperpb.HelloReply{
		ProtocolVersion: wire.Version, HelperVersion: s.cfg.Version, Devices: devicesInfo(s.cfg.Devices)}}}, nil); err != nil {
		return
	}
	req := c.next()
	if req == nil {
		return
	}
	b, ok := req.Body.(*helperpb.Request_Serve)
	if !ok {
		c.reject(req.Id, "%T is not allowed for %s", req.Body, helperpb.Role_ROLE_SERVED)
		return
	}
	resp, fd := assignWorker(s.served, s.cfg, c, req.Id, b.Serve, s.reg.connectedAs(proc.Pid(c.cred.Pid)))
	var fds []int
	if fd >= 0 {
		fds = []int{fd}
		defer unix.Close(fd)
	}
	_ = c.send(resp, fds)
}

// assignWorker answers Serve for pool: a worker of the device asked for, assigned to
// the caller, and the caller's end of their socket pair (-1 with a refusal).
// self is the caller as the helper's client (its interposer's), if it is one.
func assignWorker(pool *served.Pool, cfg Config, c *conn, id uint64, req *helperpb.Serve, self *client) (*helperpb.Response, int) {
	if pool == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE,
			"served mode is off in this helper (start it with --served-pool N)"), -1
	}
	if cfg.Unavailable != "" {
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "the helper has no GPU: %s", cfg.Unavailable), -1
	}
	dev, err := servedDevice(cfg.Devices, req, self)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "%v", err), -1
	}
	groups, err := c.PeerGroups()
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "the caller's groups: %v", err), -1
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "socketpair: %v", err), -1
	}
	w, template, err := pool.Serve(dev, c.cred.Uid, c.cred.Gid, groups, int64(c.cred.Pid), pair[1], req.TemplateToken)
	unix.Close(pair[1])
	if err != nil {
		unix.Close(pair[0])
		code := helperpb.ErrorCode_ERROR_DRIVER
		if errors.Is(err, served.ErrPerUID) {
			code = helperpb.ErrorCode_ERROR_PERMISSION
		}
		c.log.Warn("served mode: no worker", zap.Int("device", dev), zap.Error(err))
		return errResp(id, code, "served mode: %v", err), -1
	}
	c.log.Info("served mode: worker assigned", zap.Int("worker_pid", w.Pid()), zap.Int("device", dev), zap.Bool("template", template))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Serve{Serve: &helperpb.ServeReply{
		WorkerPid: int64(w.Pid()), Device: uint32(dev), Uuid: cfg.Devices[dev].Info().GetUuid(), Template: template}}}, pair[0]
}

// servedDevice is the device a Serve gets a worker on: where the caller's
// memory is, if it is a client of the helper's whose memory is all on one
// device (a restored process: its restore put it there, onto another GPU
// too); else the device of req.Uuid, if set; else that of req.Device.
func servedDevice(devices []Device, req *helperpb.Serve, self *client) (int, error) {
	if self != nil {
		at := -1 // the one device of its memory; -2: several
		self.mu.Lock()
		for _, al := range self.allocs {
			if i := slices.Index(devices, al.dev); at == -1 {
				at = i
			} else if i != at {
				at = -2
			}
		}
		self.mu.Unlock()
		if at >= 0 {
			return at, nil
		}
	}
	if req.Uuid != "" {
		d := deviceByUUID(devices, req.Uuid)
		if d == nil {
			return 0, fmt.Errorf("no device %s in this helper", req.Uuid)
		}
		return slices.Index(devices, d), nil
	}
	if int(req.Device) >= len(devices) {
		return 0, fmt.Errorf("no device %d (the helper has %d)", req.Device, len(devices))
	}
	return int(req.Device), nil
}

// servedStatus is pool as Status shows it (nil: served mode is off):
// every worker, which replyFor narrows to the caller's.
func servedStatus(pool *served.Pool, devices int) *helperpb.ServedPool {
	if pool == nil {
		return nil
	}
	out := &helperpb.ServedPool{Idle: make([]uint32, devices)}
	for _, w := range pool.Workers() {
		if !w.Assigned {
			if w.Device < len(out.Idle) {
				out.Idle[w.Device]++
			}
			continue
		}
		out.Assigned++
		out.Workers = append(out.Workers, &helperpb.ServedWorker{Pid: int64(w.Pid), Device: uint32(w.Device), Uid: w.UID,
			ClientPid: w.ClientPid, WarmNs: uint64(w.Warm)})
	}
	for _, t := range pool.Templates() {
		out.Templates = append(out.Templates, &helperpb.ServedTemplate{WorkerPid: int64(t.Pid), Device: uint32(t.Device),
			Uid: t.UID, ImageDir: t.Image, MadeNs: uint64(t.Made)})
	}
	return out
}

// servedSeenBy is p with only the workers that serve caller's processes
// (root: all of them).
func servedSeenBy(p *helperpb.ServedPool, caller uint32) *helperpb.ServedPool {
	if p == nil || caller == 0 {
		return p
	}
	out := &helperpb.ServedPool{Idle: p.Idle, Assigned: p.Assigned}
	for _, w := range p.Workers {
		if w.Uid == caller {
			out.Workers = append(out.Workers, w)
		}
	}
	for _, t := range p.Templates {
		if t.Uid == caller {
			out.Templates = append(out.Templates, t)
		}
	}
	return out
}
