package daemon

// The residual context: what a process's CUDA context holds beyond the
// device memory the helper owns (its modules, streams and events, the
// driver's own allocations). A checkpoint puts it aside once the process
// has dropped its memory; a give-back brings it back before the memory
// returns. How that is done is the seam below: NVIDIA's driver checkpoint
// API is one way (driverResiduals), and a helper that holds the context
// itself, the process only calling into it, would be another. The
// checkpoint and give-back steps call only Residuals.

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpucr/gpucr/helper/cuda"
)

// GPUPair puts a GPU a process was checkpointed on (Old) onto a GPU of this
// machine (New), by UUID.
type GPUPair struct{ Old, New string }

// ResidualState is where a process's residual context is.
type ResidualState int

const (
	// ResidualRunning: in use by the process.
	ResidualRunning ResidualState = iota
	// ResidualLocked: it takes no new work.
	ResidualLocked
	// ResidualSaved: put aside (the driver's: in the process's host
	// memory, which CRIU dumps with it).
	ResidualSaved
	// ResidualFailed: a step failed; the process cannot use the GPU.
	ResidualFailed
)

func (s ResidualState) String() string {
	switch s {
	case ResidualRunning:
		return "running"
	case ResidualLocked:
		return "locked"
	case ResidualSaved:
		return "checkpointed"
	case ResidualFailed:
		return "failed"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Residuals saves and brings back the residual contexts of processes, by
// pid (the caller makes sure the pid is still its client's process).
type Residuals interface {
	// State is where pid's residual context is.
	State(pid int) (ResidualState, error)
	// Lock: running -> locked, waiting at most timeout for work in
	// progress.
	Lock(pid int, timeout time.Duration) error
	// Save: locked -> saved.
	Save(pid int) error
	// Restore: saved -> locked, onto the GPUs pairs name (none: the same
	// GPUs; otherwise every GPU it was saved on is paired).
	Restore(pid int, pairs []GPUPair) error
	// Unlock: locked -> running.
	Unlock(pid int) error
}

// driverResiduals is NVIDIA's driver checkpoint API (cuCheckpointProcess*,
// helper/cuda).
type driverResiduals struct{}

func (driverResiduals) State(pid int) (ResidualState, error) {
	st, err := cuda.CheckpointState(pid)
	if err != nil {
		return ResidualFailed, err
	}
	switch st {
	case cuda.StateRunning:
		return ResidualRunning, nil
	case cuda.StateLocked:
		return ResidualLocked, nil
	case cuda.StateCheckpointed:
		return ResidualSaved, nil
	case cuda.StateFailed:
		return ResidualFailed, nil
	}
	return ResidualFailed, fmt.Errorf("cuCheckpointProcessGetState: unknown state %v", st)
}

func (driverResiduals) Lock(pid int, timeout time.Duration) error {
	return cuda.CheckpointLock(pid, uint32(timeout/time.Millisecond))
}

func (driverResiduals) Save(pid int) error { return cuda.CheckpointCheckpoint(pid) }

func (driverResiduals) Restore(pid int, pairs []GPUPair) error {
	var cp []cuda.GPUPair
	for _, p := range pairs {
		cp = append(cp, cuda.GPUPair{Old: p.Old, New: p.New})
	}
	return cuda.CheckpointRestoreOnto(pid, cp)
}

func (driverResiduals) Unlock(pid int) error { return cuda.CheckpointUnlock(pid) }

// resumeResidual brings pid's residual context back to running from
// wherever a checkpoint left it: restored (onto the GPUs pairs name) if
// saved, then unlocked if locked.
func resumeResidual(rs Residuals, pid int, pairs []GPUPair) error {
	st, err := rs.State(pid)
	if err != nil {
		return fmt.Errorf("driver state: %w", err)
	}
	if st == ResidualSaved {
		if err := rs.Restore(pid, pairs); err != nil {
			if len(pairs) > 0 {
				return fmt.Errorf("driver restore onto other GPUs (%s): %w", pairsText(pairs), err)
			}
			return fmt.Errorf("driver restore: %w", err)
		}
		st = ResidualLocked
	}
	if st == ResidualLocked {
		if err := rs.Unlock(pid); err != nil {
			return fmt.Errorf("driver unlock: %w", err)
		}
	}
	return nil
}

// pairsText writes GPU pairs as OLD->NEW, ...
func pairsText(pairs []GPUPair) string {
	var s []string
	for _, p := range pairs {
		s = append(s, p.Old+"->"+p.New)
	}
	return strings.Join(s, ", ")
}

// servedResidual is a served client's residual context (Hello.served): its
// worker holds it, and the served library makes it again in the next worker
// it is given. Nothing is asked of the driver (which does not know the
// process); the steps move the state that the checkpoint and the resume
// read, kept in the client.
type servedResidual struct{ cl *client }

func (r servedResidual) State(int) (ResidualState, error) {
	return ResidualState(r.cl.servedResidual.Load()), nil
}

func (r servedResidual) set(st ResidualState) error {
	r.cl.servedResidual.Store(int32(st))
	return nil
}

func (r servedResidual) Lock(int, time.Duration) error { return r.set(ResidualLocked) }
func (r servedResidual) Save(int) error                { return r.set(ResidualSaved) }
func (r servedResidual) Restore(int, []GPUPair) error  { return r.set(ResidualLocked) }
func (r servedResidual) Unlock(int) error              { return r.set(ResidualRunning) }

// residuals is what keeps cl's residual context: rs (the server's, the
// driver's by default), or, for a served client, servedResidual.
func (cl *client) residuals(rs Residuals) Residuals {
	if cl.served.Load() {
		return servedResidual{cl}
	}
	return rs
}
