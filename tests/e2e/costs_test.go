package e2e

// What another user can make the helper spend through the requests added
// since the last audits (Export, ImportPeer, AnalyzeModule, Hello's
// program), with the helper's socket open to every user (--socket-mode
// 0666): descriptors, memory, other processes' memory, and the size of its
// Status reply. None of it may reach another user's jobs or root's.

import (
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// callsClient is a calls connection of a client registered by hand, as a
// hostile user's own program speaks the protocol.
type callsClient struct {
	t    testing.TB
	w    *wire.Conn
	id   uint64
	uuid string // the helper's first device
}

// registerCalls says Hello as an interposer's calls connection on c.
func registerCalls(t testing.TB, c *net.UnixConn) *callsClient {
	t.Helper()
	h, err := helloWith(c, helperpb.Role_ROLE_CLIENT_CALLS, 0)
	if err != nil {
		t.Fatalf("calls Hello: %v", err)
	}
	if len(h.Devices) == 0 {
		t.Fatal("the helper announces no device")
	}
	w, err := wire.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return &callsClient{t: t, w: w, id: 1, uuid: h.Devices[0].Uuid}
}

// call sends req with fds and returns the answer and the fds that came with
// it (the caller closes them).
func (c *callsClient) call(req *helperpb.Request, fds ...int) (*helperpb.Response, []int) {
	c.t.Helper()
	c.id++
	req.Id = c.id
	_ = c.w.UnixConn().SetDeadline(time.Now().Add(30 * time.Second))
	defer c.w.UnixConn().SetDeadline(time.Time{})
	if err := c.w.Write(req, fds); err != nil {
		c.t.Fatalf("%T: %v", req.Body, err)
	}
	r, rfds, err := c.w.ReadResponse()
	if err != nil {
		c.t.Fatalf("%T: no answer: %v", req.Body, err)
	}
	return r, rfds
}

func (c *callsClient) alloc(size uint64) uint64 {
	c.t.Helper()
	r, fds := c.call(&helperpb.Request{Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{DeviceUuid: c.uuid, Size: size,
		Kind: helperpb.AllocKind_ALLOC_KIND_MEM_ALLOC}}})
	wire.CloseFDs(fds)
	if r.GetAlloc() == nil {
		c.t.Fatalf("Alloc: %v", r)
	}
	return r.GetAlloc().AllocId
}

// export asks for an export of allocation id: the answer, and its fd (-1:
// none).
func (c *callsClient) export(id uint64) (*helperpb.Response, int) {
	c.t.Helper()
	r, fds := c.call(&helperpb.Request{Body: &helperpb.Request_Export{Export: &helperpb.Export{AllocId: id}}})
	if len(fds) > 1 {
		c.t.Fatalf("Export answered with %d fds", len(fds))
	}
	if len(fds) == 0 {
		return r, -1
	}
	return r, fds[0]
}

// TestExportFloodAsAnotherUser: another user exports one allocation 5,000
// times and then as many allocations as the per-uid cap allows and one
// more. The helper keeps one descriptor per exported allocation (it kept
// one per request: 20,000 requests filled its descriptor table, and other
// users' jobs then ran without checkpoint support and checkpoints failed),
// refuses the allocation past the cap naming it, and root's job registers
// and is checkpointed meanwhile. Once the user's connection is gone, the
// helper's descriptors are what they were.
func TestExportFloodAsAnotherUser(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	env := gpucrEnv(t)
	const limit = 16
	h := startHelper(t, dir, env, "--socket-mode", "0666", "--max-exports-per-uid", strconv.Itoa(limit))
	pid := h.pid()
	fd0 := settledFDs(t, pid)

	conns := dialAs(t, h.socket, &u, 1, nil)
	c := registerCalls(t, conns[0])
	ids := []uint64{c.alloc(2 << 20)}
	afterAlloc := fdCount(t, pid)
	first := -1
	for i := 0; i < 5000; i++ {
		r, fd := c.export(ids[0])
		if r.Error != nil || fd < 0 {
			t.Fatalf("Export %d of one allocation: %v", i, r)
		}
		if first < 0 {
			first = fd
			continue
		}
		if !sameOpenFile(first, fd) {
			t.Fatalf("Export %d of one allocation handed out another open file than the first", i)
		}
		unix.Close(fd)
	}
	unix.Close(first)
	if n := fdCount(t, pid); n > afterAlloc+4 {
		t.Errorf("5,000 Exports of one allocation: the helper holds %d more descriptors than before them", n-afterAlloc)
	}
	for len(ids) < limit+1 {
		ids = append(ids, c.alloc(2<<20))
	}
	for i, id := range ids {
		r, fd := c.export(id)
		if fd >= 0 {
			unix.Close(fd)
		}
		switch {
		case i < limit && (r.Error != nil || fd < 0):
			t.Fatalf("Export of allocation %d of %d, within the cap: %v", i+1, len(ids), r)
		case i == limit && (r.Error == nil || fd >= 0 || !strings.Contains(r.Error.Message, "--max-exports-per-uid") ||
			!strings.Contains(r.Error.Message, fmt.Sprintf("uid %d", u.UID))):
			t.Fatalf("Export of a %dth allocation past the cap of %d: %v; want a refusal naming the limit", i+1, limit, r)
		}
	}

	// Root's job registers, runs and is checkpointed meanwhile.
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "8", "--buffers", "2", "--interval-ms", "20")
	a.waitIter(3, 30*time.Second)
	if _, _, ok := h.client(a.pid); !ok {
		t.Fatalf("root's job is no client of the helper:\n%s", tail(a.output(), 10))
	}
	if out, err := gpucrCLI(t, h, "checkpoint", strconv.Itoa(a.pid), "-D", t.TempDir(), "--gpu-only", "--leave-running"); err != nil ||
		!strings.Contains(out, "state running") {
		t.Fatalf("root's checkpoint during the flood: %v\n%s", err, out)
	}
	a.kill()

	conns[0].Close()
	waitForCond(t, 10*time.Second, func() bool { return fdCount(t, pid) <= fd0+2 },
		func() string { return fmt.Sprintf("the helper has %d descriptors once the user has gone, %d before", fdCount(t, pid), fd0) })
}

