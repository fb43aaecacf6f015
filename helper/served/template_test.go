package served

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/internal/testroot"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// Templates, the worker's side (exec.c: sv_play; cworker/main.c): the real
// gpucr-worker on the simulated driver, started as the pool starts it,
// given hand-made scripts.

// served.h's numbers, read from the header itself so that the tests follow
// it: its enums' and #defines' values by name.
var (
	svOnce sync.Once
	svNums map[string]uint64
	svErr  error
)

func sv(t *testing.T, name string) uint64 {
	t.Helper()
	svOnce.Do(func() { svNums, svErr = parseServedH(filepath.Join(testroot.Dir(t), "protocol/c/served.h")) })
	if svErr != nil {
		t.Fatal(svErr)
	}
	v, ok := svNums[name]
	if !ok {
		t.Fatalf("served.h defines no %s", name)
	}
	return v
}

var (
	reDefine   = regexp.MustCompile(`(?m)^#define (SV_[A-Z0-9_]+) +([^/\n]+)`)
	reEnum     = regexp.MustCompile(`(?s)enum (?:sv_[a-z_]+ )?\{(.*?)\};`)
	reEnumItem = regexp.MustCompile(`^(SV_[A-Z0-9_]+)(?: *= *([0-9a-fx]+))?$`)
	reComment  = regexp.MustCompile(`(?s)/\*.*?\*/`)
)

// cNumber: 12, 0x1u, (4u << 20), (1ull << 31).
func cNumber(s string) (uint64, bool) {
	s = strings.TrimSpace(strings.Trim(strings.TrimSpace(s), "()"))
	num := func(x string) (uint64, bool) {
		v, err := strconv.ParseUint(strings.TrimRight(strings.TrimSpace(x), "uUlL"), 0, 64)
		return v, err == nil
	}
	if a, b, ok := strings.Cut(s, "<<"); ok {
		x, ok1 := num(a)
		y, ok2 := num(b)
		return x << y, ok1 && ok2
	}
	return num(s)
}

func parseServedH(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	src := reComment.ReplaceAllString(string(b), "")
	m := map[string]uint64{}
	for _, d := range reDefine.FindAllStringSubmatch(src, -1) {
		if v, ok := cNumber(d[2]); ok {
			m[d[1]] = v
		}
	}
	for _, e := range reEnum.FindAllStringSubmatch(src, -1) {
		next := uint64(0)
		for _, item := range strings.Split(e[1], ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			it := reEnumItem.FindStringSubmatch(item)
			if it == nil {
				return nil, fmt.Errorf("%s: cannot read enum item %q", path, item)
			}
			if it[2] != "" {
				if next, err = strconv.ParseUint(it[2], 0, 64); err != nil {
					return nil, err
				}
			}
			m[it[1]] = next
			next++
		}
	}
	return m, nil
}

// ---- scripts ----

type srec struct {
	op      string // SV_OP_ without the prefix, or "#N" for a number
	flags   uint16
	reply   uint32
	payload []byte
	stage   []byte
	slot    uint32
	expect  []byte
}

// le encodes the values (fixed-size integers, byte slices, strings) one after another in the host's order.
func le(vals ...any) []byte {
	var b bytes.Buffer
	for _, v := range vals {
		switch x := v.(type) {
		case []byte:
			b.Write(x)
		case string:
			b.WriteString(x)
		default:
			if err := binary.Write(&b, binary.NativeEndian, x); err != nil {
				panic(err)
			}
		}
	}
	return b.Bytes()
}

// pad: b, then zeros to a multiple of to (a copy: b may be part of a larger slice).
func pad(b []byte, to int) []byte {
	return append(append([]byte{}, b...), make([]byte, (to-len(b)%to)%to)...)
}

func opNum(t *testing.T, op string) uint16 {
	if n, ok := strings.CutPrefix(op, "#"); ok {
		v, err := strconv.Atoi(n)
		if err != nil {
			t.Fatal(err)
		}
		return uint16(v)
	}
	return uint16(sv(t, "SV_OP_"+op))
}

