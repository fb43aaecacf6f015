// Package daemon is the gpucr helper (`gpucr helper`): it owns the GPU memory
// of every application that runs with the interposer, hands it out as POSIX
// fds, and drives the quiesce cycle on the clients' control connections.
// docs/helper-protocol.md is the contract.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/fault"
	"github.com/gpucr/gpucr/helper/fscred"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/helper/served"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// DefaultSocket is where the helper listens without --socket or $GPUCR_SOCKET.
const DefaultSocket = "/run/gpucr/helper.sock"

// Defaults for Config.
const (
	DefaultStatusTimeout = 500 * time.Millisecond
	DefaultOpTimeout     = 30 * time.Second
	// opGrace is added to a ClientOp's timeout_ms: the client answers
	// ERROR_TIMEOUT itself when its own wait ends, which takes a moment.
	opGrace = 2 * time.Second
)

// Config configures a Server.
type Config struct {
	Socket      string
	SocketMode  os.FileMode // 0: 0600
	SocketGroup string      // name or numeric gid; "": leave it
	Log         *zap.Logger
	Version     string // helper_version in replies
	Devices     []Device
	// Unavailable says why the helper has no GPU (driver missing, no
	// devices); clients are then refused and Status says it.
	Unavailable string
	// Driver describes the driver library for Status (nil: not told).
	Driver *helperpb.DriverInfo
	// StatusTimeout bounds each GetStats/Snapshot a Status asks a client.
	StatusTimeout time.Duration
	// OpTimeout bounds a forwarded ClientOp whose timeout_ms is 0.
	OpTimeout time.Duration
	// Residuals saves and brings back the processes' residual contexts
	// (residual.go); nil: NVIDIA's driver checkpoint API.
	Residuals Residuals
	// Fault is the failure injected for tests (GPUCR_FAULT; package fault
	// says what each does); none by default.
	Fault fault.Injected
	// Limits bound what the socket's users can make the helper hold
	// (limits.go); zero fields take the defaults.
	Limits Limits
	// Pool sizes the allocations made ahead of time (pool.go).
	Pool PoolConfig
	// SnapshotReserve is the device memory a concurrent checkpoint's
	// snapshot leaves free on each device, for the process that runs on
	// while it is copied out (0: none).
	SnapshotReserve uint64
	// Concurrent is how a concurrent checkpoint keeps each buffer while
	// the process runs on.
	Concurrent ConcurrentMode
	// BackgroundLanes is the lanes per device of a snapshot's background
	// copy (0: a quarter of the CPUs, at least 2).
	BackgroundLanes int
	// ExportKeeper holds one small exported allocation per device while
	// the helper serves, which keeps the driver's later exports fast
	// (keeper.go).
	ExportKeeper bool
	// ResidentMemory is the device memory resident images may take in all
	// (resident.go; 0: none are kept).
	ResidentMemory uint64
	// Served is served mode's pool of workers (served.go); nil: served
	// mode is off. The server closes it when it stops.
	Served *served.Pool
}

// Server is the helper daemon.
type Server struct {
	cfg       Config
	log       *zap.Logger
	residuals Residuals // cfg.Residuals, or the driver's
	wakes     *wakeFiles
	states    *detachStates

	ln *net.UnixListener

	// mu guards the open connections and closed, and only them: Go
	// admits a connection (counts, its own lock, taken inside) and adds its
	// handler to wg under it, so that Shutdown, which closes them under it,
	// waits for every handler. Every part below locks itself.
	mu     sync.Mutex
	conns  map[*net.UnixConn]struct{}
	closed bool

	reg       *registry       // the clients, where each is, and who owns what (registry.go)
	mem       *allocator      // the GPU memory made for them (allocator.go)
	recent    *recentOutcomes // what became of recent restores, by image directory (outcome.go)
	open      openImages      // deferred-commit images by connection and directory (imagedir.go)
	groups    groupRuns       // their checkpoints of processes sharing GPU memory (group.go)
	bg        backgrounds     // concurrent checkpoints' copies still running, by image (background.go)
	snaps     snapshotHolds   // the device memory their snapshots hold (background.go)
	residents residentSet     // images kept in device memory (resident.go)
	transfers transferLog     // GPU copies, for progress displays (transfer.go)
	salvage   *salvages       // chunks of dropped concurrent checkpoints, by directory (salvage.go)
	nCkpt     atomic.Uint64   // checkpoints begun, for a Fault limited to one (STEP@N)
	wg        sync.WaitGroup

	// Limits (limits.go).
	counts      connCounts      // connections of limited uids
	stopping    chan struct{}   // closed by Shutdown
	frames      *budget         // bytes of frames being read
	gpus        gpuReservations // GPU memory limit checks, and what checked allocations hold meanwhile
	refusedLog  burstLog        // connections refused for a limit
	stalledLog  burstLog        // connections closed for a frame that stalled
	rejectedLog burstLog        // connections closed for a bad request

	statusShare  statusShare     // Status requests share their replies (status.go)
	statusBudget int             // bytes of a Status reply (status.go; tests lower it)
	exports      *exportSet      // the one kept export of each exported allocation (exports.go)
	analyses     *analysisBudget // bytes of module images being analysed (modules.go)
	pool         *pool           // allocations made ahead of time (pool.go)
	served       *served.Pool    // served mode's workers (served.go); nil: off
}

