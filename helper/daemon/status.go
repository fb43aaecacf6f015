package daemon

// Status: the helper, its devices and driver, and every client it knows,
// connected or waiting for its process.

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/internal/printable"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// statusShare coalesces Status requests. At most one reply is built at a
// time; a request waits for the first build that starts after it came (so
// it sees everything done before it asked), and the requests that wait for
// one build share its reply. A flood of Status, from any number of
// connections, costs the helper one build at a time and one reply, however
// many clients it asks.
type statusShare struct {
	mu      sync.Mutex
	running bool
	next    *statusBuild // the build the requests that came while one ran wait for
}

// statusBuild is one build of the Status reply and those waiting for it.
type statusBuild struct {
	done  chan struct{}
	reply *helperpb.StatusReply
	// sizes: each client's bytes in the encoded reply (replyFor).
	sizes []int

	// encoded: the reply to each caller uid's Status of every client,
	// encoded once (statusEncoded): a flood of Status from one user costs
	// one encoding a build, not one a request.
	mu      sync.Mutex
	encoded map[uint32][]byte
}

// get is the reply to a Status request, built (by build) for every caller
// (see statusShare); replyFor makes each caller's of it.
func (sh *statusShare) get(build func() *helperpb.StatusReply) *statusBuild {
	sh.mu.Lock()
	if sh.next == nil {
		sh.next = &statusBuild{done: make(chan struct{})}
	}
	b := sh.next
	if !sh.running {
		sh.running = true
		sh.next = nil
		go sh.run(b, build)
	}
	sh.mu.Unlock()
	<-b.done
	return b
}

// run builds b, then every build requested meanwhile, one after the
// other, until none is waiting.
func (sh *statusShare) run(b *statusBuild, build func() *helperpb.StatusReply) {
	builds := 0
	for b != nil {
		b.reply = build()
		b.sizes = make([]int, len(b.reply.Clients))
		for i, ci := range b.reply.Clients {
			b.sizes[i] = fieldSize(proto.Size(ci))
		}
		builds++
		close(b.done)
		sh.mu.Lock()
		b, sh.next = sh.next, nil
		if b == nil {
			sh.running = false
		}
		sh.mu.Unlock()
	}
	// A run of builds back to back is a flood of Status (a reply of every
	// client per request); what it left is given back to the system now,
	// not when the runtime gets round to it.
	if builds >= floodBuilds {
		debug.FreeOSMemory()
	}
}

// DefaultStatusBudget bounds a Status reply's encoded bytes: half a frame
// (wire.MaxFrame), whatever clients register.
const DefaultStatusBudget = wire.MaxFrame / 2

// fieldSize is what a message of n bytes takes as a field of another.
func fieldSize(n int) int { return protowire.SizeTag(3) + protowire.SizeBytes(n) }

// replyFor is the reply to caller's Status req, made of the shared build
// b (shared between callers: nothing of it is changed): the clients req
// asks for (its pids; none: all), the caller's own first, then the others
// by pid, as many as fit in budget bytes; how many did not fit is said. So no number or size of other users' clients keeps a caller from
// its answer, nor a checkpoint from learning its tree's clients (it asks
// for their pids).
func (b *statusBuild) replyFor(caller uint32, req *helperpb.Status, budget int) *helperpb.StatusReply {
	r := b.reply
	out := &helperpb.StatusReply{HelperVersion: r.HelperVersion, Devices: r.Devices, Unavailable: r.Unavailable, Driver: r.Driver,
		ResidentImages: residentsSeenBy(r.ResidentImages, caller), ResidentBudget: r.ResidentBudget,
		Served: servedSeenBy(r.Served, caller)}
	left := budget - proto.Size(out) - 16 // and clients_left_out
	var wanted map[int64]bool
	if len(req.GetPids()) > 0 {
		wanted = make(map[int64]bool, len(req.Pids))
		for _, p := range req.Pids {
			wanted[p] = true
		}
	}
	var omitted uint32
	for _, mine := range []bool{true, false} {
		for i, ci := range r.Clients {
			if (ci.Uid == caller) != mine || (wanted != nil && !wanted[ci.Pid]) {
				continue
			}
			if b.sizes[i] > left {
				omitted++
				continue
			}
			left -= b.sizes[i]
			out.Clients = append(out.Clients, ci)
		}
	}
	out.ClientsLeftOut = omitted
	return out
}

