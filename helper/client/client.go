// Package client is the Go side of a helper connection for the CLI and the
// CRIU plugin (ROLE_CLI / ROLE_PLUGIN): dial, Hello, Status, ClientOp.
package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// DefaultSocket is the helper's socket without --socket or $GPUCR_SOCKET.
const DefaultSocket = "/run/gpucr/helper.sock"

// SocketPath returns flag if set, else $GPUCR_SOCKET, else DefaultSocket.
func SocketPath(flag string) string {
	if flag != "" {
		return flag
	}
	if s := os.Getenv("GPUCR_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// Error is an error the helper (or, through it, a client) answered.
type Error struct {
	Code    helperpb.ErrorCode
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// Conn is one connection to the helper; calls on it take turns.
type Conn struct {
	mu     sync.Mutex
	w      *wire.Conn
	nextID uint64
	Hello  *helperpb.HelloReply
	Socket string
}

// Dial connects to the helper at socket and says Hello with role.
func Dial(ctx context.Context, socket string, role helperpb.Role, program string) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("no helper answers on %s: %w", socket, err)
	}
	w, err := wire.New(nc.(*net.UnixConn))
	if err != nil {
		nc.Close()
		return nil, err
	}
	// Run as root, gpucr talks only to a helper that runs as root: a
	// socket named by the environment (GPUCR_SOCKET, kept by `sudo -E`) may
	// be a user's process, which would be handed image directories and
	// believed.
	if os.Geteuid() == 0 {
		cred, err := w.PeerCred()
		if err == nil && cred.Uid != 0 {
			err = fmt.Errorf("it runs as uid %d, not as root", cred.Uid)
		}
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("the process listening on %s is not a gpucr helper run by root: %w", socket, err)
		}
	}
	c := &Conn{w: w, Socket: socket}
	resp, fds, err := c.Call(ctx, &helperpb.Request{Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{
		ProtocolVersion: wire.Version, Role: role, Program: program}}})
	wire.CloseFDs(fds)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("helper on %s: %w", socket, err)
	}
	c.Hello = resp.GetHello()
	if c.Hello == nil {
		nc.Close()
		return nil, fmt.Errorf("helper on %s: Hello answered without HelloReply", socket)
	}
	return c, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.w.Close() }

// Call sends req (its id is set here) and returns the response and any fds
// that came with it; a response with an error is returned as *Error.
func (c *Conn) Call(ctx context.Context, req *helperpb.Request) (*helperpb.Response, []int, error) {
	return c.CallFDs(ctx, req, nil)
}

// CallFDs is Call with descriptors sent along with the request (the image
// directory of a Checkpoint); they stay the caller's.
func (c *Conn) CallFDs(ctx context.Context, req *helperpb.Request, send []int) (*helperpb.Response, []int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	req.Id = c.nextID
	uc := c.w.UnixConn()
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	} else {
		_ = uc.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = uc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	werr := c.w.Write(req, send)
	if werr != nil && !errors.Is(werr, syscall.EPIPE) && !errors.Is(werr, syscall.ECONNRESET) {
		return nil, nil, ctxErr(ctx, werr)
	}
	// A helper that refused the connection (a limit) wrote why before it
	// closed; that answer is still there to read after a failed write.
	resp, fds, err := c.w.ReadResponse()
	if err != nil || (werr != nil && (resp.Id != 0 || resp.Error == nil)) {
		if werr != nil {
			err = werr
		}
		if resp != nil {
			wire.CloseFDs(fds)
		}
		return nil, nil, ctxErr(ctx, err)
	}
	// An error of id 0 answers whatever was asked: the helper refused the
	// connection (a limit) or the frame, and closes it.
	if resp.Id != req.Id && (resp.Id != 0 || resp.Error == nil) {
		wire.CloseFDs(fds)
		return nil, nil, fmt.Errorf("response id %d to request %d", resp.Id, req.Id)
	}
	if resp.Error != nil {
		wire.CloseFDs(fds)
		return resp, nil, &Error{Code: resp.Error.Code, Message: resp.Error.Message}
	}
	return resp, fds, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("timed out: %w", err)
	}
	return err
}

