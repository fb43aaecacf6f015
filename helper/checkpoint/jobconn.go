package checkpoint

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
)

// The TCP connections of a job's part that go to other parts: what its
// coordinator matches across hosts (each such connection must be seen from
// both ends), what the dump waits on until nothing of them is in flight,
// and what the commit ends once every part is dumped.

// JobConn is a TCP connection of a part of a job, by its two endpoints as
// people write them ("10.0.0.1:40100", "[fd00::1]:29500").
type JobConn struct {
	Local  string `json:"local"`
	Remote string `json:"remote"`
}

// Peer is the same connection as its other end sees it.
func (c JobConn) Peer() JobConn { return JobConn{Local: c.Remote, Remote: c.Local} }

func (c JobConn) String() string { return c.Local + " -> " + c.Remote }

// OutsideConns lists the TCP connections the tree of root holds whose other
// end is not in the tree: on a job's host, those that should go to other
// parts of the job.
func OutsideConns(root proc.Pid) []JobConn {
	var out []JobConn
	for _, c := range scanTree(proc.Tree(root)).conns {
		if !c.inside && !slices.Contains(out, c.jobConn()) {
			out = append(out, c.jobConn())
		}
	}
	return out
}

// connQueue is what /proc/net/tcp says of one connection.
type connQueue struct {
	conn  tcpConn
	state int64
	tx    uint64 // bytes written and not yet acknowledged by the peer
}

// readConnQueues reads the connections of /proc/net/tcp-formatted r.
func readConnQueues(r io.Reader, family uint8) map[JobConn]connQueue {
	out := map[JobConn]connQueue{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// sl local rem st tx_queue:rx_queue ...
		f := strings.Fields(sc.Text())
		if len(f) < 5 || !strings.Contains(f[1], ":") {
			continue
		}
		st, err := strconv.ParseInt(f[3], 16, 16)
		if err != nil {
			continue
		}
		txs, _, _ := strings.Cut(f[4], ":")
		tx, err := strconv.ParseUint(txs, 16, 64)
		if err != nil {
			continue
		}
		c, ok := parseConn(family, f[1], f[2])
		if !ok {
			continue
		}
		if st == tcpTimeWaitState {
			continue // a closed connection with the same endpoints is not this one
		}
		out[c.jobConn()] = connQueue{conn: c, state: st, tx: tx}
	}
	return out
}

// connQueues reads the connections of the network namespace pid is in.
func connQueues(pid proc.Pid) (map[JobConn]connQueue, error) {
	all := map[JobConn]connQueue{}
	for _, src := range []struct {
		name   string
		family uint8
	}{{"tcp", unix.AF_INET}, {"tcp6", unix.AF_INET6}} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, src.name))
		if errors.Is(err, os.ErrNotExist) && src.family == unix.AF_INET6 {
			continue // a kernel without IPv6
		}
		if err != nil {
			return nil, fmt.Errorf("the TCP connections of pid %d: %w", pid, err)
		}
		for k, v := range readConnQueues(f, src.family) {
			all[k] = v
		}
		f.Close()
	}
	return all, nil
}

// tcpEstablishedState is TCP_ESTABLISHED in /proc/net/tcp.
const tcpEstablishedState = 1

// drainPoll is how often waitDrained looks again.
const drainPoll = 2 * time.Millisecond

// waitDrained waits until every connection of conns (in the network
// namespace of pid) has nothing written that its peer has not
// acknowledged: with every part of the job frozen (nothing new is written)
// and this true at both ends of a connection, nothing of it is in flight,
// and nothing will be (docs/job-checkpoint.md). A connection whose
// receiver's buffer is full is as quiet: everything sent was acknowledged,
// and the rest waits for a window its frozen peer will not open (the
// kernel's window probes carry no data); sock_diag's tcp_info tells it from
// one still sending. It returns those connections: their dumped send
// queues hold bytes never sent, which CRIU's restore sends out of repair
// mode (jobrestore.go restores their peers first). A connection that is
// gone or no longer established fails it: the job would not restore as it
// ran.
func waitDrained(ctx context.Context, pid proc.Pid, conns []JobConn, timeout time.Duration) ([]JobConn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	diag := -1
	defer func() {
		if diag >= 0 {
			unix.Close(diag)
		}
	}()
	for {
		qs, err := connQueues(pid)
		if err != nil {
			return nil, err
		}
		var busy []string
		var full []JobConn
		for _, c := range conns {
			q, ok := qs[c]
			switch {
			case !ok:
				return nil, fmt.Errorf("the job's connection %s is gone", c)
			case q.state != tcpEstablishedState:
				return nil, fmt.Errorf("the job's connection %s is no longer established (state %d)", c, q.state)
			case q.tx > 0:
				if diag < 0 {
					diag, _ = sockDiagSocket() // none: the connection counts as in flight
				}
				if diag >= 0 {
					if ti, err := tcpInfoOf(diag, q.conn); err == nil && ti.windowFull() {
						full = append(full, c)
						continue
					}
				}
				busy = append(busy, fmt.Sprintf("%s (%d bytes)", c, q.tx))
			}
		}
		if len(busy) == 0 {
			return full, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the job's connections still had unacknowledged data after %v, every part frozen: %s "+
				"(its host does not answer, or a kernel that cannot say whether the receiver's buffer is full); nothing was dumped",
				timeout, namedList(busy))
		case <-time.After(drainPoll):
		}
	}
}

// endJobConns ends conns (established) in the network namespace of the
// caller: the kernel resets each (sock_diag's SOCK_DESTROY), so that
// neither end keeps the pair of endpoints in TIME_WAIT, which would keep
// the restore from making the connection again for a minute. Called once
// the part is dumped and before it is killed.
func endJobConns(pid proc.Pid, conns []JobConn) error {
	qs, err := connQueues(pid)
	if err != nil {
		return err
	}
	fd, err := sockDiagSocket()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var errs []error
	for i, c := range conns {
		q, ok := qs[c]
		if !ok {
			continue // its peer's reset ended it already
		}
		states := uint32(1<<tcpEstablishedState | 1<<tcpCloseWaitState)
		if err := sockDiagCall(fd, destroyRequest(q.conn, uint32(i+1), states)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("ending the job's connection %s: %w", c, err))
		}
	}
	return errors.Join(errs...)
}

// tcpCloseWaitState is TCP_CLOSE_WAIT in /proc/net/tcp: the peer closed
// (its part was killed first, without a reset).
const tcpCloseWaitState = 8