// record: struct sv_rec and its payload, padded to SV_REC_ALIGN.
func record(t *testing.T, r srec) []byte {
	n := 16 + len(r.payload)
	n = (n + int(sv(t, "SV_REC_ALIGN")) - 1) / int(sv(t, "SV_REC_ALIGN")) * int(sv(t, "SV_REC_ALIGN"))
	return pad(le(opNum(t, r.op), r.flags, uint32(n), r.reply, uint32(0), r.payload), n)
}

func scriptHeader(t *testing.T, magic uint32, entries int) []byte {
	token := make([]byte, sv(t, "SV_TOKEN_BYTES"))
	return le(magic, uint32(sv(t, "SV_SCRIPT_VERSION")), uint32(sv(t, "SV_VERSION")), uint32(0), token, uint64(entries))
}

func scriptEntry(t *testing.T, r srec) []byte {
	rec := record(t, r)
	return le(uint32(len(rec)), uint32(len(r.stage)), r.slot, uint32(len(r.expect)), rec, pad(r.stage, 8), pad(r.expect, 8))
}

func script(t *testing.T, recs ...srec) []byte {
	b := scriptHeader(t, uint32(sv(t, "SV_SCRIPT_MAGIC")), len(recs))
	for _, r := range recs {
		b = append(b, scriptEntry(t, r)...)
	}
	return b
}

// memfd holds b, sealed, as the helper passes a script.
func memfd(t *testing.T, b []byte) int {
	fd, err := unix.MemfdCreate("gpucr-template-script", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	for w := b; len(w) > 0; {
		n, err := unix.Write(fd, w)
		if err != nil {
			t.Fatal(err)
		}
		w = w[n:]
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	return fd
}

// ---- the worker ----

type tworker struct {
	t    *testing.T
	cmd  *exec.Cmd
	ctl  *wire.Conn
	done chan struct{}
	err  error // cmd.Wait's, once done is closed
}

// startTemplateWorker starts build/bin/gpucr-worker on the simulated driver as the pool does (its control socket
// on descriptor 3) and reads its start's WorkerReady.
func startTemplateWorker(t *testing.T) *tworker {
	t.Helper()
	return startWorkerBin(t, "build/bin/gpucr-worker")
}

// startWorkerBin starts the worker program rel (from the repository's top), its arguments args first.
func startWorkerBin(t *testing.T, rel string, args ...string) *tworker {
	t.Helper()
	root := testroot.Dir(t)
	bin := filepath.Join(root, rel)
	lib := filepath.Join(root, "build/sim/libcuda.so.1")
	for _, p := range []string{bin, lib} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%v: make all", err)
			}
			t.Skipf("%v: make all", err)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the worker takes the user it is given (setgroups)")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "control"), os.NewFile(uintptr(fds[1]), "control-worker")
	cmd := exec.Command(bin, append(args, "--device", "0", "--libcuda", lib)...)
	cmd.Env = []string{"LD_LIBRARY_PATH=" + filepath.Dir(lib), "GPUCR_SIM_MEM_MIB=1024"}
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{theirs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	w := &tworker{t: t, cmd: cmd, done: make(chan struct{})}
	go func() { w.err = cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		select {
		case <-w.done:
		default:
			_ = cmd.Process.Kill()
			<-w.done
		}
	})
	nc, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		t.Fatal(err)
	}
	if w.ctl, err = wire.New(nc.(*net.UnixConn)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.ctl.Close() })
	resp := w.response()
	if r := resp.GetWorkerReady(); r == nil || r.Pid != int64(cmd.Process.Pid) {
		t.Fatalf("the worker's start answered %v", resp)
	}
	return w
}

func (w *tworker) response() *helperpb.Response {
	w.t.Helper()
	uc := w.ctl.UnixConn()
	_ = uc.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, fds, err := w.ctl.ReadResponse()
	wire.CloseFDs(fds)
	if err != nil {
		w.t.Fatalf("reading the worker's answer: %v", err)
	}
	return resp
}

