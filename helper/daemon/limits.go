package daemon

// What a user of the helper's socket can make the helper hold. The socket
// may be open to every user of a shared machine (--socket-mode 0666), and
// the helper holds every application's GPU memory: no user may stop it,
// make it grow without bound, or take the GPU from the others.
//
//   - connections: at most MaxConnsPerUID per uid, at most MaxPending not
//     yet past Hello (a quarter of them per uid); more are refused at once
//     with an Error (id 0) that says which limit;
//   - frames: one that has begun must end within FrameTimeout (idle
//     connections between frames are fine); each role's frames have a
//     size cap (maxRequest*), and the bodies being read at once hold at
//     most InFlightBytes (InFlightBytesPerUID per uid);
//   - GPU memory: an Alloc that would take a uid's helper-held memory past
//     its limit is answered ERROR_OUT_OF_MEMORY naming the limit;
//   - exported allocations: a uid keeps at most ExportsPerUID (one
//     descriptor each, exports.go); an Export past it is answered
//     ERROR_UNAVAILABLE naming the limit;
//   - module analyses: the bytes being analysed at once are at most
//     AnalysisBytes, AnalysisBytesPerUID per uid (modules.go); past the
//     uid's share an AnalyzeModule is refused at once, past the total it
//     waits a moment, then is refused (its kernels then count as writing
//     everything they point into).
//
// Root is exempt from all of these but an explicit GPU memory limit for
// uid 0: root can stop the helper anyway, and root's CLI and CRIU plugin
// must never wait behind other users. The memory a restore (PrepareRestore,
// root only) or an adoption (a process a dead helper left) loads counts for
// the image's owner until the process is back, and for the process's uid
// from then on; either is refused if it would take that uid past its limit.

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gpucr/gpucr/helper/wire"
)

// Defaults for Limits.
const (
	DefaultFrameTimeout = 10 * time.Second
	DefaultHelloTimeout = 10 * time.Second
	// A process under gpucr run holds two connections; a uid's 512 GPU
	// processes on one host is far beyond any job seen.
	DefaultMaxConnsPerUID = 1024
	// Generous too: a job's processes may all connect at once, and a new
	// client the helper refuses runs without checkpoint support.
	DefaultMaxPending    = 1024
	DefaultInFlightBytes = 64 << 20
	// DefaultInFlightBytesPerUID is one frame of the largest size a
	// connection may send (a control connection's answer): a uid must
	// always be able to send one.
	DefaultInFlightBytesPerUID = wire.MaxFrame
	// DefaultExportsPerUID: a job's ranks export each of their shared
	// buffers once (NCCL: tens per rank); 4096 per uid keeps even many
	// users far from the helper's descriptor limit (LimitNOFILE in the
	// systemd unit).
	DefaultExportsPerUID = 4096
	// Module analyses: a module image is at most 64 MiB (maxModuleImage);
	// a uid may have two such analysed at once, all uids four.
	DefaultAnalysisBytes       = 256 << 20
	DefaultAnalysisBytesPerUID = 128 << 20
)

// Caps on one frame's body, by what the connection is. Requests are small;
// only a client's answers on its control connection carry long lists.
const (
	// maxHello: before Hello. Its largest field is program, the client's
	// argv[0], which the kernel allows up to 128 KiB (MAX_ARG_STRLEN);
	// twice that.
	maxHello = 256 << 10
	// maxCallsRequest: Alloc (a device uuid, three numbers), Mapped, Free:
	// under 100 bytes; 4 KiB.
	maxCallsRequest = 4 << 10
	// maxCLIRequest: CLI and plugin requests. The largest is Checkpoint,
	// two paths (image_dir, parent) of at most PATH_MAX (4096) bytes and a
	// few numbers, about 8.2 KiB; 64 KiB.
	maxCLIRequest = 64 << 10
	// maxUnaskedAnswer: a control connection's frame while the helper
	// waits for no answer on it (the interposer only ever answers); the
	// answers it waits for may be a whole BufferTable (every allocation
	// and buffer of the process: about 40 bytes a buffer), up to
	// wire.MaxFrame.
	maxUnaskedAnswer = 4 << 10
)

