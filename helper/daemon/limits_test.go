package daemon

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// The tests run as root, which the limits exempt: limitRoot makes root a
// user like any other here.

// refusal reads what the helper answered a connection it refused.
func refusal(t *testing.T, c *tclient) *helperpb.Error {
	t.Helper()
	r, _, err := c.w.ReadResponse()
	if err != nil {
		t.Fatalf("no answer on a connection over the limit: %v", err)
	}
	if r.Id != 0 || r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_UNAVAILABLE {
		t.Fatalf("a connection over the limit was answered %v", r)
	}
	if _, _, err := c.w.ReadFrame(); err == nil {
		t.Fatal("a refused connection stays open")
	}
	return r.Error
}

// helloOK says Hello as the CLI and checks the answer.
func helloOK(t *testing.T, c *tclient) {
	t.Helper()
	if r := c.hello(helperpb.Role_ROLE_CLI, 0); r.GetHello() == nil {
		t.Fatalf("Hello: %v", r)
	}
}

func TestConnectionsPerUIDLimit(t *testing.T) {
	_, sock := startServerLimits(t, Limits{MaxConnsPerUID: 3, limitRoot: true}, newFake())
	var cs []*tclient
	for i := 0; i < 3; i++ {
		c := dial(t, sock)
		helloOK(t, c)
		cs = append(cs, c)
	}
	e := refusal(t, dial(t, sock))
	if !strings.Contains(e.Message, "has 3 connections") || !strings.Contains(e.Message, "--max-connections-per-uid") {
		t.Errorf("refusal: %q", e.Message)
	}
	cs[0].w.Close()
	waitFor(t, func() bool {
		c := dial(t, sock)
		r, _, err := c.call(&helperpb.Request{Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
			ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLI}}})
		return err == nil && r.GetHello() != nil
	})
}

func TestPendingConnectionsLimit(t *testing.T) {
	// 8 pending at most, 2 of one uid.
	_, sock := startServerLimits(t, Limits{MaxPending: 8, limitRoot: true}, newFake())
	a, b := dial(t, sock), dial(t, sock)
	e := refusal(t, dial(t, sock))
	if !strings.Contains(e.Message, "not sent their Hello") {
		t.Errorf("refusal: %q", e.Message)
	}
	// Past Hello a connection no longer counts.
	helloOK(t, a)
	waitFor(t, func() bool {
		c := dial(t, sock)
		r, _, err := c.call(&helperpb.Request{Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
			ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLI}}})
		return err == nil && r.GetHello() != nil
	})
	helloOK(t, b)
}

func TestRootIsNotLimited(t *testing.T) {
	_, sock := startServerLimits(t, Limits{MaxConnsPerUID: 2, MaxPending: 4}, newFake())
	for i := 0; i < 10; i++ {
		dial(t, sock) // never says Hello
	}
	helloOK(t, dial(t, sock))
}

// frame sends a frame header announcing n bytes and the first part bytes of
// body (zeros where body is shorter).
func sendPart(t *testing.T, c *tclient, n int, body []byte, part int) {
	t.Helper()
	b := make([]byte, 4+part)
	binary.LittleEndian.PutUint32(b, uint32(n))
	copy(b[4:], body)
	if _, err := c.w.UnixConn().Write(b); err != nil {
		t.Fatal(err)
	}
}

// padded is m serialized and padded to n bytes with an unknown field,
// which a decoder skips.
func padded(t *testing.T, m proto.Message, n int) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	tag := protowire.AppendTag(nil, 1000, protowire.BytesType)
	for pad := n - len(b) - len(tag); ; pad-- {
		p := protowire.AppendBytes(append(append([]byte{}, b...), tag...), make([]byte, pad))
		if len(p) == n {
			return p
		}
		if len(p) < n {
			t.Fatalf("cannot pad %d bytes to %d", len(b), n)
		}
	}
}

