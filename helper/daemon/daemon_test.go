package daemon

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

func TestVersionMismatch(t *testing.T) {
	_, sock := startServer(t, newFake())
	c := dial(t, sock)
	r, _ := c.mustCall(&helperpb.Request{Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{ProtocolVersion: 7, Role: helperpb.Role_ROLE_CLIENT_CALLS}}})
	if r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_VERSION_MISMATCH ||
		!strings.Contains(r.Error.Message, "version 7") || !strings.Contains(r.Error.Message, "version 1") {
		t.Fatalf("version mismatch answer: %v", r)
	}
	if _, _, err := c.w.ReadFrame(); err == nil {
		t.Fatal("connection still open after a version mismatch")
	}
}

func TestAllocMappedFree(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	c := dial(t, sock)
	c.register()
	uuid := dev.Info().Uuid
	id, size := c.alloc(uuid, 1)
	if size != 2<<20 {
		t.Fatalf("1 byte rounded to %d", size)
	}
	id2, size2 := c.alloc(uuid, 5<<20)
	if size2 != 6<<20 || id2 == id {
		t.Fatalf("second alloc: id %d size %d", id2, size2)
	}
	if e := c.simple(mappedReq(id, 0x500000000000)); e != nil {
		t.Fatal(e)
	}
	st := status(t, sock)
	if len(st.Clients) != 1 || st.Clients[0].Allocations != 2 || st.Clients[0].Bytes != 8<<20 || st.Clients[0].Pid != int64(os.Getpid()) {
		t.Fatalf("status: %v", st.Clients)
	}
	if e := c.simple(freeReq(id)); e != nil {
		t.Fatal(e)
	}
	if e := c.simple(freeReq(id)); e == nil || e.Code != helperpb.ErrorCode_ERROR_NOT_FOUND {
		t.Fatalf("double free: %v", e)
	}
	if b, n := dev.Used(); b != 6<<20 || n != 1 {
		t.Fatalf("device: %d bytes in %d handles", b, n)
	}
	// Errors that keep the connection: unknown device, size 0, too big.
	for _, a := range []*helperpb.Alloc{{DeviceUuid: "GPU-nope", Size: 1}, {DeviceUuid: uuid}, {DeviceUuid: uuid, Size: 2 << 30}} {
		r, fds := c.mustCall(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: a}})
		if r.Error == nil || len(fds) != 0 {
			t.Fatalf("Alloc %v: %v", a, r)
		}
	}
	if e := c.simple(freeReq(id2)); e != nil {
		t.Fatal(e)
	}
}

func TestFreeOthersAllocation(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	a, b := dial(t, sock), dial(t, sock)
	a.register()
	b.register()
	id, _ := a.alloc(dev.Info().Uuid, 1<<20)
	if e := b.simple(freeReq(id)); e == nil || e.Code != helperpb.ErrorCode_ERROR_PERMISSION {
		t.Fatalf("B freeing A's allocation: %v", e)
	}
	if e := b.simple(mappedReq(id, 1)); e == nil || e.Code != helperpb.ErrorCode_ERROR_PERMISSION {
		t.Fatalf("B mapping A's allocation: %v", e)
	}
	if e := a.simple(freeReq(id)); e != nil {
		t.Fatalf("A freeing its own: %v", e)
	}
}

// An application's export of memory the helper serves is the helper's
// export: an fd of the very memory its Alloc gave, for the owner only.
func TestExportAllocation(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	a, b := dial(t, sock), dial(t, sock)
	a.register()
	b.register()
	r, fds := a.mustCall(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{
		DeviceUuid: dev.Info().Uuid, Size: 2 << 20, Kind: helperpb.AllocKind_ALLOC_KIND_VMM}}})
	if r.GetAlloc() == nil || len(fds) != 1 {
		t.Fatalf("Alloc: %v with %d fds", r, len(fds))
	}
	defer unix.Close(fds[0])
	id := r.GetAlloc().AllocId
	exportReq := func(id uint64) *helperpb.Request {
		return &helperpb.Request{Body: &helperpb.Request_Export{Export: &helperpb.Export{AllocId: id}}}
	}
	r, got := a.mustCall(exportReq(id))
	if r.Error != nil || r.GetOk() == nil || len(got) != 1 {
		t.Fatalf("Export of its own allocation: %v with %d fds", r, len(got))
	}
	var st1, st2 unix.Stat_t
	if err := unix.Fstat(fds[0], &st1); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(got[0], &st2); err != nil {
		t.Fatal(err)
	}
	unix.Close(got[0])
	if st1.Ino != st2.Ino || st1.Dev != st2.Dev {
		t.Fatalf("the exported fd is other memory than the allocation's")
	}
	if r, got := b.mustCall(exportReq(id)); r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_PERMISSION || len(got) != 0 {
		t.Fatalf("B exporting A's allocation: %v with %d fds", r, len(got))
	}
	if r, got := a.mustCall(exportReq(id + 100)); r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_NOT_FOUND || len(got) != 0 {
		t.Fatalf("exporting an unknown allocation: %v with %d fds", r, len(got))
	}
	if e := a.simple(freeReq(id)); e != nil {
		t.Fatal(e)
	}
	if r, _ := a.mustCall(exportReq(id)); r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_NOT_FOUND {
		t.Fatalf("exporting a freed allocation: %v", r)
	}
}

