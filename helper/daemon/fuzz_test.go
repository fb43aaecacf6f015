package daemon

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
	"github.com/gpucr/gpucr/ptx"
)

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// fuzzUUID is the fuzzed connections' device (ordinal 0 of fakegpu).
const fuzzUUID = "GPU-00000000-0000-0000-0000-000000000000"

// req frames one request.
func req(id uint64, body proto.Message) []byte {
	r := &helperpb.Request{Id: id}
	switch b := body.(type) {
	case *helperpb.Hello:
		r.Body = &helperpb.Request_Hello{Hello: b}
	case *helperpb.Alloc:
		r.Body = &helperpb.Request_Alloc{Alloc: b}
	case *helperpb.Mapped:
		r.Body = &helperpb.Request_Mapped{Mapped: b}
	case *helperpb.Free:
		r.Body = &helperpb.Request_Free{Free: b}
	case *helperpb.Export:
		r.Body = &helperpb.Request_Export{Export: b}
	case *helperpb.ImportPeer:
		r.Body = &helperpb.Request_ImportPeer{ImportPeer: b}
	case *helperpb.AnalyzeModule:
		r.Body = &helperpb.Request_AnalyzeModule{AnalyzeModule: b}
	case *helperpb.SaveFirst:
		r.Body = &helperpb.Request_SaveFirst{SaveFirst: b}
	case *helperpb.LoadFirst:
		r.Body = &helperpb.Request_LoadFirst{LoadFirst: b}
	case *helperpb.Status:
		r.Body = &helperpb.Request_Status{Status: b}
	case *helperpb.ClientOp:
		r.Body = &helperpb.Request_ClientOp{ClientOp: b}
	case *helperpb.Transfers:
		r.Body = &helperpb.Request_Transfers{Transfers: b}
	case *helperpb.WaitRestored:
		r.Body = &helperpb.Request_WaitRestored{WaitRestored: b}
	case *helperpb.LoadResident:
		r.Body = &helperpb.Request_LoadResident{LoadResident: b}
	case *helperpb.UnloadResident:
		r.Body = &helperpb.Request_UnloadResident{UnloadResident: b}
	default:
		panic("req: add the case")
	}
	return frame(mustMarshal(r))
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// fuzzSeed is a connection's bytes that reach one request's handler: its
// last request, which must be answered (want: what the answer says, a body
// type or words of an error), not refused for what the connection is.
type fuzzSeed struct {
	name string
	in   []byte
	want string
}

func fuzzSeeds() []fuzzSeed {
	calls := req(1, &helperpb.Hello{ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLIENT_CALLS, Program: "fuzz\n\x1b[2J"})
	cli := req(1, &helperpb.Hello{ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLI})
	alloc := req(2, &helperpb.Alloc{DeviceUuid: fuzzUUID, Size: 1})
	ranges := []*helperpb.AddressRange{{Address: 0x7000_0000_0000, Size: 4096}}
	return []fuzzSeed{
		{"alloc", cat(calls, alloc), "alloc"},
		{"alloc-mapped-free", cat(calls, alloc, req(3, &helperpb.Mapped{AllocId: 1, Address: 0x7000_0000_0000}),
			req(4, &helperpb.Free{AllocId: 1})), "ok"},
		{"export", cat(calls, alloc, req(3, &helperpb.Export{AllocId: 1})), "ok"},
		{"export-twice", cat(calls, alloc, req(3, &helperpb.Export{AllocId: 1}), req(4, &helperpb.Export{AllocId: 1})), "ok"},
		{"export-unknown", cat(calls, req(2, &helperpb.Export{AllocId: 99})), "no allocation"},
		{"import-peer-no-fd", cat(calls, req(2, &helperpb.ImportPeer{})), "without the fd"},
		{"analyze-module-no-fd", cat(calls, req(2, &helperpb.AnalyzeModule{Address: 0x1000, Size: 100})), "sealed memfd"}, // the deprecated field alone
		{"save-first", cat(calls, req(2, &helperpb.SaveFirst{Ranges: ranges})), "ok"},
		{"load-first", cat(calls, req(2, &helperpb.LoadFirst{Ranges: ranges})), "ok"},
		{"load-first-all", cat(calls, req(2, &helperpb.LoadFirst{All: true})), "ok"},
		{"status-pids", cat(cli, req(2, &helperpb.Status{Pids: []int64{1, int64(os.Getpid())}})), "status"},
		{"client-op", cat(cli, req(2, &helperpb.ClientOp{Pid: 1, Op: helperpb.ClientOp_OP_STATS})), "no client"},
		{"transfers", cat(cli, req(2, &helperpb.Transfers{})), "transfers"},
		{"wait-restored", cat(cli, req(2, &helperpb.WaitRestored{ImageDir: "/nonexistent", TimeoutMs: 1})), "restore"},
		{"load-resident", cat(cli, req(2, &helperpb.LoadResident{ImageDir: "/nonexistent"})), "image directory"},
		{"unload-resident", cat(cli, req(2, &helperpb.UnloadResident{ImageDir: "/nonexistent"})), "image directory"},
	}
}

// fuzzServer is a helper for fuzzing: the fuzzed connections allocate on
// dev, which must be empty again after each; with a peer, a client of its
// own has exported an allocation of dev2, whose fd (export) the
// fd-carrying target may attach (it takes allocation id 1: the seeds that
// name id 1 are for a server without one).
type fuzzServer struct {
	s      *Server
	dev    *fakegpu.Device
	export int
	// peer is the client that exported export, kept reachable: its
	// connection, collected, would be closed by its finalizer, and the
	// helper would forget the export (CI saw import-peer refused so).
	peer *tclient
}

func newFuzzServer(t testing.TB, peer bool) *fuzzServer {
	dev, dev2 := fakegpu.New(0, 64<<20), fakegpu.New(1, 64<<20)
	s := New(Config{Devices: []Device{dev, dev2}, Version: "fuzz", Log: zap.NewNop(), StatusTimeout: 10 * time.Millisecond})
	fs := &fuzzServer{s: s, dev: dev, export: -1}
	if !peer {
		return fs
	}
	fds, err := socketpair()
	if err != nil {
		t.Fatal(err)
	}
	s.Go(fds[0])
	w, _ := wire.New(fds[1])
	c := &tclient{t: t, w: w}
	c.register()
	id, _ := c.alloc(dev2.Info().Uuid, 2<<20)
	r, efds := c.mustCall(exportReq(id))
	if r.Error != nil || len(efds) != 1 {
		t.Fatalf("the peer's export: %v", r)
	}
	fs.export, fs.peer = efds[0], c
	return fs
}

// fdFor makes the descriptor kind names for a fuzzed request (-1: none),
// which the caller closes: a module image's sealed memfd, memfds without
// the seals or empty, /dev/null, a pipe, a directory, the peer's export.
func (fs *fuzzServer) fdFor(kind uint8) int {
	memfd := func(b []byte, seals int) int {
		fd, err := unix.MemfdCreate("fuzz", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			return -1
		}
		_, _ = unix.Write(fd, b)
		if seals != 0 {
			_, _ = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
		}
		return fd
	}
	dup := func(fd int, err error) int {
		if err != nil {
			return -1
		}
		return fd
	}
	switch kind % 8 {
	case 1:
		return memfd([]byte(ptx.Kernels), imageSeals)
	case 2:
		return memfd([]byte(ptx.Kernels), 0)
	case 3:
		return memfd(nil, imageSeals)
	case 4:
		return dup(unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0))
	case 5:
		var p [2]int
		if unix.Pipe2(p[:], unix.O_CLOEXEC) != nil {
			return -1
		}
		unix.Close(p[1])
		return p[0]
	case 6:
		return dup(unix.Open(os.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0))
	case 7:
		if fs.export < 0 {
			return -1
		}
		return dup(unix.FcntlInt(uintptr(fs.export), unix.F_DUPFD_CLOEXEC, 0))
	}
	return -1
}