func (w *tworker) assign(id uint64, template bool, uid, gid uint32, fd int) *helperpb.Response {
	w.t.Helper()
	req := &helperpb.Request{Id: id, Body: &helperpb.Request_AssignWorker{AssignWorker: &helperpb.AssignWorker{
		Uid: uid, Gid: gid, ClientPid: int64(os.Getpid()), Template: template}}}
	if err := w.ctl.Write(req, []int{fd}); err != nil {
		w.t.Fatal(err)
	}
	resp := w.response()
	if resp.Id != id {
		w.t.Fatalf("answer %d to request %d", resp.Id, id)
	}
	return resp
}

// exit waits for the worker's end: its exit status.
func (w *tworker) exit() int {
	w.t.Helper()
	select {
	case <-w.done:
	case <-time.After(20 * time.Second):
		w.t.Fatal("the worker did not end")
	}
	var ee *exec.ExitError
	if errors.As(w.err, &ee) {
		return ee.ExitCode()
	}
	if w.err != nil {
		w.t.Fatal(w.err)
	}
	return 0
}

func me() (uint32, uint32) { return uint32(os.Getuid()), uint32(os.Getgid()) }

// ---- records ----

func streamCreate(t *testing.T, id uint32) srec {
	return srec{op: "STREAM_CREATE", payload: le(id, uint32(0))}
}

func ctxSync(reply uint32) srec { return srec{op: "CTX_SYNC", reply: reply} }

// A PTX module the simulated driver loads: one entry of two parameters, laid out u64 at 0, u32 at 8.
const templatePTX = ".version 7.8\n.target sm_75\n.address_size 64\n\n" +
	".visible .entry tmpl_k(\n\t.param .u64 tmpl_k_p,\n\t.param .u32 tmpl_k_v\n)\n{\n\tret;\n}\n"

// A script of what a replay sends: a stream, a context limit set and read back, a module's image in two chunks
// through two staging slots (one group) and its load, its function (the layout expected), the final sync.
func validScript(t *testing.T) []byte {
	img := []byte(templatePTX)
	half := len(img) / 2
	group := uint16(sv(t, "SV_F_GROUP"))
	chunk := func(off, n int, slot uint32) srec {
		return srec{op: "IMAGE_CHUNK", flags: group, reply: 2, payload: le(uint64(off), uint64(len(img)), slot, uint32(n)),
			stage: img[off : off+n], slot: slot}
	}
	load := le(uint64(len(img)), uint32(1), uint32(0), make([]byte, 4*sv(t, "SV_MAX_JIT")), make([]byte, 8*sv(t, "SV_MAX_JIT")))
	layout := le(uint32(2), uint32(12), uint32(0), uint32(8), uint32(8), uint32(4))
	return script(t,
		streamCreate(t, uint32(sv(t, "SV_STREAM_FIRST_ID"))),
		srec{op: "CTX_LIMIT", reply: 1, payload: le(uint32(0), uint32(1), uint64(1000))}, // CU_LIMIT_STACK_SIZE
		srec{op: "CTX_LIMIT", reply: 1, payload: le(uint32(0), uint32(0), uint64(0)), expect: le(uint64(1008))},
		chunk(0, half, 3),
		chunk(half, len(img)-half, 5),
		srec{op: "MODULE_LOAD", reply: 2, payload: load},
		srec{op: "MODULE_GET_FUNCTION", reply: 3, payload: le(uint32(1), uint32(1), "tmpl_k\x00"), expect: layout},
		ctxSync(1),
	)
}

// TestTemplateRunsItsScriptAndServesItsUserOnly: a valid script answers WorkerReady with the time it took; the
// attach of another uid is refused, and the worker ends.
func TestTemplateRunsItsScriptAndServesItsUserOnly(t *testing.T) {
	w := startTemplateWorker(t)
	uid, gid := me()
	resp := w.assign(1, true, uid, gid, memfd(t, validScript(t)))
	r := resp.GetWorkerReady()
	if r == nil || r.TemplateNs == 0 || r.Pid != int64(w.cmd.Process.Pid) {
		t.Fatalf("the template answered %v, want WorkerReady with template_ns", resp)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[0])
	defer unix.Close(sp[1])
	resp = w.assign(2, false, uid+12345, gid, sp[1])
	if resp.Error == nil || resp.Error.Code != helperpb.ErrorCode_ERROR_PERMISSION ||
		!strings.Contains(resp.Error.Message, "the template is uid") {
		t.Fatalf("another uid's attach answered %v, want a permission error", resp)
	}
	if c := w.exit(); c != 1 {
		t.Fatalf("the worker exited %d after refusing the attach, want 1", c)
	}
}

