package daemon

// The control connection: the helper asks an interposer (Quiesce, Drain,
// Drop, Reimport, Resume, Snapshot, GetStats, Detach, Abort) and a thread of
// the interposer answers. One exchange (or sequence of them) at a time
// (withControl).

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

var (
	errNoControl = errors.New("control connection is not connected")
	errBusy      = errors.New("another control operation is in progress")
)

type control struct {
	conn *conn
	mu   sync.Mutex
	next uint64
	wait map[uint64]*pendingAnswer
	done chan struct{}
	// asked: requests sent whose answer has not come (those given up on
	// included: a late answer is still an answer). Only while some is
	// due may the client send a frame larger than maxUnaskedAnswer.
	asked atomic.Int64
}

// pendingAnswer is a request's answer to come: with the descriptor it may
// carry (takesFD: a Detach that asks for a template's script), else one
// that carries any is a broken client.
type pendingAnswer struct {
	ch      chan controlAnswer
	takesFD bool
}

type controlAnswer struct {
	resp *helperpb.Response
	fd   *os.File // nil: none came
}

// maxAnswer caps the control connection's next frame.
func (ctl *control) maxAnswer() int {
	if ctl.asked.Load() > 0 {
		return wire.MaxFrame
	}
	return maxUnaskedAnswer
}

// answered counts one answer in.
func (ctl *control) answered() {
	for {
		n := ctl.asked.Load()
		if n <= 0 || ctl.asked.CompareAndSwap(n, n-1) {
			return
		}
	}
}

func (s *Server) serveControl(c *conn, helloID uint64, h *helperpb.Hello) {
	cl := s.reg.withToken(h.ClientToken)
	// The client's own process, not one that took its pid since.
	if cl == nil || cl.pid != proc.Pid(c.cred.Pid) || !proc.Same(cl.process(), c.peer) {
		c.log.Warn("control connection with an unknown token or from another process")
		_ = c.send(errResp(helloID, helperpb.ErrorCode_ERROR_PERMISSION, "unknown client token for pid %d", c.cred.Pid), nil)
		return
	}
	c.peer.Close() // the client holds its process already
	c.peer = nil
	ctl := &control{conn: c, wait: map[uint64]*pendingAnswer{}, done: make(chan struct{})}
	c.SetReadLimits(s.readLimits(c, ctl.maxAnswer, time.Time{}))
	c.log = cl.log
	if err := cl.controlUp(ctl); err != nil {
		if errors.Is(err, errHasControl) {
			err = fmt.Errorf("client %d already has a control connection", cl.pid)
		}
		_ = c.send(errResp(helloID, helperpb.ErrorCode_ERROR_STATE, "%v", err), nil)
		return
	}
	defer func() {
		cl.mu.Lock()
		if cl.ctrl == ctl {
			cl.ctrl = nil
		}
		cl.mu.Unlock()
		close(ctl.done)
		cl.log.Info("control connection closed; client not checkpointable")
	}()
	if err := c.send(&helperpb.Response{Id: helloID, Body: &helperpb.Response_Hello{Hello: &helperpb.HelloReply{
		ProtocolVersion: wire.Version, ClientToken: cl.token, HelperVersion: s.cfg.Version}}}, nil); err != nil {
		return
	}
	cl.log.Info("control connection up")
	if attach := cl.takeOnAttach(); attach != nil {
		go attach()
	}
	for {
		resp, fds, err := c.ReadResponse()
		if err != nil {
			if errors.Is(err, wire.ErrFrame) {
				cl.log.Warn("bad frame on the control connection; closing it", zap.Error(err))
			} else {
				c.readFailed(err)
			}
			return
		}
		ctl.answered()
		ctl.mu.Lock()
		p := ctl.wait[resp.Id]
		if p != nil && (len(fds) == 0 || (p.takesFD && len(fds) == 1)) {
			delete(ctl.wait, resp.Id)
		}
		ctl.mu.Unlock()
		if len(fds) > 0 && (p == nil || !p.takesFD || len(fds) != 1) {
			wire.CloseFDs(fds)
			cl.log.Warn("file descriptors on a control response that takes none; closing the control connection")
			return
		}
		if p == nil {
			cl.log.Warn("control response nobody waits for (late or unknown id)", zap.Uint64("id", resp.Id))
			continue
		}
		a := controlAnswer{resp: resp}
		if len(fds) == 1 {
			a.fd = os.NewFile(uintptr(fds[0]), "control-answer")
		}
		p.ch <- a
	}
}

// call sends req (its id is set here) with fds and waits up to timeout.
func (ctl *control) call(req *helperpb.Request, fds []int, timeout time.Duration) (*helperpb.Response, error) {
	a, err := ctl.exchange(req, fds, false, timeout)
	return a.resp, err
}

// callTakingFD is call for a request whose answer may carry one descriptor
// (nil when it came without one), the caller's to close.
func (ctl *control) callTakingFD(req *helperpb.Request, timeout time.Duration) (*helperpb.Response, *os.File, error) {
	a, err := ctl.exchange(req, nil, true, timeout)
	return a.resp, a.fd, err
}

func (ctl *control) exchange(req *helperpb.Request, fds []int, takesFD bool, timeout time.Duration) (controlAnswer, error) {
	ch := make(chan controlAnswer, 1)
	ctl.mu.Lock()
	ctl.next++
	req.Id = ctl.next
	ctl.wait[req.Id] = &pendingAnswer{ch: ch, takesFD: takesFD}
	ctl.mu.Unlock()
	forget := func() {
		ctl.mu.Lock()
		delete(ctl.wait, req.Id)
		ctl.mu.Unlock()
		// An answer that came as it was given up on: its descriptor goes.
		select {
		case a := <-ch:
			if a.fd != nil {
				a.fd.Close()
			}
		default:
		}
	}
	ctl.asked.Add(1)
	ctl.conn.wmu.Lock()
	_ = ctl.conn.UnixConn().SetWriteDeadline(time.Now().Add(timeout))
	err := ctl.conn.Write(req, fds)
	ctl.conn.wmu.Unlock()
	if err != nil {
		ctl.answered()
		forget()
		return controlAnswer{}, fmt.Errorf("control connection: %w", err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case a := <-ch:
		return a, nil
	case <-ctl.done:
		// The answer may have come just before the connection closed (a
		// client that detaches answers, then closes): both are ready then,
		// and select picks either.
		select {
		case a := <-ch:
			return a, nil
		default:
		}
		forget()
		return controlAnswer{}, errNoControl
	case <-t.C:
		forget()
		return controlAnswer{}, fmt.Errorf("no answer within %v", timeout)
	}
}

// withControl runs f with cl's control connection, one operation at a time;
// it waits at most wait for another operation to finish.
func (cl *client) withControl(wait time.Duration, f func(*control) error) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case cl.opSem <- struct{}{}:
	case <-t.C:
		return errBusy
	}
	defer func() { <-cl.opSem }()
	cl.mu.Lock()
	ctl := cl.ctrl
	cl.mu.Unlock()
	if ctl == nil {
		return errNoControl
	}
	return f(ctl)
}

// controlCall sends one request on the control connection and turns a client
// refusal into an error.
func controlCall(ctl *control, req *helperpb.Request, wait time.Duration) (*helperpb.Response, error) {
	r, err := ctl.call(req, nil, wait)
	if err != nil {
		return nil, err
	}
	if r.Error != nil {
		return nil, fmt.Errorf("%s: %s", r.Error.Code, r.Error.Message)
	}
	return r, nil
}