// serve feeds in to a new connection, with fd (if not -1) attached to the
// byte at offset at, and returns every answer it got until the helper
// closed the connection. It must answer or close, never hang, and leave
// nothing allocated on fs.dev once the connection is gone.
func (fs *fuzzServer) serve(t testing.TB, in []byte, at int, fd int) []*helperpb.Response {
	pair, err := socketpair()
	if err != nil {
		t.Skip(err)
	}
	a, b := pair[0], pair[1]
	fs.s.Go(a)
	_ = b.SetDeadline(time.Now().Add(5 * time.Second))
	go func() {
		at := min(max(at, 0), len(in))
		_, _ = b.Write(in[:at])
		if fd >= 0 && at < len(in) {
			_, _, _ = b.WriteMsgUnix(in[at:], unix.UnixRights(fd), nil)
		} else {
			_, _ = b.Write(in[at:])
		}
		_ = b.CloseWrite()
	}()
	var got []*helperpb.Response
	w, _ := wire.New(b)
	for {
		r, fds, err := w.ReadResponse()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, wire.ErrFrame) ||
				errors.Is(err, unix.ECONNRESET) || errors.Is(err, net.ErrClosed) {
				break
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the helper neither answered nor closed the connection within 5 s")
			}
			break
		}
		wire.CloseFDs(fds)
		got = append(got, r)
	}
	b.Close()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if n, _ := fs.dev.Used(); n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("allocations left after the connection closed")
		}
	}
	return got
}