// closedByHelper says whether the helper closed c (a read gets EOF, or the
// reset of a closed connection) within timeout.
func closedByHelper(c *tclient, timeout time.Duration) bool {
	_ = c.w.UnixConn().SetReadDeadline(time.Now().Add(timeout))
	for {
		_, _, err := c.w.ReadResponse()
		if err == nil {
			continue // an answer (a rejection) before the close
		}
		return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err)
	}
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

func TestFrameCaps(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	bad := func(c *tclient, n int, what string) {
		t.Helper()
		sendPart(t, c, n, nil, 16)
		r, _, err := c.w.ReadResponse()
		if err != nil || r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_BAD_REQUEST ||
			!strings.Contains(r.Error.Message, "length") {
			t.Fatalf("%s: a frame of %d bytes answered %v, %v", what, n, r, err)
		}
		if !closedByHelper(c, 5*time.Second) {
			t.Fatalf("%s: the connection stays open after a frame of %d bytes", what, n)
		}
	}
	bad(dial(t, sock), maxHello+1, "before Hello")
	bad(dial(t, sock), wire.MaxFrame, "before Hello")
	cli := dial(t, sock)
	helloOK(t, cli)
	bad(cli, maxCLIRequest+1, "CLI")
	calls := dial(t, sock)
	calls.register()
	bad(calls, maxCallsRequest+1, "calls")

	// The largest legitimate requests pass: a Hello naming a program of
	// 128 KiB (the kernel's longest argv[0]), a Checkpoint naming two
	// paths of PATH_MAX.
	c := dial(t, sock)
	r, _ := c.mustCall(&helperpb.Request{Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
		ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLI, Program: strings.Repeat("p", 128<<10)}}})
	if r.GetHello() == nil {
		t.Fatalf("Hello with a 128 KiB program: %v", r)
	}
	long := "/" + strings.Repeat("d", 4095)
	r, _ = c.mustCall(&helperpb.Request{Body: &helperpb.Request_Checkpoint{Checkpoint: &helperpb.Checkpoint{
		Pid: 1 << 30, ImageDir: long, Parent: long, TimeoutMs: 1000}}})
	if r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_NOT_FOUND {
		t.Fatalf("Checkpoint of two PATH_MAX paths: %v", r)
	}
}

func TestControlAnswerCap(t *testing.T) {
	dev := newFake()
	s, sock := startServer(t, dev)
	calls := dial(t, sock)
	token := calls.register()
	ctl := startControl(t, sock, token)
	// An answer the helper asked for may be long: a snapshot listing
	// 20000 reasons (about 1 MiB).
	ctl.mu.Lock()
	for i := 0; i < 20000; i++ {
		ctl.reasons = append(ctl.reasons, strings.Repeat("r", 48))
	}
	ctl.mu.Unlock()
	// (Status shows the first 16 of them, and how many more.)
	st := status(t, sock)
	if len(st.Clients) != 1 {
		t.Fatalf("status with a 1 MiB snapshot: %d clients", len(st.Clients))
	}
	if rs := st.Clients[0].NotCheckpointable; len(rs) != maxReasons+1 || rs[maxReasons] != "and 19984 more" {
		t.Fatalf("status with a 1 MiB snapshot: %d reasons", len(rs))
	}
	// One nobody asked for may not: the control connection is closed.
	ctl.mu.Lock() // the fake answers nothing meanwhile
	const n = maxUnaskedAnswer + 1
	sendPart(t, ctl.c, n, padded(t, &helperpb.Response{Id: 1 << 40, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}, n), n)
	ctl.mu.Unlock()
	// Nothing asks the client meanwhile (a Status would, and the frame
	// would then be read as its answer): the helper's own record says when
	// the control connection is gone.
	waitFor(t, func() bool {
		cl := s.reg.withToken(token)
		cl.mu.Lock()
		defer cl.mu.Unlock()
		return cl.ctrl == nil
	})
	if st := status(t, sock); len(st.Clients) != 1 || st.Clients[0].ControlConnected {
		t.Errorf("status once the control connection is closed: %v", st.Clients)
	}
}