// sameOpenFile reports whether fds a and b of this process are one open
// file (kcmp(2), KCMP_FILE).
func sameOpenFile(a, b int) bool {
	pid := uintptr(unix.Getpid())
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, 0, uintptr(a), uintptr(b), 0)
	return errno == 0 && r == 0
}

// analyzeReq is an AnalyzeModule of image, as the interposer sends it.
func analyzeReq(t testing.TB, image []byte) (*helperpb.Request, []int) {
	t.Helper()
	return &helperpb.Request{Body: &helperpb.Request_AnalyzeModule{AnalyzeModule: &helperpb.AnalyzeModule{
		Address: uint64(uintptr(unsafe.Pointer(&image[0]))), Size: uint64(len(image))}}}, nil
}

// TestModuleAnalysisMemoryBounded: 24 clients of another user ask at once
// for analyses of 64 MiB module images. The helper analyses at most its
// per-uid budget of bytes at once and refuses the rest at once, saying
// why; its peak resident memory grows by a bounded amount, it gives the
// memory back afterwards, and root's status is answered quickly
// throughout. (A helper that read every image grew from 98 MiB to 2.9 GiB
// and kept it; another user's status took 3.4 s.)
func TestModuleAnalysisMemoryBounded(t *testing.T) {
	u := secondUser(t)
	dir := sharedDir(t)
	h := startHelper(t, dir, gpucrEnv(t), "--socket-mode", "0666")
	pid := h.pid()
	h.status()
	rss0 := procStatusKiB(t, pid, "VmRSS") << 10
	const clients, size = 24, 64 << 20
	image := make([]byte, size)
	for i := range image {
		image[i] = byte(i)
	}
	var cs []*callsClient
	for _, c := range dialAs(t, h.socket, &u, clients, nil) {
		cs = append(cs, registerCalls(t, c))
	}
	type result struct {
		r   *helperpb.Response
		err error
	}
	results := make(chan result, clients)
	for _, c := range cs {
		go func() {
			req, fds := analyzeReq(t, image)
			c.id++
			req.Id = c.id
			_ = c.w.UnixConn().SetDeadline(time.Now().Add(time.Minute))
			err := c.w.Write(req, fds)
			wire.CloseFDs(fds)
			var r *helperpb.Response
			if err == nil {
				r, _, err = c.w.ReadResponse()
			}
			results <- result{r, err}
		}()
	}
	var slowest time.Duration
	analysed, refused := 0, 0
	for got := 0; got < clients; {
		select {
		case res := <-results:
			got++
			switch {
			case res.err != nil:
				t.Errorf("an analysis: %v", res.err)
			case res.r.GetModuleKernels() != nil:
				analysed++
			case res.r.Error != nil && strings.Contains(res.r.Error.Message, "analysis"):
				refused++
			default:
				t.Errorf("an analysis was answered %v", res.r)
			}
		case <-time.After(200 * time.Millisecond):
			start := time.Now()
			if _, err := h.statusErr(); err != nil {
				t.Errorf("root's status during the analyses: %v", err)
			}
			slowest = max(slowest, time.Since(start))
		}
	}
	start := time.Now()
	if _, err := h.statusErr(); err != nil {
		t.Errorf("root's status after the analyses: %v", err)
	}
	slowest = max(slowest, time.Since(start))
	peak := procStatusKiB(t, pid, "VmHWM") << 10
	time.Sleep(5 * time.Second)
	after := procStatusKiB(t, pid, "VmRSS") << 10
	t.Logf("%d analysed, %d refused; resident memory %d MiB before, peak %d MiB, %d MiB 5 s later; root's status took at most %v",
		analysed, refused, rss0>>20, peak>>20, after>>20, slowest)
	// The per-uid budget (128 MiB by default) holds two such images at
	// once; the collector may let the heap reach twice what is live.
	if peak-rss0 > 400<<20 {
		t.Errorf("the helper's peak resident memory grew by %d MiB", (peak-rss0)>>20)
	}
	if after-rss0 > 64<<20 {
		t.Errorf("5 s after the analyses the helper still holds %d MiB more than before", (after-rss0)>>20)
	}
	if refused == 0 {
		t.Errorf("none of %d analyses of %d MiB at once was refused", clients, size>>20)
	}
	if slowest > 2*time.Second {
		t.Errorf("root's status took %v", slowest)
	}
	runtime.KeepAlive(image)
}