func TestMayControl(t *testing.T) {
	for _, c := range []struct {
		caller, owner uint32
		ok            bool
	}{{0, 1000, true}, {1000, 1000, true}, {1001, 1000, false}, {1000, 0, false}} {
		if got := mayControl(c.caller, c.owner); got != c.ok {
			t.Errorf("mayControl(%d, %d) = %v", c.caller, c.owner, got)
		}
	}
}

// A client that goes away leaves nothing behind.
func TestClosedClientReleased(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	c := dial(t, sock)
	c.register()
	for i := 0; i < 5; i++ {
		c.alloc(dev.Info().Uuid, 3<<20)
	}
	if b, _ := dev.Used(); b != 5*(4<<20) {
		t.Fatalf("used %d", b)
	}
	c.w.Close()
	waitFor(t, func() bool { b, n := dev.Used(); return b == 0 && n == 0 && len(status(t, sock).Clients) == 0 })
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached in 10s")
}

func TestConcurrentClients(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dial(t, sock)
			c.register()
			var ids []uint64
			for j := 0; j < 20; j++ {
				r, fds, err := c.call(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{DeviceUuid: dev.Info().Uuid, Size: uint64(j+1) << 16}}})
				if err != nil || r.GetAlloc() == nil || len(fds) != 1 {
					errs <- fmt.Errorf("alloc: %v %v", r, err)
					return
				}
				unix.Close(fds[0])
				ids = append(ids, r.GetAlloc().AllocId)
				if j%3 == 0 {
					r, _, err = c.call(freeReq(ids[0]))
					if err != nil || r.Error != nil {
						errs <- fmt.Errorf("free: %v %v", r, err)
						return
					}
					ids = ids[1:]
				}
			}
			for _, id := range ids {
				if r, _, err := c.call(freeReq(id)); err != nil || r.Error != nil {
					errs <- fmt.Errorf("free: %v %v", r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if b, n := dev.Used(); b != 0 || n != 0 {
		t.Fatalf("left behind: %d bytes, %d handles", b, n)
	}
}

// rawFrame writes bytes as they are (no framing help).
func rawSend(t *testing.T, c *tclient, b []byte, fds ...int) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.w.UnixConn().WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatal(err)
	}
}

func frame(body []byte) []byte {
	b := make([]byte, 4+len(body))
	binary.LittleEndian.PutUint32(b, uint32(len(body)))
	copy(b[4:], body)
	return b
}