func TestFrameTimeout(t *testing.T) {
	dev := newFake()
	const timeout = 300 * time.Millisecond
	_, sock := startServerLimits(t, Limits{FrameTimeout: timeout, HelloTimeout: timeout}, dev)

	silent := dial(t, sock) // never says anything
	halfHello := dial(t, sock)
	sendPart(t, halfHello, 100, nil, 10)
	cli := dial(t, sock)
	helloOK(t, cli)
	sendPart(t, cli, 100, nil, 10)
	calls := dial(t, sock)
	calls.register()
	calls.alloc(dev.Info().Uuid, 2<<20)
	sendPart(t, calls, 100, nil, 3)
	idle := dial(t, sock)
	helloOK(t, idle)

	for name, c := range map[string]*tclient{"silent": silent, "half Hello": halfHello, "half request": cli, "half call": calls} {
		if !closedByHelper(c, 10*time.Second) {
			t.Errorf("%s: the connection stays open", name)
		}
	}
	// The calls connection's client is gone, its memory released.
	waitFor(t, func() bool { b, n := dev.Used(); return b == 0 && n == 0 })
	// A connection idle between frames stays, however long.
	time.Sleep(3 * timeout)
	if r, _, err := idle.call(&helperpb.Request{Body: &helperpb.Request_Status{Status: &helperpb.Status{}}}); err != nil || r.GetStatus() == nil {
		t.Fatalf("an idle connection after %v: %v, %v", 3*timeout, r, err)
	}
}

func TestInFlightBudget(t *testing.T) {
	s, sock := startServerLimits(t, Limits{InFlightBytes: 256 << 10, InFlightBytesPerUID: 128 << 10, limitRoot: true}, newFake())
	const n, size = 6, 60 << 10
	var cs []*tclient
	var bodies [][]byte
	for i := 0; i < n; i++ {
		c := dial(t, sock)
		helloOK(t, c)
		c.id++
		body := padded(t, &helperpb.Request{Id: c.id, Body: &helperpb.Request_Status{Status: &helperpb.Status{}}}, size)
		sendPart(t, c, size, body, 1<<10)
		cs, bodies = append(cs, c), append(bodies, body)
	}
	// Two frames fit in the uid's 128 KiB; the others wait.
	waitFor(t, func() bool { return s.frames.inFlight() == 2*size })
	time.Sleep(100 * time.Millisecond)
	if got := s.frames.inFlight(); got != 2*size {
		t.Fatalf("%d bytes in flight, want %d", got, 2*size)
	}
	for i, c := range cs {
		if _, err := c.w.UnixConn().Write(bodies[i][1<<10:]); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cs {
		r, _, err := c.w.ReadResponse()
		if err != nil || r.GetStatus() == nil {
			t.Fatalf("connection %d: %v, %v", i, r, err)
		}
	}
	waitFor(t, func() bool { return s.frames.inFlight() == 0 })
}

func TestBudget(t *testing.T) {
	done := make(chan struct{})
	b := newBudget(150, 100, done)
	soon := func() time.Time { return time.Now().Add(50 * time.Millisecond) }
	r1, err := b.reserve(1, 100, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.reserve(1, 1, soon()); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past the per-uid budget: %v", err)
	}
	r2, err := b.reserve(2, 50, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.reserve(3, 1, soon()); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past the whole budget: %v", err)
	}
	if _, err := b.reserve(2, 101, time.Time{}); !errors.Is(err, wire.ErrFrame) {
		t.Fatalf("more than the per-uid budget at once: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := b.reserve(3, 60, time.Time{})
		if err == nil {
			r()
		}
		got <- err
	}()
	r1()
	r1() // twice is once
	if err := <-got; err != nil {
		t.Fatalf("a wait ended by a release: %v", err)
	}
	r2()
	if b.inFlight() != 0 {
		t.Fatalf("%d in flight after every release", b.inFlight())
	}
	_, _ = b.reserve(4, 100, time.Time{})
	go func() { _, err := b.reserve(4, 100, time.Time{}); got <- err }()
	close(done)
	if err := <-got; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a wait when the server stops: %v", err)
	}
}

// take, the module analyses' use of a budget: past a uid's share it
// refuses at once; past the total it waits a while for bytes to come back,
// then refuses.
func TestBudgetTake(t *testing.T) {
	b := newBudget(150, 100, make(chan struct{}))
	r1, err := b.take(1, 80, 0)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := b.take(1, 30, time.Second); !errors.Is(err, errOverUID) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("past uid 1's share: %v after %v; want errOverUID at once", err, time.Since(start))
	}
	r2, err := b.take(2, 60, 0)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if _, err := b.take(3, 20, 50*time.Millisecond); !errors.Is(err, errOverTotal) || time.Since(start) < 40*time.Millisecond {
		t.Fatalf("past the total: %v after %v; want errOverTotal after the wait", err, time.Since(start))
	}
	go func() { time.Sleep(20 * time.Millisecond); r2() }()
	r3, err := b.take(3, 20, 5*time.Second)
	if err != nil {
		t.Fatalf("a wait ended by a release: %v", err)
	}
	if _, err := b.take(4, 101, time.Second); !errors.Is(err, errOverUID) {
		t.Fatalf("more than a uid's share at once: %v", err)
	}
	r1()
	r1()
	r3()
	if b.inFlight() != 0 {
		t.Fatalf("%d taken after every release", b.inFlight())
	}
}