// New returns a server; Listen and Serve start it.
func New(cfg Config) *Server {
	if cfg.SocketMode == 0 {
		cfg.SocketMode = 0o600
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.StatusTimeout <= 0 {
		cfg.StatusTimeout = DefaultStatusTimeout
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if len(cfg.Devices) == 0 && cfg.Unavailable == "" {
		cfg.Unavailable = "no GPU devices"
	}
	cfg.Limits = cfg.Limits.withDefaults()
	stopping := make(chan struct{})
	s := &Server{cfg: cfg, log: cfg.Log, recent: newRecentOutcomes(), salvage: newSalvages(cfg.Log),
		conns: map[*net.UnixConn]struct{}{},

		stopping: stopping, frames: newBudget(cfg.Limits.InFlightBytes, cfg.Limits.InFlightBytesPerUID, stopping),
		refusedLog: burstLog{interval: 10 * time.Second}, stalledLog: burstLog{interval: 10 * time.Second},
		rejectedLog: burstLog{interval: 10 * time.Second}, pool: newPool(cfg.Pool, cfg.Log), exports: newExportSet(),
		served: cfg.Served}
	s.wakes = newWakeFiles(filepath.Dir(cfg.Socket))
	s.states = newDetachStates(filepath.Dir(cfg.Socket))
	s.reg = newRegistry(s.wakes)
	s.residuals = cfg.Residuals
	if s.residuals == nil {
		s.residuals = driverResiduals{}
	}
	s.gpus = gpuReservations{limits: &s.cfg.Limits, held: func(uid uint32) uint64 {
		// Its processes' (connected, detached, restored, or being
		// restored) and the resident copies it loaded.
		return s.residents.bytesOf(uid) + s.reg.heldBy(uid)
	}}
	s.mem = &allocator{devices: cfg.Devices, limits: &s.cfg.Limits, log: cfg.Log, reg: s.reg, pool: s.pool, gpus: &s.gpus,
		exports: s.exports, states: s.states, residents: &s.residents, snaps: &s.snaps, stopping: stopping}
	s.counts.limits = &s.cfg.Limits
	s.analyses = newAnalysisBudget(&s.cfg.Limits, stopping)
	s.statusBudget = DefaultStatusBudget
	return s
}

// ownSocketDir refuses a socket directory that is not the helper's own or
// that others can write: the helper, as root, makes and removes files there
// (the socket, helper.alive, the wake and state directories), and a name
// another user planted there would turn those writes elsewhere.
func ownSocketDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if !helperOwns(&st) {
		return fmt.Errorf("socket directory %s belongs to uid %d with mode %04o: the helper makes and removes files there, "+
			"so it must be the helper's own (uid %d) and writable by no one else; put the socket in a directory of its own (like /run/gpucr)",
			dir, st.Uid, st.Mode&0o7777, os.Geteuid())
	}
	return nil
}

// Listen creates the socket: its directory (0755) if missing, which must be
// the helper's own (ownSocketDir), a stale socket
// removed (one another helper still answers on is an error), mode and group set.
func (s *Server) Listen() error {
	path := s.cfg.Socket
	if path == "" {
		return errors.New("no socket path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	if err := ownSocketDir(filepath.Dir(path)); err != nil {
		return err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("%s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return fmt.Errorf("another helper is listening on %s", path)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("removing stale socket: %w", err)
		}
		s.log.Info("removed stale socket", zap.String("socket", path))
	}
	// Nobody else may connect before the mode is set.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return err
	}
	if s.cfg.SocketGroup != "" {
		gid, err := lookupGroup(s.cfg.SocketGroup)
		if err == nil {
			err = os.Chown(path, -1, gid)
		}
		if err != nil {
			ln.Close()
			return fmt.Errorf("socket group %s: %w", s.cfg.SocketGroup, err)
		}
	}
	if err := os.Chmod(path, s.cfg.SocketMode); err != nil {
		ln.Close()
		return fmt.Errorf("socket mode: %w", err)
	}
	s.ln = ln
	return nil
}

func lookupGroup(g string) (int, error) {
	if n, err := strconv.Atoi(g); err == nil {
		return n, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(grp.Gid)
}

// Accept errors (EMFILE, ENFILE, ENOBUFS...) are survived: Serve waits
// acceptBackoffMin, doubling up to acceptBackoffMax, and tries again.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// Serve accepts connections until ctx ends (or the listener is closed), then
// closes every connection, waits for their handlers and releases every
// allocation. Any other accept error (out of file descriptors, say) only
// pauses it: it is logged once per burst, and Serve backs off and goes on.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		return errors.New("Serve before Listen")
	}
	s.log.Info("helper listening", zap.String("socket", s.cfg.Socket), zap.Int("devices", len(s.cfg.Devices)),
		zap.String("unavailable", s.cfg.Unavailable))
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	defer stop()
	aliveStop := make(chan struct{})
	aliveDone := make(chan struct{})
	reaperDone := make(chan struct{})
	go func() {
		defer close(aliveDone)
		keepAlive(filepath.Join(filepath.Dir(s.cfg.Socket), "helper.alive"), aliveStop)
	}()
	go func() { defer close(reaperDone); s.runReaper(aliveStop) }()
	poolDone := make(chan struct{})
	go func() { defer close(poolDone); s.pool.run(aliveStop) }()
	defer func() { close(aliveStop); <-aliveDone; <-reaperDone; <-poolDone }()
	// Before the first accept, on purpose: the processes a dead helper
	// left get their memory back before new clients can take the GPU's
	// (their reattach waits in the listen backlog meanwhile).
	if s.cfg.Unavailable == "" {
		if s.cfg.ExportKeeper {
			keeper := startExportKeeper(s.cfg.Devices, s.log)
			defer keeper.close(s.log)
		}
		s.adoptOrphans()
	}
	var err error
	var (
		failures  int
		delay     time.Duration
		since     time.Time
		lastError error
	)
	for {
		c, aerr := s.ln.AcceptUnix()
		if aerr != nil {
			if errors.Is(aerr, net.ErrClosed) || ctx.Err() != nil {
				if ctx.Err() == nil {
					err = aerr
				}
				break
			}
			if failures == 0 {
				since = time.Now()
				s.log.Warn("accepting connections failed; retrying with backoff until it works again", zap.Error(aerr))
			}
			failures++
			lastError = aerr
			delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		if failures > 0 {
			s.log.Warn("accepting connections again", zap.Int("failed_accepts", failures),
				zap.Duration("for", time.Since(since)), zap.NamedError("last_error", lastError))
			failures, delay = 0, 0
		}
		s.Go(c)
	}
	s.Shutdown()
	return err
}

// Go serves one connection on its own goroutine (Serve's accept loop; tests),
// unless a connection limit refuses it.
func (s *Server) Go(nc *net.UnixConn) {
	wc, err := wire.New(nc)
	if err != nil {
		nc.Close()
		return
	}
	c := &conn{Conn: wc, log: s.log}
	if c.cred, err = wc.PeerCred(); err != nil {
		s.log.Warn("connection without peer credentials", zap.Error(err))
		nc.Close()
		return
	}
	c.log = s.log.With(zap.Int32("peer_pid", c.cred.Pid), zap.Uint32("peer_uid", c.cred.Uid))
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return
	}
	adm, why := s.counts.admit(c.cred.Uid)
	if adm == nil {
		s.mu.Unlock()
		s.refuse(c, why)
		return
	}
	s.conns[nc] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.conns, nc)
			s.mu.Unlock()
			adm.done()
		}()
		s.serveConn(c, adm)
	}()
}