// Hostile and malformed input: each connection gets ERROR_BAD_REQUEST (where
// an answer is possible) and is closed; another client is served throughout.
func TestMalformedFrames(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	good := dial(t, sock)
	good.register()
	helloCalls := frame(mustMarshal(&helperpb.Request{Id: 1, Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLIENT_CALLS}}}))
	cases := []struct {
		name  string
		send  func(*tclient)
		reply bool
	}{
		{"huge length", func(c *tclient) { rawSend(t, c, []byte{0xff, 0xff, 0xff, 0x7f}) }, true},
		{"zero length", func(c *tclient) { rawSend(t, c, []byte{0, 0, 0, 0}) }, true},
		{"garbage", func(c *tclient) { rawSend(t, c, frame([]byte{0xff, 0xfe, 0x01, 0x02, 0x03})) }, true},
		{"no body", func(c *tclient) { rawSend(t, c, frame([]byte{0x08, 0x05})) }, true},
		{"alloc before hello", func(c *tclient) {
			rawSend(t, c, frame(mustMarshal(&helperpb.Request{Id: 1, Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{Size: 1}}})))
		}, true},
		{"unknown role", func(c *tclient) {
			rawSend(t, c, frame(mustMarshal(&helperpb.Request{Id: 1, Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{ProtocolVersion: 1, Role: 99}}})))
		}, true},
		{"status on a calls connection", func(c *tclient) {
			c.register()
			rawSend(t, c, frame(mustMarshal(&helperpb.Request{Id: 2, Body: &helperpb.Request_Status{Status: &helperpb.Status{}}})))
		}, true},
		{"alloc on a CLI connection", func(c *tclient) {
			c.hello(helperpb.Role_ROLE_CLI, 0)
			rawSend(t, c, frame(mustMarshal(&helperpb.Request{Id: 2, Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{Size: 1}}})))
		}, true},
		{"second hello", func(c *tclient) {
			c.register()
			rawSend(t, c, helloCalls)
		}, true},
		{"fds where none expected", func(c *tclient) {
			f, _ := os.Open("/dev/null")
			defer f.Close()
			rawSend(t, c, helloCalls, int(f.Fd()), int(f.Fd()))
		}, true},
		{"fds in the middle of a frame", func(c *tclient) {
			f, _ := os.Open("/dev/null")
			defer f.Close()
			rawSend(t, c, helloCalls[:6])
			rawSend(t, c, helloCalls[6:], int(f.Fd()))
		}, true},
		{"truncated frame", func(c *tclient) { rawSend(t, c, helloCalls[:len(helloCalls)-2]); c.w.UnixConn().CloseWrite() }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, sock)
			tc.send(c)
			if tc.reply {
				r, _, err := c.w.ReadResponse()
				if err != nil || r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_BAD_REQUEST {
					t.Fatalf("answer %v, %v; want ERROR_BAD_REQUEST", r, err)
				}
			}
			if _, _, err := c.w.ReadFrame(); err == nil {
				t.Fatal("connection still open")
			}
			// The helper still serves the good client.
			id, _ := good.alloc(dev.Info().Uuid, 1)
			if e := good.simple(freeReq(id)); e != nil {
				t.Fatal(e)
			}
		})
	}
	if b, _ := dev.Used(); b != 0 {
		t.Fatalf("%d bytes left", b)
	}
}