func TestGPUMemoryLimit(t *testing.T) {
	dev := newFake()
	uuid := dev.Info().Uuid
	_, sock := startServerLimits(t, Limits{GPUMemoryPerUID: 8 << 20, limitRoot: true}, dev)
	a, b := dial(t, sock), dial(t, sock)
	a.register()
	b.register()
	id, _ := a.alloc(uuid, 4<<20)
	a.alloc(uuid, 4<<20)
	oom := func(c *tclient) {
		t.Helper()
		r, fds := c.mustCall(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{DeviceUuid: uuid, Size: 1}}})
		if r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_OUT_OF_MEMORY || len(fds) != 0 ||
			!strings.Contains(r.Error.Message, "may hold 8 MiB") || !strings.Contains(r.Error.Message, "holds 8 MiB") ||
			!strings.Contains(r.Error.Message, "--max-gpu-memory-per-uid") {
			t.Fatalf("an allocation past the limit: %v", r)
		}
	}
	oom(a)
	oom(b) // the limit is the uid's, over all its processes
	if used, _ := dev.Used(); used != 8<<20 {
		t.Fatalf("device: %d bytes used", used)
	}
	if e := a.simple(freeReq(id)); e != nil {
		t.Fatal(e)
	}
	b.alloc(uuid, 4<<20)
	oom(b)
}

func TestGPUMemoryLimitOverrides(t *testing.T) {
	for _, c := range []struct {
		name  string
		lim   Limits
		limit bool
	}{
		{"root by default", Limits{GPUMemoryPerUID: 4 << 20}, false},
		{"root named", Limits{GPUMemoryPerUID: 0, GPUMemoryByUID: map[uint32]uint64{0: 4 << 20}}, true},
		{"override to unlimited", Limits{GPUMemoryPerUID: 4 << 20, GPUMemoryByUID: map[uint32]uint64{0: 0}, limitRoot: true}, false},
		{"another uid named", Limits{GPUMemoryPerUID: 0, GPUMemoryByUID: map[uint32]uint64{1000: 4 << 20}, limitRoot: true}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dev := newFake()
			_, sock := startServerLimits(t, c.lim, dev)
			cl := dial(t, sock)
			cl.register()
			r, fds := cl.mustCall(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{DeviceUuid: dev.Info().Uuid, Size: 8 << 20}}})
			for _, fd := range fds {
				_ = os.NewFile(uintptr(fd), "").Close()
			}
			if limited := r.Error != nil && r.Error.Code == helperpb.ErrorCode_ERROR_OUT_OF_MEMORY; limited != c.limit {
				t.Fatalf("8 MiB: %v", r)
			}
		})
	}
}