// Limits bound what the socket's users can make the helper hold. Zero
// fields take the defaults; see the comment at the top of limits.go.
type Limits struct {
	// FrameTimeout: a frame that has begun must be complete within it,
	// else the connection is closed. Also bounds each response write.
	FrameTimeout time.Duration
	// HelloTimeout: a new connection must have sent its Hello within it.
	HelloTimeout time.Duration
	// MaxConnsPerUID: open connections of one uid (root: no limit).
	// Negative: no limit.
	MaxConnsPerUID int
	// MaxPending: connections that have not sent their Hello yet, of all
	// uids but root; one uid may hold a quarter of them (at least one).
	// Negative: no limit.
	MaxPending int
	// InFlightBytes: frame bodies being read at once, of all uids but
	// root; InFlightBytesPerUID: of one uid. A frame waits (within
	// FrameTimeout) until its bytes fit.
	InFlightBytes       int64
	InFlightBytesPerUID int64
	// GPUMemoryPerUID: helper-held GPU memory of one uid, root excepted;
	// 0: no limit. GPUMemoryByUID overrides it for the uids it names
	// (root too); a value of 0 there means no limit.
	GPUMemoryPerUID uint64
	GPUMemoryByUID  map[uint32]uint64
	// ExportsPerUID: allocations of one uid the helper keeps an export of
	// (a descriptor each; root: no limit). Negative: no limit.
	ExportsPerUID int
	// AnalysisBytes: bytes of module images (and what their compressed
	// PTX holds) being analysed at once, of all uids but root;
	// AnalysisBytesPerUID: of one uid.
	AnalysisBytes       int64
	AnalysisBytesPerUID int64

	// limitRoot: root is limited like any uid (tests, which run as root).
	limitRoot bool
}

func (l Limits) withDefaults() Limits {
	if l.FrameTimeout <= 0 {
		l.FrameTimeout = DefaultFrameTimeout
	}
	if l.HelloTimeout <= 0 {
		l.HelloTimeout = DefaultHelloTimeout
	}
	if l.MaxConnsPerUID == 0 {
		l.MaxConnsPerUID = DefaultMaxConnsPerUID
	}
	if l.MaxPending == 0 {
		l.MaxPending = DefaultMaxPending
	}
	if l.InFlightBytes <= 0 {
		l.InFlightBytes = DefaultInFlightBytes
	}
	if l.ExportsPerUID == 0 {
		l.ExportsPerUID = DefaultExportsPerUID
	}
	if l.AnalysisBytes <= 0 {
		l.AnalysisBytes = DefaultAnalysisBytes
	}
	if l.AnalysisBytesPerUID <= 0 {
		l.AnalysisBytesPerUID = min(DefaultAnalysisBytesPerUID, l.AnalysisBytes)
	}
	if l.InFlightBytesPerUID <= 0 {
		l.InFlightBytesPerUID = min(DefaultInFlightBytesPerUID, l.InFlightBytes)
	}
	return l
}

// limited says whether uid is subject to the connection and frame limits.
func (l *Limits) limited(uid uint32) bool { return uid != 0 || l.limitRoot }

// exportLimit is how many exported allocations uid may keep; 0: no limit.
func (l *Limits) exportLimit(uid uint32) int {
	if !l.limited(uid) || l.ExportsPerUID < 0 {
		return 0
	}
	return l.ExportsPerUID
}

// gpuLimit is uid's GPU memory limit; 0: none.
func (l *Limits) gpuLimit(uid uint32) uint64 {
	if v, ok := l.GPUMemoryByUID[uid]; ok {
		return v
	}
	if uid == 0 && !l.limitRoot {
		return 0
	}
	return l.GPUMemoryPerUID
}

// ---- connections ----

// connCounts are the connections of the limited uids: all of them, and
// those that have not sent their Hello yet. Its lock guards nothing else and
// is taken inside Server.mu (Go's admission) at most, never around another.
type connCounts struct {
	limits       *Limits
	mu           sync.Mutex
	byUID        map[uint32]int
	pending      int
	pendingByUID map[uint32]int
}

// admission is one accepted connection's place in the counts.
type admission struct {
	n       *connCounts
	uid     uint32
	counted bool
	pending bool // not past Hello yet (under n.mu)
}