func TestClientOpForwarding(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	app := dial(t, sock)
	token := app.register()
	// 205 mapped allocations: Reimport must come in frames of 200 and 5.
	var ids []uint64
	for i := 0; i < 205; i++ {
		id, _ := app.alloc(dev.Info().Uuid, 1)
		if e := app.simple(mappedReq(id, 0x500000000000+uint64(i)<<21)); e != nil {
			t.Fatal(e)
		}
		ids = append(ids, id)
	}
	unmapped, _ := app.alloc(dev.Info().Uuid, 1)

	cli := dial(t, sock)
	cli.hello(helperpb.Role_ROLE_CLI, 0)
	op := func(o helperpb.ClientOp_Op) *helperpb.Response {
		r, _ := cli.mustCall(&helperpb.Request{Body: &helperpb.Request_ClientOp{ClientOp: &helperpb.ClientOp{Pid: int64(os.Getpid()), Op: o, TimeoutMs: 2000}}})
		return r
	}
	// No control connection yet.
	if r := op(helperpb.ClientOp_OP_QUIESCE); r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_UNAVAILABLE {
		t.Fatalf("quiesce without control: %v", r)
	}
	st := status(t, sock)
	if c := st.Clients[0]; c.Checkpointable || c.ControlConnected || !strings.Contains(strings.Join(c.NotCheckpointable, ";"), "control connection down") {
		t.Fatalf("status without control: %v", c)
	}
	// A control connection from another process's token is refused.
	bad := dial(t, sock)
	if r := bad.hello(helperpb.Role_ROLE_CLIENT_CONTROL, token+1); r.Error == nil {
		t.Fatalf("control with a wrong token: %v", r)
	}
	fc := startControl(t, sock, token)
	waitFor(t, func() bool { return status(t, sock).Clients[0].ControlConnected })
	if c := status(t, sock).Clients[0]; !c.Checkpointable || c.State != helperpb.ClientState_CLIENT_STATE_RUNNING {
		t.Fatalf("status with control: %v", c)
	}
	fc.mu.Lock()
	if got := strings.Join(fc.asked, ","); !strings.HasPrefix(got, "stats,snapshot") {
		t.Errorf("status asked %s", got)
	}
	fc.asked = nil
	fc.mu.Unlock()
	for _, o := range []helperpb.ClientOp_Op{helperpb.ClientOp_OP_QUIESCE, helperpb.ClientOp_OP_DRAIN, helperpb.ClientOp_OP_DROP, helperpb.ClientOp_OP_REIMPORT, helperpb.ClientOp_OP_RESUME} {
		if r := op(o); r.Error != nil || r.GetClientOp() == nil {
			t.Fatalf("%v: %v", o, r)
		}
	}
	if r := op(helperpb.ClientOp_OP_SNAPSHOT); r.GetClientOp().GetTable() == nil {
		t.Fatalf("snapshot: %v", r)
	}
	if r := op(helperpb.ClientOp_OP_STATS); r.GetClientOp().GetStats().GetAllocs() != 3 {
		t.Fatalf("stats: %v", r)
	}
	fc.mu.Lock()
	if got := strings.Join(fc.asked, ","); got != "quiesce,drain,drop,reimport,reimport,resume,snapshot,stats" {
		t.Errorf("asked %s", got)
	}
	if len(fc.frames) != 2 || fc.frames[0] != 200 || fc.frames[1] != 5 || len(fc.reimported) != 205 {
		t.Errorf("reimport frames %v, %d entries", fc.frames, len(fc.reimported))
	}
	for i, e := range fc.reimported {
		if e.AllocId != ids[i] || e.Address != 0x500000000000+uint64(i)<<21 || e.Size != 2<<20 || e.AllocId == unmapped {
			t.Fatalf("entry %d: %v", i, e)
		}
	}
	// The client refuses: its error comes back to the CLI.
	fc.quiesceErr = &helperpb.Error{Code: helperpb.ErrorCode_ERROR_TIMEOUT, Message: "calls in progress"}
	fc.localAllocs = 2
	fc.reasons = []string{"managed memory"}
	fc.mu.Unlock()
	if r := op(helperpb.ClientOp_OP_QUIESCE); r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_TIMEOUT || !strings.Contains(r.Error.Message, "calls in progress") {
		t.Fatalf("refused quiesce: %v", r)
	}
	c := status(t, sock).Clients[0]
	if c.Checkpointable || len(c.NotCheckpointable) != 2 || !strings.Contains(c.NotCheckpointable[0], "2 allocations fell back") {
		t.Fatalf("status with reasons: %v", c)
	}
	// A client that does not answer in time.
	fc.mu.Lock()
	fc.delay = time.Second
	fc.mu.Unlock()
	c = status(t, sock).Clients[0]
	if c.Checkpointable || !strings.Contains(strings.Join(c.NotCheckpointable, ";"), "does not answer") {
		t.Fatalf("status of a slow client: %v", c)
	}
	// Unknown pid.
	r, _ := cli.mustCall(&helperpb.Request{Body: &helperpb.Request_ClientOp{ClientOp: &helperpb.ClientOp{Pid: 1, Op: helperpb.ClientOp_OP_STATS}}})
	if r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_NOT_FOUND {
		t.Fatalf("unknown pid: %v", r)
	}
	// Control gone: not checkpointable, ops unavailable.
	fc.c.w.Close()
	waitFor(t, func() bool { return !status(t, sock).Clients[0].ControlConnected })
}

func TestUnavailable(t *testing.T) {
	s := New(Config{Unavailable: "dlopen libcuda.so.1: not found"})
	if s.cfg.Unavailable == "" {
		t.Fatal("unavailable lost")
	}
	_, sock := startServer(t)
	if st := status(t, sock); st.Unavailable == "" {
		t.Fatalf("status without devices: %v", st)
	}
	c := dial(t, sock)
	if r := c.hello(helperpb.Role_ROLE_CLIENT_CALLS, 0); r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_UNAVAILABLE {
		t.Fatalf("calls Hello without GPU: %v", r)
	}
}

func TestListenStaleSocket(t *testing.T) {
	_, sock := startServer(t, newFake())
	// A second helper on a live socket refuses.
	if err := New(Config{Socket: sock}).Listen(); err == nil || !strings.Contains(err.Error(), "another helper") {
		t.Fatalf("second helper: %v", err)
	}
	dir := t.TempDir()
	stale := dir + "/x.sock"
	fd, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: stale}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	s := New(Config{Socket: stale, SocketMode: 0o660})
	if err := s.Listen(); err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	defer s.ln.Close()
	if fi, err := os.Stat(stale); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
}