// response is the encoded Response of id to caller's Status req, made of
// the shared build b (replyFor), encoded once per caller uid and build
// where req names no pids.
func (b *statusBuild) response(id uint64, caller uint32, req *helperpb.Status, budget int) ([]byte, error) {
	var reply []byte
	if len(req.GetPids()) > 0 {
		r, err := proto.Marshal(b.replyFor(caller, req, budget))
		if err != nil {
			return nil, err
		}
		reply = r
	} else {
		b.mu.Lock()
		reply = b.encoded[caller]
		if reply == nil {
			r, err := proto.Marshal(b.replyFor(caller, req, budget))
			if err != nil {
				b.mu.Unlock()
				return nil, err
			}
			if b.encoded == nil {
				b.encoded = map[uint32][]byte{}
			}
			b.encoded[caller], reply = r, r
		}
		b.mu.Unlock()
	}
	// Response{id: 1, status: 8}, as proto.Marshal writes it.
	out := make([]byte, 0, len(reply)+24)
	if id != 0 {
		out = protowire.AppendTag(out, 1, protowire.VarintType)
		out = protowire.AppendVarint(out, id)
	}
	out = protowire.AppendTag(out, 8, protowire.BytesType)
	return protowire.AppendBytes(out, reply), nil
}

// Bounds on what a client says of itself that Status shows to every
// caller: the reasons it gives for not being checkpointable (its own
// words, from its BufferTable).
const (
	maxReasons = 16
	maxReason  = 512
)

// clientReasons is what Status shows of the reasons a client gave: at most
// maxReasons, each cut to maxReason bytes, nothing a terminal acts on.
func clientReasons(rs []string) []string {
	out := make([]string, 0, min(len(rs), maxReasons+1))
	for i, r := range rs {
		if i == maxReasons {
			out = append(out, fmt.Sprintf("and %d more", len(rs)-i))
			break
		}
		out = append(out, printable.Bounded(r, maxReason))
	}
	return out
}

// floodBuilds is the number of Status builds back to back after which the
// helper returns its free memory to the system.
const floodBuilds = 16

// quietFor is how long a client whose control connection did not answer
// Status is not asked again: it is shown as not answering meanwhile, so that
// clients that never answer (stopped, or a user's on purpose) do not make
// every Status wait for them.
const quietFor = 5 * time.Second

// status describes the helper and every client. Clients with a control
// connection are asked GetStats and Snapshot, each within StatusTimeout
// (one that did not answer within quietFor is not asked).
func (s *Server) status() *helperpb.StatusReply {
	clients := s.reg.connectedClients()
	out := &helperpb.StatusReply{HelperVersion: s.cfg.Version, Devices: devicesInfo(s.cfg.Devices), Unavailable: s.cfg.Unavailable,
		Driver: s.cfg.Driver, ResidentImages: s.residents.status(templatesOf(s.served)), ResidentBudget: s.cfg.ResidentMemory,
		Served: servedStatus(s.served, len(s.cfg.Devices))}
	for i, d := range s.cfg.Devices {
		if fm, ok := d.(interface{ FreeMemory() (uint64, error) }); ok {
			if free, err := fm.FreeMemory(); err == nil {
				out.Devices[i].FreeMemory = free
			}
		}
		out.Devices[i].PoolMemory = s.pool.readyBytes(d)
		out.Devices[i].SnapshotMemory = s.snaps.held(d.GPU())
		if kd, ok := d.(interface{ KernelsError() error }); ok {
			if err := kd.KernelsError(); err != nil {
				out.Devices[i].KernelsError = err.Error()
			}
		}
	}
	infos := make([]*helperpb.ClientInfo, len(clients))
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i] = cl.info(s.cfg.StatusTimeout)
		}()
	}
	wg.Wait()
	out.Clients = infos
	// Processes the helper keeps memory for while they are not connected.
	waiting := append(s.reg.waitingClients(), s.reg.preparedClients()...)
	for _, cl := range waiting {
		cl.mu.Lock()
		out.Clients = append(out.Clients, &helperpb.ClientInfo{Pid: int64(cl.pid), Uid: cl.uid, Program: cl.program,
			Allocations: uint64(len(cl.allocs)), Bytes: cl.bytes, NotCheckpointable: []string{cl.waitingWhyLocked()},
			State: cl.shownStateLocked()})
		cl.mu.Unlock()
	}
	return out
}