// admit counts a new connection of uid, or says why it is refused.
func (n *connCounts) admit(uid uint32) (*admission, string) {
	a := &admission{n: n, uid: uid}
	l := n.limits
	if l == nil || !l.limited(uid) {
		return a, ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byUID == nil {
		n.byUID, n.pendingByUID = map[uint32]int{}, map[uint32]int{}
	}
	if l.MaxConnsPerUID > 0 && n.byUID[uid] >= l.MaxConnsPerUID {
		return nil, fmt.Sprintf("uid %d has %d connections to the helper, the most it may have (--max-connections-per-uid)",
			uid, n.byUID[uid])
	}
	if l.MaxPending > 0 {
		perUID := max(1, l.MaxPending/4)
		if n.pending >= l.MaxPending {
			return nil, fmt.Sprintf("%d connections have not sent their Hello yet, the most the helper takes (--max-pending-connections)",
				n.pending)
		}
		if n.pendingByUID[uid] >= perUID {
			return nil, fmt.Sprintf("uid %d has %d connections that have not sent their Hello yet, the most one uid may have (a quarter of --max-pending-connections)",
				uid, n.pendingByUID[uid])
		}
	}
	n.byUID[uid]++
	n.pending++
	n.pendingByUID[uid]++
	a.counted, a.pending = true, true
	return a, ""
}

// helloDone: the connection's first frame has been read (or it failed).
func (a *admission) helloDone() {
	if !a.counted {
		return
	}
	a.n.mu.Lock()
	defer a.n.mu.Unlock()
	a.helloDoneLocked()
}

func (a *admission) helloDoneLocked() {
	if !a.pending {
		return
	}
	a.pending = false
	n := a.n
	n.pending--
	if n.pendingByUID[a.uid]--; n.pendingByUID[a.uid] <= 0 {
		delete(n.pendingByUID, a.uid)
	}
}

// done: the connection is closed.
func (a *admission) done() {
	if !a.counted {
		return
	}
	a.n.mu.Lock()
	defer a.n.mu.Unlock()
	a.helloDoneLocked()
	a.counted = false
	n := a.n
	if n.byUID[a.uid]--; n.byUID[a.uid] <= 0 {
		delete(n.byUID, a.uid)
	}
}

// ---- bytes being read ----

// budget is a counting semaphore over bytes, overall and per uid.
type budget struct {
	total, perUID int64
	done          <-chan struct{} // closed when the server stops: waits end

	mu    sync.Mutex
	used  int64
	byUID map[uint32]int64
	freed chan struct{} // closed (and replaced) whenever bytes are given back
}

func newBudget(total, perUID int64, done <-chan struct{}) *budget {
	return &budget{total: total, perUID: perUID, done: done, byUID: map[uint32]int64{}, freed: make(chan struct{})}
}

// errNoBudget: a frame's bytes did not fit in time.
var errNoBudget = fmt.Errorf("%w: the helper's memory for frames being read stayed taken", os.ErrDeadlineExceeded)

// reserve takes n bytes for uid, waiting until they fit or deadline (zero:
// no deadline) passes.
func (b *budget) reserve(uid uint32, n int64, deadline time.Time) (func(), error) {
	if n > b.total || n > b.perUID {
		return nil, fmt.Errorf("%w: a frame of %d bytes is more than the helper reads at once (%d, %d per uid)",
			wire.ErrFrame, n, b.total, b.perUID)
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	for {
		b.mu.Lock()
		if b.used+n <= b.total && b.byUID[uid]+n <= b.perUID {
			return b.grantLocked(uid, n), nil
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-timeout:
			return nil, errNoBudget
		case <-b.done:
			return nil, errNoBudget
		}
	}
}

// grantLocked takes n bytes for uid, which fit, and unlocks b; the release
// gives them back (once, however often it is called).
func (b *budget) grantLocked(uid uint32, n int64) func() {
	b.used += n
	b.byUID[uid] += n
	b.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { b.give(uid, n) }) }
}

// Why take refused.
var (
	errOverUID   = errors.New("past the uid's share")
	errOverTotal = errors.New("past the total")
)

// take takes n bytes for uid if they fit: past uid's share (with what it
// holds already) it refuses at once (errOverUID): a uid that asks for more
// waits for nobody; past the total it waits up to wait for bytes to come
// back, then refuses (errOverTotal).
func (b *budget) take(uid uint32, n int64, wait time.Duration) (func(), error) {
	var timeout <-chan time.Time
	for {
		b.mu.Lock()
		switch {
		case n > b.perUID || b.byUID[uid]+n > b.perUID:
			b.mu.Unlock()
			return nil, errOverUID
		case b.used+n <= b.total:
			return b.grantLocked(uid, n), nil
		}
		freed := b.freed
		b.mu.Unlock()
		if n > b.total || wait <= 0 {
			return nil, errOverTotal
		}
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-freed:
		case <-timeout:
			return nil, errOverTotal
		case <-b.done:
			return nil, errOverTotal
		}
	}
}