// FuzzServeFrame feeds arbitrary bytes to a connection handler, as any local
// user can: it must answer or close, never panic or hang, and leave nothing
// allocated once the connection is gone.
func FuzzServeFrame(f *testing.F) {
	for _, sd := range fuzzSeeds() {
		f.Add(sd.in)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	fs := newFuzzServer(f, false)
	f.Fuzz(func(t *testing.T, in []byte) { fs.serve(t, in, 0, -1) })
}

// FuzzServeFrameFD is FuzzServeFrame with a descriptor attached to the
// sendmsg that carries the byte at offset at: the requests that take one
// (ImportPeer, AnalyzeModule, LoadResident...) get each kind of file, and
// every other request, or the middle of a frame, one it must refuse.
func FuzzServeFrameFD(f *testing.F) {
	calls := req(1, &helperpb.Hello{ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLIENT_CALLS})
	cli := req(1, &helperpb.Hello{ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLI})
	alloc := req(2, &helperpb.Alloc{DeviceUuid: fuzzUUID, Size: 1})
	analyze := req(2, &helperpb.AnalyzeModule{Size: uint64(len(ptx.Kernels))})
	for kind := uint8(0); kind < 8; kind++ {
		f.Add(cat(calls, analyze), uint16(len(calls)), kind)
		f.Add(cat(calls, alloc, req(3, &helperpb.ImportPeer{})), uint16(len(calls)+len(alloc)), kind)
	}
	f.Add(cat(calls, alloc), uint16(len(calls)), uint8(1))     // an fd on Alloc
	f.Add(cat(calls, analyze), uint16(len(calls)+3), uint8(1)) // in the middle of a frame
	f.Add(cat(cli, req(2, &helperpb.LoadResident{ImageDir: "x"})), uint16(len(cli)), uint8(6))
	f.Add(cat(cli, req(2, &helperpb.UnloadResident{ImageDir: "x"})), uint16(len(cli)), uint8(6))
	f.Add(cat(cli, req(2, &helperpb.Status{})), uint16(len(cli)), uint8(4))
	fs := newFuzzServer(f, true)
	f.Fuzz(func(t *testing.T, in []byte, at uint16, kind uint8) {
		fd := fs.fdFor(kind)
		defer func() {
			if fd >= 0 {
				unix.Close(fd)
			}
		}()
		fs.serve(t, in, int(at), fd)
	})
}

// Every seed reaches its request's handler: its last request is answered
// as that request is, not refused for the connection's role nor closed.
func TestFuzzSeedsReachTheirHandlers(t *testing.T) {
	for _, sd := range fuzzSeeds() {
		got := newFuzzServer(t, false).serve(t, sd.in, 0, -1) // the seed's allocation is id 1
		var last *helperpb.Response
		var n uint64
		for _, r := range got {
			if r.Id > n {
				n, last = r.Id, r
			}
		}
		if last == nil || n < 2 {
			t.Errorf("%s: answers %v", sd.name, got)
			continue
		}
		if s := strings.ToLower(last.String()); !strings.Contains(s, sd.want) || strings.Contains(s, "not allowed") {
			t.Errorf("%s: last answer %v; want one saying %q", sd.name, last, sd.want)
		}
	}
	// With their descriptors: an analysis and a peer's import.
	fs := newFuzzServer(t, true)
	calls := req(1, &helperpb.Hello{ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLIENT_CALLS})
	for _, c := range []struct {
		name string
		in   []byte
		kind uint8
		want func(*helperpb.Response) bool
	}{
		{"analyze-module", cat(calls, req(2, &helperpb.AnalyzeModule{Size: uint64(len(ptx.Kernels))})), 1,
			func(r *helperpb.Response) bool { return len(r.GetModuleKernels().GetKernels()) > 0 }},
		{"analyze-module-unsealed", cat(calls, req(2, &helperpb.AnalyzeModule{Size: uint64(len(ptx.Kernels))})), 2,
			func(r *helperpb.Response) bool { return strings.Contains(r.GetError().GetMessage(), "seals") }},
		{"import-peer", cat(calls, req(2, &helperpb.ImportPeer{})), 7,
			func(r *helperpb.Response) bool { return r.GetAlloc().GetAllocId() != 0 }},
		{"import-peer-null", cat(calls, req(2, &helperpb.ImportPeer{})), 4,
			func(r *helperpb.Response) bool { return r.GetError().GetCode() == helperpb.ErrorCode_ERROR_NOT_FOUND }},
	} {
		fd := fs.fdFor(c.kind)
		got := fs.serve(t, c.in, len(calls), fd)
		unix.Close(fd)
		if len(got) < 2 || got[len(got)-1].Id != 2 || !c.want(got[len(got)-1]) {
			t.Errorf("%s: answers %v", c.name, got)
		}
	}
}

func socketpair() ([2]*net.UnixConn, error) {
	var out [2]*net.UnixConn
	fds, err := unixSocketpair()
	if err != nil {
		return out, err
	}
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "sp")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return out, err
		}
		out[i] = c.(*net.UnixConn)
	}
	return out, nil
}