// refuse answers a connection a limit refuses with an Error of id 0 (it
// answers no request: the helper has read nothing) and closes it. The
// socket is new, so the write does not wait; a peer that sent nothing yet
// reads the answer to its Hello.
func (s *Server) refuse(c *conn, why string) {
	if ok, skipped := s.refusedLog.allow(); ok {
		c.log.Warn("connection refused", zap.String("why", why), zap.Int("refused_since_last_line", skipped))
	}
	_ = c.UnixConn().SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_ = c.Write(errResp(0, helperpb.ErrorCode_ERROR_UNAVAILABLE, "helper refused the connection: %s", why), nil)
	c.Close()
}

// Shutdown closes every connection and waits for their handlers, which
// release the clients' allocations.
func (s *Server) Shutdown() {
	s.mu.Lock()
	if !s.closed {
		close(s.stopping)
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.salvage.dropAll()
	s.wakes.close()
	s.states.close()
	s.pool.close()
	if s.served != nil {
		s.served.Close(10 * time.Second)
	}
	if s.ln != nil {
		s.ln.Close()
	}
	s.log.Info("helper stopped")
}

// ---- connections ----

type conn struct {
	*wire.Conn
	cred *unix.Ucred
	// peer is the process that connected, held by a client's connections
	// (holdPeer; nil: peerErr says why there is none, such as it being
	// gone already). A calls connection hands it to the client it
	// registers (takePeer); a control connection lets it go when it
	// closes.
	peer         *proc.Process
	peerErr      error
	fscred       *fscred.Cred // the caller's file-system identity, once asked (fsCred)
	log          *zap.Logger
	wmu          sync.Mutex
	writeTimeout time.Duration // of each send; 0: none
	stalled      *burstLog     // where a stalled frame is logged; nil: at debug level
	rejected     *burstLog     // where a bad request is logged; nil: every one
	// fds came with the request being served, one that takes a descriptor
	// (takesFD, imagedir.go); its handler takes them (takeFD), and any left are
	// closed with the next request or the connection.
	fds []int
}

// send writes a response; a peer that does not read it within the frame
// timeout loses the connection.
func (c *conn) send(m *helperpb.Response, fds []int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.writeTimeout > 0 {
		_ = c.UnixConn().SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	return c.Write(m, fds)
}

// sendEncoded is send of a Response encoded already (a Status reply shared
// by many requests, encoded once).
func (c *conn) sendEncoded(body []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.writeTimeout > 0 {
		_ = c.UnixConn().SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	return c.WriteFrame(body, nil)
}

// holdPeer takes hold of the process that connected (c.peer, or c.peerErr
// says why there is none).
func (c *conn) holdPeer() {
	rc, err := c.UnixConn().SyscallConn()
	if err != nil {
		c.peerErr = err
		return
	}
	c.peer, c.peerErr = proc.Peer(rc, c.cred)
}

// Close closes the connection and lets its peer process go.
func (c *conn) Close() error {
	c.peer.Close()
	return c.Conn.Close()
}

// takePeer takes the connection's peer process (its new holder closes it),
// or says why there is none.
func (c *conn) takePeer() (*proc.Process, error) {
	p := c.peer
	c.peer = nil
	if p == nil {
		if c.peerErr != nil {
			return nil, c.peerErr
		}
		return nil, errors.New("the connecting process is not known")
	}
	return p, nil
}

func errResp(id uint64, code helperpb.ErrorCode, format string, a ...any) *helperpb.Response {
	return &helperpb.Response{Id: id, Error: &helperpb.Error{Code: code, Message: fmt.Sprintf(format, a...)}}
}

func okResp(id uint64) *helperpb.Response {
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
}

// reject answers ERROR_BAD_REQUEST; the caller then closes the connection.
func (c *conn) reject(id uint64, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if c.rejected == nil {
		c.log.Warn("bad request; closing the connection", zap.String("reason", msg))
	} else if ok, skipped := c.rejected.allow(); ok {
		c.log.Warn("bad request; closing the connection", zap.String("reason", msg),
			zap.Int("rejected_since_last_line", skipped))
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.UnixConn().SetWriteDeadline(time.Now().Add(time.Second))
	_ = c.Write(errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "%s", msg), nil)
}

// peerClosed says whether c's peer has closed the connection: a peek reads
// end of file (or a reset). Only for a connection nothing reads meanwhile
// (its request is being served), and which has sent nothing more.
func (c *conn) peerClosed() bool {
	raw, err := c.UnixConn().SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = (n == 0 && err == nil) || errors.Is(err, unix.ECONNRESET)
	})
	return closed
}

// waitPeerClosed polls peerClosed every 50 ms until c's peer has closed
// the connection (true) or limit has passed (false): the injected stalls
// end early this way, as the real work they stand for would. peerClosed's
// condition holds: nothing reads c meanwhile.
func (c *conn) waitPeerClosed(limit time.Duration) bool {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if c.peerClosed() {
			return true
		}
	}
	return false
}