// TestTemplateLetGoExitsZero: the helper closing the control socket while the template waits (its image
// unloaded) ends the worker cleanly.
func TestTemplateLetGoExitsZero(t *testing.T) {
	w := startTemplateWorker(t)
	uid, gid := me()
	if r := w.assign(1, true, uid, gid, memfd(t, script(t, ctxSync(1)))); r.GetWorkerReady() == nil {
		t.Fatalf("the template answered %v", r)
	}
	w.ctl.Close()
	if c := w.exit(); c != 0 {
		t.Fatalf("the template let go exited %d, want 0", c)
	}
}

// TestPlainAssignmentServesAsBefore: AssignWorker without a template, first, serves the socket at once (the
// client leaving before its hello ends the worker with 0).
func TestPlainAssignmentServesAsBefore(t *testing.T) {
	w := startTemplateWorker(t)
	uid, gid := me()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[1])
	if r := w.assign(1, false, uid, gid, sp[1]); r.GetWorkerReady() == nil || r.GetWorkerReady().TemplateNs != 0 {
		t.Fatalf("a plain assignment answered %v", r)
	}
	unix.Close(sp[0])
	if c := w.exit(); c != 0 {
		t.Fatalf("the worker exited %d, want 0", c)
	}
}

// TestTemplateObjectsServeTheAttachedProcess: the process that attaches to a template (a client made here by hand:
// the handshake, records in the ring) finds the stream and the function the script made under their ids, and
// nothing else.
func TestTemplateObjectsServeTheAttachedProcess(t *testing.T) {
	w := startTemplateWorker(t)
	uid, gid := me()
	if r := w.assign(1, true, uid, gid, memfd(t, validScript(t))); r.GetWorkerReady() == nil {
		t.Fatalf("the template answered %v", r)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[1])
	if r := w.assign(2, false, uid, gid, sp[1]); r.GetWorkerReady() == nil {
		t.Fatalf("the attach answered %v", r)
	}
	c := newClient(t, sp[0])
	first := uint32(sv(t, "SV_STREAM_FIRST_ID"))
	if res := c.call(srec{op: "STREAM_SYNC", payload: le(first, uint32(0))}); res != 0 {
		t.Errorf("syncing the template's stream %d: CUresult %d", first, res)
	}
	if res := c.call(srec{op: "STREAM_SYNC", payload: le(first+1, uint32(0))}); res == 0 {
		t.Errorf("stream %d, which the script did not make, synced", first+1)
	}
	fa := le(uint32(1), uint32(0), uint32(sv(t, "SV_FA_GET")), int32(0), int32(0), uint32(0), uint64(0))
	if res := c.call(srec{op: "FUNC_ATTR", payload: fa}); res != 0 {
		t.Errorf("an attribute of the template's function 1: CUresult %d", res)
	}
	unix.Close(sp[0])
	if c := w.exit(); c != 0 {
		t.Fatalf("the worker exited %d after its client left, want 0", c)
	}
}

// client: the served library's side of the ring, as far as one synchronous call at a time needs.
type client struct {
	t                    *testing.T
	mem                  []byte
	ring, replies, total uint64
	head                 uint64
}

func (c *client) u32(off uint64) *uint32 { return (*uint32)(unsafe.Pointer(&c.mem[off])) }
func (c *client) u64(off uint64) *uint64 { return (*uint64)(unsafe.Pointer(&c.mem[off])) }

