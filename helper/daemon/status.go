package daemon

// Status: the helper, its devices and driver, and every client it knows,
// connected or waiting for its process.

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// connectedClients and waitingClients copy the registry's lists, by pid.
func (s *Server) connectedClients() []*client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reg.connectedClients()
}

func (s *Server) waitingClients() []*client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reg.waitingClients()
}

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
}

// sharedStatus is the reply to a Status request (see statusShare).
func (s *Server) sharedStatus() *helperpb.StatusReply {
	sh := &s.statusShare
	sh.mu.Lock()
	if sh.next == nil {
		sh.next = &statusBuild{done: make(chan struct{})}
	}
	b := sh.next
	if !sh.running {
		sh.running = true
		sh.next = nil
		go s.buildStatuses(b)
	}
	sh.mu.Unlock()
	<-b.done
	return b.reply
}

// buildStatuses builds b, then every build requested meanwhile, one after
// the other, until none is waiting.
func (s *Server) buildStatuses(b *statusBuild) {
	sh := &s.statusShare
	builds := 0
	for b != nil {
		b.reply = s.status()
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
	clients := s.connectedClients()
	out := &helperpb.StatusReply{HelperVersion: s.cfg.Version, Devices: s.devicesInfo(), Unavailable: s.cfg.Unavailable,
		Driver: s.cfg.Driver, ResidentImages: s.residentStatus(), ResidentBudget: s.cfg.ResidentMemory}
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
			infos[i] = s.clientInfo(cl)
		}()
	}
	wg.Wait()
	out.Clients = infos
	// Processes the helper keeps memory for while they are not connected.
	waiting := s.waitingClients()
	s.mu.Lock()
	for p := range s.plans {
		for _, cl := range p.clients {
			if cl.lifeState() == lifePrepared {
				waiting = append(waiting, cl)
			}
		}
	}
	s.mu.Unlock()
	for _, cl := range waiting {
		cl.mu.Lock()
		out.Clients = append(out.Clients, &helperpb.ClientInfo{Pid: int64(cl.pid), Uid: cl.uid, Program: cl.program,
			Allocations: uint64(len(cl.allocs)), Bytes: cl.bytes, NotCheckpointable: []string{cl.waitingWhyLocked()},
			State: cl.shownStateLocked()})
		cl.mu.Unlock()
	}
	return out
}

func (s *Server) clientInfo(cl *client) *helperpb.ClientInfo {
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
	if err := cl.identityErr(); err != nil && !errors.Is(err, proc.ErrGone) {
		// Its user may not act on it (mayAct): not checkpointable for them.
		reasons = append(reasons, err.Error())
	}
	switch {
	case !ci.ControlConnected:
		reasons = append(reasons, "control connection down")
	case quiet:
		reasons = append(reasons, "control connection does not answer")
	default:
		to := s.cfg.StatusTimeout
		err := cl.withControl(to, func(ctl *control) error {
			r, err := ctl.call(&helperpb.Request{Body: &helperpb.Request_GetStats{GetStats: &helperpb.GetStats{}}}, nil, to)
			if err != nil {
				return err
			}
			if st := r.GetStats(); st != nil && st.LocalAllocs > 0 {
				reasons = append(reasons, fmt.Sprintf("%d allocations fell back to local memory", st.LocalAllocs))
			}
			r, err = ctl.call(&helperpb.Request{Body: &helperpb.Request_Snapshot{Snapshot: &helperpb.Snapshot{}}}, nil, to)
			if err != nil {
				return err
			}
			if t := r.GetTable(); t != nil {
				reasons = append(reasons, t.NotCheckpointable...)
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
	ci.Checkpointable = len(reasons) == 0
	return ci
}