// next reads the next request. nil: the connection is done (closed, or a
// bad frame that was answered).
func (c *conn) next() *helperpb.Request {
	req, fds, err := c.ReadRequest()
	if err != nil {
		c.readFailed(err)
		return nil
	}
	wire.CloseFDs(c.fds)
	c.fds = nil
	if len(fds) > 0 && (len(fds) > 1 || !takesFD(req)) {
		wire.CloseFDs(fds)
		c.reject(req.Id, "%d file descriptors attached to a request; only Checkpoint, PrepareRestore, LoadResident and UnloadResident take one (the image directory), ImportPeer (the fd imported) and AnalyzeModule (the image's sealed memfd)", len(fds))
		return nil
	}
	c.fds = fds
	if req.Body == nil {
		c.reject(req.Id, "request %d has no (known) body", req.Id)
		return nil
	}
	return req
}

// readFailed handles a read error: a bad frame is answered, a frame that
// stalled is logged (once per burst), the rest is the peer going away.
func (c *conn) readFailed(err error) {
	switch {
	case errors.Is(err, wire.ErrFrame):
		c.reject(0, "%v", err)
	case errors.Is(err, os.ErrDeadlineExceeded) && c.stalled != nil:
		if ok, skipped := c.stalled.allow(); ok {
			c.log.Warn("closing a connection whose frame (or Hello) did not come in time", zap.Error(err),
				zap.Int("closed_since_last_line", skipped))
		}
	case !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed):
		c.log.Debug("read", zap.Error(err))
	}
}