func newClient(t *testing.T, sock int) *client {
	t.Helper()
	nreply, rdata, nstage := sv(t, "SV_NREPLY"), sv(t, "SV_REPLY_DATA"), sv(t, "SV_NSTAGE")
	const hdr = 7 * 64 // struct sv_header
	ring := (hdr + nreply*(64+rdata) + nstage*64 + 4095) &^ 4095
	total := ring + sv(t, "SV_RING_BYTES") + nstage*sv(t, "SV_STAGE_BYTES")
	fd, err := unix.MemfdCreate("gpucr-served-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(total)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, int(total), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	c := &client{t: t, mem: mem, ring: ring, replies: hdr, total: total}
	copy(mem, le(uint32(sv(t, "SV_MAGIC")), uint32(sv(t, "SV_VERSION")), total))
	hello := le(uint32(sv(t, "SV_MAGIC")), uint32(sv(t, "SV_VERSION")), total, int32(os.Getpid()), uint32(0))
	if err := unix.Sendmsg(sock, hello, unix.UnixRights(fd), nil, 0); err != nil {
		t.Fatal(err)
	}
	welcome := make([]byte, 256)
	if err := unix.SetsockoptTimeval(sock, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 20}); err != nil {
		t.Fatal(err)
	}
	n, err := unix.Read(sock, welcome)
	if err != nil || n != len(welcome) {
		t.Fatalf("the worker's welcome: %d bytes, %v", n, err)
	}
	if res := int32(binary.NativeEndian.Uint32(welcome[8:])); res != 0 {
		t.Fatalf("the worker refused the handshake: CUresult %d: %s", res, bytes.TrimRight(welcome[16:], "\x00"))
	}
	return c
}