func (cl *client) info(statusTimeout time.Duration) *helperpb.ClientInfo {
	cl.mu.Lock()
	ci := &helperpb.ClientInfo{Pid: int64(cl.pid), Uid: cl.uid, Program: cl.program,
		Allocations: uint64(len(cl.allocs)), Bytes: cl.bytes, ControlConnected: cl.ctrl != nil}
	quiet := time.Now().Before(cl.quietUntil)
	g := cl.guard
	cl.mu.Unlock()
	if g != nil {
		ci.WindowOpen, ci.WindowPendingBytes = true, g.PendingBytes()
	}
	var reasons []string
	// Its user may not act on it (mayAct): not checkpointable for them.
	ci.RunsAsAnother = cl.identityShown()
	switch {
	case !ci.ControlConnected:
		reasons = append(reasons, "control connection down")
	case quiet:
		reasons = append(reasons, "control connection does not answer")
	default:
		to := statusTimeout
		err := cl.withControl(to, func(ctl *control) error {
			r, err := ctl.call(&helperpb.Request{Body: &helperpb.Request_GetStats{GetStats: &helperpb.GetStats{}}}, nil, to)
			if err != nil {
				return err
			}
			if st := r.GetStats(); st != nil && st.LocalAllocs > 0 {
				reasons = append(reasons, fmt.Sprintf("%d allocations fell back to local memory", st.LocalAllocs))
			}
			if st := r.GetStats(); st.GetRejoins() > 0 {
				ci.Rejoined = &helperpb.RejoinInfo{Count: st.Rejoins, Allocations: st.RejoinAllocations, Bytes: st.RejoinBytes,
					AllocationsLeft: st.RejoinLeft, Micros: st.RejoinUs}
			}
			r, err = ctl.call(&helperpb.Request{Body: &helperpb.Request_Snapshot{Snapshot: &helperpb.Snapshot{}}}, nil, to)
			if err != nil {
				return err
			}
			if t := r.GetTable(); t != nil {
				reasons = append(reasons, clientReasons(t.NotCheckpointable)...)
				// What the client says it is, recorded while the
				// exchange is held (an illegal transition is logged).
				_ = cl.reported(t.State)
			}
			return nil
		})
		switch {
		case errors.Is(err, errBusy):
			// An operation (a checkpoint) is running; what it last set stands.
		case errors.Is(err, errNoControl):
			reasons = append(reasons, "control connection down")
			ci.ControlConnected = false
		case err != nil:
			reasons = append(reasons, "control connection does not answer: "+err.Error())
			cl.mu.Lock()
			cl.quietUntil = time.Now().Add(quietFor)
			cl.mu.Unlock()
		}
	}
	cl.mu.Lock()
	ci.State = cl.shownStateLocked()
	cl.mu.Unlock()
	ci.NotCheckpointable = reasons
	ci.Checkpointable = len(reasons) == 0 && !ci.RunsAsAnother
	return ci
}
