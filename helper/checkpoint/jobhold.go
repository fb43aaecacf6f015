package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// A job's ranks on different hosts meet in collectives (NCCL over sockets)
// but share no memory, so no host's helper sees them as a group: each
// host's dump would quiesce its ranks alone. A rank whose gate closed
// before it launched its part of a collective then leaves its peers'
// kernels waiting on their GPUs, and their drains never end; a host frozen
// once its own GPU drained may still owe its peers the last bytes of a
// collective (NCCL's proxy thread sends them). So, before any host's CRIU
// starts, the coordinator brings every rank of every host to one point, as
// one host's helper does for the ranks that share its memory (group.go):
//
//	hold     every rank stops its peer sync operations (NCCL's kernel
//	         launches) where it is, and says its count;
//	quiesce  every rank behind the highest count runs on to it, then every
//	         gate closes and every GPU drains, on every host.
//
// Only then does any host freeze. The holds and gates are this agent's
// helper connection's: if the agent dies, its host's helper undoes them.

// defaultQuiesceTimeout bounds a rank's run to the job's sync count and
// its quiesce, when the coordinator names no bound.
const defaultQuiesceTimeout = 30 * time.Second

// jobGPU is an agent's hold on its part's GPU processes: a helper
// connection each, so that the ranks behind run on to the job's count at
// once (the helper answers one connection's requests one at a time, and a
// rank behind may wait for another).
type jobGPU struct {
	conns   []*client.Conn
	clients []proc.Pid
	counts  []uint64
}

// close ends the hold: the helper releases what these connections held and
// opens the gates they closed, unless a checkpoint took the rank on.
func (g *jobGPU) close() {
	if g == nil {
		return
	}
	for _, c := range g.conns {
		_ = c.Close()
	}
	g.conns = nil
}

// holdGPU holds every GPU process of the part's tree at its count of peer
// sync operations and returns the highest.
func holdGPU(ctx context.Context, socket string, pid proc.Pid, timeout time.Duration) (*jobGPU, uint64, error) {
	tc := gpuClientsOf(socket, pid)
	if tc.HelperErr != nil {
		return nil, 0, fmt.Errorf("the helper at %s: %w", socket, tc.HelperErr)
	}
	g := &jobGPU{clients: tc.Clients, counts: make([]uint64, len(tc.Clients))}
	var top uint64
	for i, c := range g.clients {
		conn, err := client.Dial(ctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
		if err != nil {
			g.close()
			return nil, 0, fmt.Errorf("the helper at %s: %w", socket, err)
		}
		g.conns = append(g.conns, conn)
		r, err := conn.ClientOpMsg(ctx, &helperpb.ClientOp{Pid: int64(c), Op: helperpb.ClientOp_OP_HOLD_SYNC,
			TimeoutMs: uint32(timeout / time.Millisecond), Scoped: true})
		if err != nil {
			g.close()
			return nil, 0, fmt.Errorf("hold pid %d at its count of peer sync operations: %w", c, err)
		}
		g.counts[i] = r.GetSyncCount()
		top = max(top, g.counts[i])
	}
	return g, top, nil
}

// quiesce lets every rank behind target run on to it, all at once, then
// closes every gate and drains every GPU.
func (g *jobGPU) quiesce(ctx context.Context, target uint64, timeout time.Duration) error {
	ms := uint32(timeout / time.Millisecond)
	errs := make([]error, len(g.clients))
	var wg sync.WaitGroup
	for i, c := range g.clients {
		if g.counts[i] >= target {
			continue
		}
		wg.Go(func() {
			if _, err := g.conns[i].ClientOpMsg(ctx, &helperpb.ClientOp{Pid: int64(c), Op: helperpb.ClientOp_OP_REACH_SYNC,
				SyncTarget: target, TimeoutMs: ms, Scoped: true}); err != nil {
				errs[i] = fmt.Errorf("pid %d was at %d of the job's %d operations that wait for a peer (NCCL's kernels) and did not get there: %w",
					c, g.counts[i], target, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, c := range g.clients {
		for _, op := range []helperpb.ClientOp_Op{helperpb.ClientOp_OP_QUIESCE, helperpb.ClientOp_OP_DRAIN} {
			if _, err := g.conns[i].ClientOpMsg(ctx, &helperpb.ClientOp{Pid: int64(c), Op: op, TimeoutMs: ms, Scoped: true}); err != nil {
				err = fmt.Errorf("pid %d, held at %d operations that wait for a peer, the job's count: %s: %w", c, target, op, err)
				if target == 0 {
					// a job whose ranks meet in collectives and counted none
					// launches them in a way the interposer does not see
					err = fmt.Errorf("%w (no rank of this host counted a launch of NCCL's kernels: its collectives may wait "+
						"on peers that were not held)", err)
				}
				return err
			}
		}
	}
	return nil
}
