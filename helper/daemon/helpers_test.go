package daemon

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// startServer runs a helper on a fresh socket until the test ends.
func startServer(t testing.TB, devs ...Device) (*Server, string) {
	t.Helper()
	return startServerLimits(t, Limits{}, devs...)
}

// startServerLimits is startServer with limits.
func startServerLimits(t testing.TB, lim Limits, devs ...Device) (*Server, string) {
	t.Helper()
	return startServerConfig(t, Config{Limits: lim}, devs...)
}

// startServerConfig is startServer with cfg's limits and pool.
func startServerConfig(t testing.TB, cfg Config, devs ...Device) (*Server, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpucr-helper-test")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s", "helper.sock")
	s := New(Config{Socket: sock, Devices: devs, Version: "test", Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		StatusTimeout: 300 * time.Millisecond, Limits: cfg.Limits, Pool: cfg.Pool, ExportKeeper: cfg.ExportKeeper})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		os.RemoveAll(dir)
	})
	return s, sock
}

// tclient is the client side of the protocol, as the interposer speaks it.
type tclient struct {
	t  testing.TB
	w  *wire.Conn
	id uint64
}

func dial(t testing.TB, sock string) *tclient {
	t.Helper()
	nc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	w, _ := wire.New(nc)
	t.Cleanup(func() { w.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	return &tclient{t: t, w: w}
}

// call sends req and returns the response and its fds; err is a transport error.
func (c *tclient) call(req *helperpb.Request, fds ...int) (*helperpb.Response, []int, error) {
	c.id++
	req.Id = c.id
	if err := c.w.Write(req, fds); err != nil {
		return nil, nil, err
	}
	return c.w.ReadResponse()
}

func (c *tclient) mustCall(req *helperpb.Request) (*helperpb.Response, []int) {
	c.t.Helper()
	r, fds, err := c.call(req)
	if err != nil {
		c.t.Fatalf("%T: %v", req.Body, err)
	}
	return r, fds
}

func (c *tclient) hello(role helperpb.Role, token uint64) *helperpb.Response {
	c.t.Helper()
	r, _ := c.mustCall(&helperpb.Request{Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
		ProtocolVersion: 1, Role: role, ClientToken: token, Program: "test"}}})
	return r
}

func (c *tclient) register() uint64 {
	c.t.Helper()
	r := c.hello(helperpb.Role_ROLE_CLIENT_CALLS, 0)
	if r.GetHello() == nil || r.GetHello().ClientToken == 0 {
		c.t.Fatalf("calls Hello: %v", r)
	}
	return r.GetHello().ClientToken
}

// alloc allocates and checks the fd: a valid fd of the rounded size.
func (c *tclient) alloc(uuid string, size uint64) (id, rsize uint64) {
	c.t.Helper()
	r, fds := c.mustCall(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{
		DeviceUuid: uuid, Size: size, Kind: helperpb.AllocKind_ALLOC_KIND_MEM_ALLOC}}})
	a := r.GetAlloc()
	if a == nil || len(fds) != 1 {
		c.t.Fatalf("Alloc(%d): %v with %d fds", size, r, len(fds))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fds[0], &st); err != nil || uint64(st.Size) != a.Size {
		c.t.Fatalf("alloc fd: size %d, reply size %d, %v", st.Size, a.Size, err)
	}
	unix.Close(fds[0])
	return a.AllocId, a.Size
}

func (c *tclient) simple(req *helperpb.Request) *helperpb.Error {
	c.t.Helper()
	r, _ := c.mustCall(req)
	return r.Error
}

func mappedReq(id, addr uint64) *helperpb.Request {
	return &helperpb.Request{Body: &helperpb.Request_Mapped{Mapped: &helperpb.Mapped{AllocId: id, Address: addr}}}
}

func freeReq(id uint64) *helperpb.Request {
	return &helperpb.Request{Body: &helperpb.Request_Free{Free: &helperpb.Free{AllocId: id}}}
}

func status(t testing.TB, sock string) *helperpb.StatusReply {
	t.Helper()
	c := dial(t, sock)
	c.hello(helperpb.Role_ROLE_CLI, 0)
	r, _ := c.mustCall(&helperpb.Request{Body: &helperpb.Request_Status{Status: &helperpb.Status{}}})
	if r.GetStatus() == nil {
		t.Fatalf("Status: %v", r)
	}
	c.w.Close()
	return r.GetStatus()
}