// Status asks the helper for its status: its clients, as many as its reply
// holds (StatusReply.ClientsLeftOut says how many it left out; the
// caller's own come first).
func (c *Conn) Status(ctx context.Context) (*helperpb.StatusReply, error) {
	return c.StatusOfPids(ctx, nil)
}

// StatusOfPids asks the helper for its status, with only the clients of
// pids (nil: all): a checkpoint learns its tree's clients so, whatever
// other clients the helper serves. An older helper ignores pids and lists
// every client: the caller picks its own from what it gets.
func (c *Conn) StatusOfPids(ctx context.Context, pids []int64) (*helperpb.StatusReply, error) {
	resp, _, err := c.Call(ctx, &helperpb.Request{Body: &helperpb.Request_Status{Status: &helperpb.Status{Pids: pids}}})
	if err != nil {
		return nil, err
	}
	st := resp.GetStatus()
	if st == nil {
		return nil, errors.New("Status answered without StatusReply")
	}
	return st, nil
}

// StatusTimeout is what a command gives a one-off Status (StatusOf).
const StatusTimeout = 5 * time.Second

// StatusOf dials the helper at socket as the CLI and asks for its status,
// all within timeout.
func StatusOf(socket string, timeout time.Duration) (*helperpb.StatusReply, error) {
	return StatusOfPidsAt(socket, timeout, nil)
}

// StatusOfPidsAt is StatusOf with only the clients of pids (nil: all).
func StatusOfPidsAt(socket string, timeout time.Duration, pids []int64) (*helperpb.StatusReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := Dial(ctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.StatusOfPids(ctx, pids)
}

// Transfers lists the helper's GPU copies of image directory dir ("" for
// all), oldest first.
func (c *Conn) Transfers(ctx context.Context, dir string) ([]*helperpb.Transfer, error) {
	resp, _, err := c.Call(ctx, &helperpb.Request{Body: &helperpb.Request_Transfers{Transfers: &helperpb.Transfers{ImageDir: dir}}})
	if err != nil {
		return nil, err
	}
	tr := resp.GetTransfers()
	if tr == nil {
		return nil, errors.New("Transfers answered without TransfersReply")
	}
	return tr.GetTransfers(), nil
}

// ClientOp runs op on the client process pid through the helper.
func (c *Conn) ClientOp(ctx context.Context, pid int64, op helperpb.ClientOp_Op, timeout time.Duration) (*helperpb.ClientOpReply, error) {
	return c.ClientOpMsg(ctx, &helperpb.ClientOp{Pid: pid, Op: op, TimeoutMs: uint32(timeout / time.Millisecond)})
}

// ClientOpMsg runs the client operation op names (ClientOp with its other
// fields: a sync target).
func (c *Conn) ClientOpMsg(ctx context.Context, op *helperpb.ClientOp) (*helperpb.ClientOpReply, error) {
	resp, _, err := c.Call(ctx, &helperpb.Request{Body: &helperpb.Request_ClientOp{ClientOp: op}})
	if err != nil {
		return nil, err
	}
	r := resp.GetClientOp()
	if r == nil {
		return nil, errors.New("ClientOp answered without ClientOpReply")
	}
	return r, nil
}

// WaitRestored waits, at most timeout, until every process of the latest
// restore from image directory dir has its GPU memory back or cannot get it,
// and returns what became of each.
func (c *Conn) WaitRestored(ctx context.Context, dir string, timeout time.Duration) ([]*helperpb.RestoreResult, error) {
	resp, _, err := c.Call(ctx, &helperpb.Request{Body: &helperpb.Request_WaitRestored{WaitRestored: &helperpb.WaitRestored{
		ImageDir: dir, TimeoutMs: uint32(timeout / time.Millisecond)}}})
	if err != nil {
		return nil, err
	}
	r := resp.GetRestoreResults()
	if r == nil {
		return nil, errors.New("WaitRestored answered without RestoreResults")
	}
	return r.GetResults(), nil
}