func (s *Server) serveConn(c *conn, adm *admission) {
	defer c.Close()
	defer func() { wire.CloseFDs(c.fds) }()
	c.writeTimeout = s.cfg.Limits.FrameTimeout
	c.stalled, c.rejected = &s.stalledLog, &s.rejectedLog
	// A peer that never says Hello does not hold a handler for long.
	c.SetReadLimits(s.readLimits(c, capOf(maxHello), time.Now().Add(s.cfg.Limits.HelloTimeout)))
	req := c.next()
	adm.helloDone()
	if req == nil {
		return
	}
	h := req.GetHello()
	if h == nil {
		c.reject(req.Id, "the first request must be Hello")
		return
	}
	if h.ProtocolVersion != wire.Version {
		c.log.Warn("protocol version mismatch", zap.Uint32("client_version", h.ProtocolVersion))
		_ = c.send(errResp(req.Id, helperpb.ErrorCode_ERROR_VERSION_MISMATCH,
			"protocol version mismatch: client speaks version %d, helper %s speaks version %d",
			h.ProtocolVersion, s.cfg.Version, wire.Version), nil)
		return
	}
	switch h.Role {
	case helperpb.Role_ROLE_CLIENT_CALLS, helperpb.Role_ROLE_CLIENT_CONTROL:
		// The process that connected, held: its pid is only a name, which
		// another process may have by the time a request comes. (The
		// kernel recorded that process at connect time: SO_PEERPIDFD.)
		c.holdPeer()
	}
	switch h.Role {
	case helperpb.Role_ROLE_CLIENT_CALLS:
		c.SetReadLimits(s.readLimits(c, capOf(maxCallsRequest), time.Time{}))
		s.serveCalls(c, req.Id, h)
	case helperpb.Role_ROLE_CLIENT_CONTROL:
		s.serveControl(c, req.Id, h) // sets its own limits
	case helperpb.Role_ROLE_CLI, helperpb.Role_ROLE_PLUGIN:
		c.SetReadLimits(s.readLimits(c, capOf(maxCLIRequest), time.Time{}))
		s.serveCLI(c, req.Id, h)
	case helperpb.Role_ROLE_SERVED:
		c.SetReadLimits(s.readLimits(c, capOf(maxCLIRequest), time.Time{}))
		s.serveServed(c, req.Id)
	default:
		c.reject(req.Id, "unknown role %d", h.Role)
	}
}

func devicesInfo(devs []Device) []*helperpb.DeviceInfo {
	out := make([]*helperpb.DeviceInfo, 0, len(devs))
	for _, d := range devs {
		// a copy: Status fills in its fields, and a Device may hand out
		// the same message every time
		out = append(out, proto.Clone(d.Info()).(*helperpb.DeviceInfo))
	}
	return out
}

func newToken() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic(err) // crypto/rand does not fail on Linux
		}
		if t := binary.LittleEndian.Uint64(b[:]); t != 0 {
			return t
		}
	}
}