// fakeControl answers the helper's requests on a control connection the way
// the interposer does, and records what it was asked.
type fakeControl struct {
	c *tclient

	mu          sync.Mutex
	asked       []string
	reimported  []*helperpb.ReimportEntry
	frames      []int
	state       helperpb.ClientState
	reasons     []string
	localAllocs uint64
	quiesceErr  *helperpb.Error
	delay       time.Duration
}

func startControl(t testing.TB, sock string, token uint64) *fakeControl {
	t.Helper()
	c := dial(t, sock)
	_ = c.w.UnixConn().SetDeadline(time.Time{})
	if r := c.hello(helperpb.Role_ROLE_CLIENT_CONTROL, token); r.GetHello() == nil {
		t.Fatalf("control Hello: %v", r)
	}
	f := &fakeControl{c: c, state: helperpb.ClientState_CLIENT_STATE_RUNNING}
	go f.serve()
	return f
}

func (f *fakeControl) serve() {
	for {
		req, fds, err := f.c.w.ReadRequest()
		if err != nil {
			return
		}
		f.mu.Lock()
		time.Sleep(f.delay)
		resp := &helperpb.Response{Id: req.Id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
		switch b := req.Body.(type) {
		case *helperpb.Request_Quiesce:
			f.asked = append(f.asked, "quiesce")
			if f.quiesceErr != nil {
				resp = &helperpb.Response{Id: req.Id, Error: f.quiesceErr}
			} else {
				f.state = helperpb.ClientState_CLIENT_STATE_QUIESCED
			}
		case *helperpb.Request_Drain:
			f.asked = append(f.asked, "drain")
		case *helperpb.Request_Drop:
			f.asked = append(f.asked, "drop")
			f.state = helperpb.ClientState_CLIENT_STATE_DROPPED
		case *helperpb.Request_Reimport:
			f.asked = append(f.asked, "reimport")
			f.frames = append(f.frames, len(b.Reimport.Entries))
			if len(fds) != len(b.Reimport.Entries) {
				resp = &helperpb.Response{Id: req.Id, Error: &helperpb.Error{Code: helperpb.ErrorCode_ERROR_BAD_REQUEST, Message: "fd count"}}
			}
			for i, e := range b.Reimport.Entries {
				var st unix.Stat_t
				if i < len(fds) && (unix.Fstat(fds[i], &st) != nil || uint64(st.Size) != e.Size) {
					resp = &helperpb.Response{Id: req.Id, Error: &helperpb.Error{Code: helperpb.ErrorCode_ERROR_BAD_REQUEST, Message: "fd size"}}
				}
			}
			f.reimported = append(f.reimported, b.Reimport.Entries...)
		case *helperpb.Request_Resume:
			f.asked = append(f.asked, "resume")
			f.state = helperpb.ClientState_CLIENT_STATE_RUNNING
		case *helperpb.Request_Snapshot:
			f.asked = append(f.asked, "snapshot")
			resp.Body = &helperpb.Response_Table{Table: &helperpb.BufferTable{State: f.state, NotCheckpointable: f.reasons}}
		case *helperpb.Request_GetStats:
			f.asked = append(f.asked, "stats")
			resp.Body = &helperpb.Response_Stats{Stats: &helperpb.ClientStats{Allocs: 3, LocalAllocs: f.localAllocs}}
		case *helperpb.Request_HoldSync:
			f.asked = append(f.asked, "hold")
			resp.Body = &helperpb.Response_SyncCount{SyncCount: &helperpb.SyncCount{Count: 7}}
		case *helperpb.Request_ReachSync:
			f.asked = append(f.asked, fmt.Sprintf("reach-%d", b.ReachSync.Target))
		case *helperpb.Request_ReleaseSync:
			f.asked = append(f.asked, "release")
		}
		f.mu.Unlock()
		wire.CloseFDs(fds)
		if err := f.c.w.Write(resp, nil); err != nil {
			return
		}
	}
}

func newFake() *fakegpu.Device { return fakegpu.New(0, 1<<30) }

func newFakeTotal(total uint64) *fakegpu.Device { return fakegpu.New(0, total) }

var _ Device = (*fakegpu.Device)(nil)