// call publishes r with reply slot 1 and waits for its answer: the CUresult.
func (c *client) call(r srec) int32 {
	c.t.Helper()
	r.reply = 1
	rec := record(c.t, r)
	slot := c.replies // reply 1: slot 0
	atomic.StoreUint32(c.u32(slot+8), 0)
	atomic.StoreUint32(c.u32(slot+12), 0)
	atomic.StoreUint32(c.u32(slot), uint32(sv(c.t, "SV_PENDING")))
	copy(c.mem[c.ring+c.head%sv(c.t, "SV_RING_BYTES"):], rec)
	c.head += uint64(len(rec))
	atomic.StoreUint64(c.u64(64), c.head)   // h.head
	if atomic.LoadUint32(c.u32(192)) != 0 { // h.wsleep: wake the worker on h.wseq
		atomic.AddUint32(c.u32(196), 1)
		_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(c.u32(196))), 1 /* FUTEX_WAKE */, math.MaxInt32, 0, 0, 0)
	}
	for end := time.Now().Add(20 * time.Second); atomic.LoadUint32(c.u32(slot)) != uint32(sv(c.t, "SV_DONE")); {
		if time.Now().After(end) {
			c.t.Fatalf("no answer to %s", r.op)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return int32(atomic.LoadUint32(c.u32(slot + 8)))
}

// ---- scripts the worker refuses ----

// TestTemplateScriptRefused: each malformed script, and each script whose records do not do at the template
// what they did at the checkpoint, answers an error that says which, and ends the worker.
func TestTemplateScriptRefused(t *testing.T) {
	group := func(t *testing.T) uint16 { return uint16(sv(t, "SV_F_GROUP")) }
	cases := []struct {
		name   string
		script func(t *testing.T) []byte
		code   helperpb.ErrorCode
		want   string
	}{
		{"bad magic", func(t *testing.T) []byte {
			return append(scriptHeader(t, 0x12345678, 1), scriptEntry(t, ctxSync(1))...)
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "the script's magic is 0x12345678, not 0x52435347"},
		{"bad version", func(t *testing.T) []byte {
			b := script(t, ctxSync(1))
			binary.NativeEndian.PutUint32(b[8:], 999) // sv_version
			return b
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "of records of version 999"},
		{"truncated header", func(t *testing.T) []byte {
			return script(t)[:20]
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "the script ends inside its header"},
		{"truncated entry", func(t *testing.T) []byte {
			b := script(t, ctxSync(1), ctxSync(1))
			return b[:len(b)-8] // the second record, half of it
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "the script ends inside record 1's record (16 bytes at 88 of 96)"},
		{"truncated staging", func(t *testing.T) []byte {
			b := script(t, srec{op: "CTX_SYNC", reply: 1, stage: make([]byte, 24), slot: 2})
			return b[:len(b)-8]
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "the script ends inside record 0 (op CTX_SYNC)'s staging (24 bytes at 72 of 88)"},
		{"more entries than the script holds", func(t *testing.T) []byte {
			b := script(t, ctxSync(1))
			binary.NativeEndian.PutUint64(b[32:], 2) // entries
			return b
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "the script ends inside record 1's entry"},
		{"bytes after the last entry", func(t *testing.T) []byte {
			return append(script(t, ctxSync(1)), make([]byte, 8)...)
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "8 bytes follow the script's last entry"},
		{"record length not its entry's", func(t *testing.T) []byte {
			b := script(t, ctxSync(1))
			binary.NativeEndian.PutUint32(b[40+16+4:], 32) // rec.len
			return b
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "record 0 (op CTX_SYNC): its length 32 is not its entry's 16"},
		{"record length not aligned", func(t *testing.T) []byte {
			b := script(t, ctxSync(1))
			binary.NativeEndian.PutUint32(b[40:], 24) // rec_len
			return b
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "record 0 (op CTX_SYNC): its length 24 is not a record's"},
		{"staging slot out of range", func(t *testing.T) []byte {
			return script(t, srec{op: "CTX_SYNC", reply: 1, stage: []byte("x"), slot: 16})
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "record 0 (op CTX_SYNC): staging slot 16 of 16"},
		{"too much expected", func(t *testing.T) []byte {
			return script(t, srec{op: "CTX_SYNC", reply: 1, expect: make([]byte, 4097)})
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "record 0 (op CTX_SYNC): 4097 bytes expected of its reply"},
		{"expected of no reply", func(t *testing.T) []byte {
			return script(t, srec{op: "CTX_SYNC", expect: []byte{1}})
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "record 0 (op CTX_SYNC): 1 bytes expected of a reply it does not give"},
		{"a descriptor over the socket", func(t *testing.T) []byte {
			return script(t, srec{op: "VMM_IMPORT", reply: 1, payload: le(uint64(1), uint64(0), uint32(1), uint32(0))})
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "record 0 (op VMM_IMPORT) passes a descriptor over the served process's socket"},
		{"unknown op", func(t *testing.T) []byte {
			return script(t, ctxSync(1), srec{op: "#999", reply: 1})
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "record 1 (op 999) is malformed: record at 88: unknown op 999"},
		{"reply slot out of range", func(t *testing.T) []byte {
			return script(t, ctxSync(65))
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "record 0 (op CTX_SYNC): reply slot 65 of 64"},
		{"a group without its answer", func(t *testing.T) []byte {
			return script(t, srec{op: "CTX_SYNC", flags: group(t), reply: 1})
		}, helperpb.ErrorCode_ERROR_BAD_REQUEST, "the script ends inside a group"},
		{"answered differently", func(t *testing.T) []byte {
			q := le(uint32(sv(t, "SV_Q_DRIVER_VERSION")), int32(0))
			return script(t, streamCreate(t, 3), srec{op: "QUERY", reply: 1, payload: q, expect: le(int32(1))})
		}, helperpb.ErrorCode_ERROR_DRIVER, "record 1 (op QUERY) answered differently than at the checkpoint: " +
			"c8320000 here, 01000000 there"},
		{"a reply that failed", func(t *testing.T) []byte {
			return script(t, srec{op: "STREAM_SYNC", reply: 1, payload: le(uint32(77), uint32(0))})
		}, helperpb.ErrorCode_ERROR_DRIVER, "record 0 (op STREAM_SYNC) failed in the template: CUDA_ERROR_INVALID_HANDLE"},
		{"a group member that failed", func(t *testing.T) []byte {
			return script(t, srec{op: "STREAM_SYNC", flags: group(t), reply: 4, payload: le(uint32(77), uint32(0))},
				srec{op: "CTX_SYNC", reply: 4})
		}, helperpb.ErrorCode_ERROR_DRIVER, "record 1 (op CTX_SYNC) failed in the template: CUDA_ERROR_INVALID_HANDLE"},
		{"an asynchronous record that failed", func(t *testing.T) []byte {
			return script(t, streamCreate(t, 3), srec{op: "STREAM_DESTROY", payload: le(uint32(99), uint32(0))}, ctxSync(1))
		}, helperpb.ErrorCode_ERROR_DRIVER,
			"record 1 (op STREAM_DESTROY) failed in the template: CUDA_ERROR_INVALID_HANDLE (asynchronously)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := startTemplateWorker(t)
			uid, gid := me()
			resp := w.assign(7, true, uid, gid, memfd(t, tc.script(t)))
			if resp.Error == nil {
				t.Fatalf("the template answered %v, want an error saying %q", resp, tc.want)
			}
			if resp.Error.Code != tc.code || !strings.Contains(resp.Error.Message, tc.want) {
				t.Fatalf("the template's error: %v %q, want %v with %q", resp.Error.Code, resp.Error.Message, tc.code, tc.want)
			}
			if c := w.exit(); c != 1 {
				t.Fatalf("the worker exited %d after its script failed, want 1", c)
			}
		})
	}
}

// TestTemplateScriptFromAFile: a plain file is a script as a memfd is.
func TestTemplateScriptFromAFile(t *testing.T) {
	w := startTemplateWorker(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "script"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(validScript(t)); err != nil {
		t.Fatal(err)
	}
	uid, gid := me()
	if r := w.assign(1, true, uid, gid, int(f.Fd())); r.GetWorkerReady() == nil {
		t.Fatalf("the template answered %v", r)
	}
}

// TestGoWorkerRunsNoTemplates: gpucr's own served-worker (the fallback where gpucr-worker is missing) refuses a
// template with an error that says so, and ends.
func TestGoWorkerRunsNoTemplates(t *testing.T) {
	w := startWorkerBin(t, "build/bin/gpucr", WorkerCommand)
	uid, gid := me()
	resp := w.assign(1, true, uid, gid, memfd(t, script(t, ctxSync(1))))
	if resp.Error == nil || resp.Error.Message != ErrNoTemplates.Error() {
		t.Fatalf("the Go worker answered a template with %v, want %q", resp, ErrNoTemplates)
	}
	if c := w.exit(); c == 0 {
		t.Fatal("the Go worker exited 0 after refusing a template")
	}
}

// TestTemplateBlasLoadPadded: cuBLAS's load in a script, its strings (the library's path, a setting) followed by
// the record's padding, which need not be zeros (a client before zeroed padding left an older record's bytes
// there: a PyTorch server's template failed with "the library path is not terminated"). The worker takes the
// strings up to their terminators and loads the library.
func TestTemplateBlasLoadPadded(t *testing.T) {
	lib := filepath.Join(testroot.Dir(t), "build/sim/libcublas.so.13")
	if _, err := os.Stat(lib); err != nil {
		t.Skipf("no simulated cuBLAS (%v): make all builds it", err)
	}
	strs := lib + "\x00CUBLAS_WORKSPACE_CONFIG=:4096:8\x00"
	align := int(sv(t, "SV_REC_ALIGN"))
	junk := (align - (16+8+len(strs))%align) % align
	if junk == 0 {
		strs += "CUBLAS_X=1\x00"
		junk = (align - (16+8+len(strs))%align) % align
	}
	payload := le(uint32(0), uint32(0), strs, bytes.Repeat([]byte{0x5a}, junk))
	w := startTemplateWorker(t)
	uid, gid := me()
	resp := w.assign(1, true, uid, gid, memfd(t, script(t,
		srec{op: "BLAS_LOAD", reply: 1, payload: payload, expect: le(int32(0))}, // status: CUBLAS_STATUS_SUCCESS
		ctxSync(1),
	)))
	if r := resp.GetWorkerReady(); r == nil || r.TemplateNs == 0 {
		t.Fatalf("a script whose cuBLAS load is followed by %d bytes of padding answered %v, want WorkerReady", junk, resp)
	}
}