func (b *budget) give(uid uint32, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.byUID[uid] -= n; b.byUID[uid] <= 0 {
		delete(b.byUID, uid)
	}
	close(b.freed)
	b.freed = make(chan struct{})
}

// inFlight is how many bytes are taken (tests).
func (b *budget) inFlight() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// readLimits are the limits of connection c's next frames: maxBody caps
// each frame, idle bounds the wait for the next one (zero: none).
func (s *Server) readLimits(c *conn, maxBody func() int, idle time.Time) wire.ReadLimits {
	l := wire.ReadLimits{MaxBody: maxBody, FrameTimeout: s.cfg.Limits.FrameTimeout, IdleDeadline: idle}
	if uid := c.cred.Uid; s.cfg.Limits.limited(uid) {
		l.Reserve = func(n int, deadline time.Time) (func(), error) { return s.frames.reserve(uid, int64(n), deadline) }
	}
	return l
}

func capOf(n int) func() int { return func() int { return n } }

// ---- GPU memory ----

// gpuReservations are the GPU memory limit checks, one at a time, and the
// bytes each uid's allocations, restores and adoptions being made hold until
// they are counted where they belong (held reads that: the server's
// clients, plans and resident images). Its lock is taken before any of the
// locks held takes, never inside one.
type gpuReservations struct {
	limits  *Limits
	held    func(uid uint32) uint64
	mu      sync.Mutex
	pending map[uint32]uint64
}

// reserve holds size bytes of uid's that what (for the message) needs: an
// allocation, a restore's or an adoption's memory, until release. The
// refusal names the limit.
func (g *gpuReservations) reserve(uid uint32, size uint64, what string) (release func(), err error) {
	var limit uint64
	if g.limits != nil {
		limit = g.limits.gpuLimit(uid)
	}
	if limit == 0 {
		return func() {}, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	held := g.held(uid) + g.pending[uid]
	if held+size > limit || held+size < held {
		return nil, fmt.Errorf("GPU memory limit of uid %d reached: it may hold %s through the helper (--max-gpu-memory-per-uid / --max-gpu-memory-for), holds %s, %s needs %s",
			uid, sizeStr(limit), sizeStr(held), what, sizeStr(size))
	}
	if g.pending == nil {
		g.pending = map[uint32]uint64{}
	}
	g.pending[uid] += size
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.pending[uid] -= size; g.pending[uid] == 0 {
			delete(g.pending, uid)
		}
	}, nil
}

// sizeStr writes n in binary units, exactly.
func sizeStr(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// ---- logging a burst once ----

// burstLog logs the first of a run of like events and then at most one
// line per interval, saying how many it left out.
type burstLog struct {
	interval time.Duration
	mu       sync.Mutex
	last     time.Time
	skipped  int
}

// allow says whether to log now, and how many events were left out since
// the last line.
func (b *burstLog) allow() (bool, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now := time.Now(); b.last.IsZero() || now.Sub(b.last) >= b.interval {
		n := b.skipped
		b.last, b.skipped = now, 0
		return true, n
	}
	b.skipped++
	return false, 0
}

// ---- memory given back ----

// memTrimmer gives the helper's free memory back to the system after work
// that took much of it (a flood of Status, large module analyses), rather
// than when the runtime gets round to it: at most once per interval, a
// request within it being served at its end. Each is a collection, some
// milliseconds: never on a request's own path.
type memTrimmer struct {
	interval time.Duration
	mu       sync.Mutex
	last     time.Time
	pending  bool
}

// trimDelay lets the work that asked for a trim drop what it held first.
const trimDelay = 100 * time.Millisecond

// request asks for a trim soon.
func (m *memTrimmer) request() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending {
		return
	}
	m.pending = true
	wait := max(trimDelay, time.Until(m.last.Add(m.interval)))
	time.AfterFunc(wait, func() {
		// A request from now on is served by the next trim: this one
		// may not see what that work leaves.
		m.mu.Lock()
		m.last, m.pending = time.Now(), false
		m.mu.Unlock()
		debug.FreeOSMemory()
	})
}
