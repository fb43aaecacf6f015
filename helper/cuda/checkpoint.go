package cuda

// The driver's checkpoint API (R550 and newer): cuCheckpointProcess* on
// another process, by pid. The helper locks a quiesced, drained and dropped
// process, checkpoints its residual context (what the driver keeps of it
// beyond the device memory, which the helper owns and copies itself), and
// restores and unlocks it again (helper/daemon).

/*
#include "shim.h"
*/
import "C"

import "fmt"

// CheckpointAPI are the driver checkpoint API's entry points that the helper
// requires: Load fails on a driver that lacks one (shim.c resolves them all),
// and Probe lists those it lacks. The helper calls all of them but
// cuCheckpointProcessGetRestoreThreadId, which it requires all the same:
// every driver with the API has it, and gpucr check has always asked for it.
var CheckpointAPI = []string{
	"cuCheckpointProcessGetRestoreThreadId",
	"cuCheckpointProcessGetState",
	"cuCheckpointProcessLock",
	"cuCheckpointProcessCheckpoint",
	"cuCheckpointProcessRestore",
	"cuCheckpointProcessUnlock",
}

// ProcessState is the driver's checkpoint state of a process.
type ProcessState int

const (
	StateRunning      ProcessState = 0
	StateLocked       ProcessState = 1
	StateCheckpointed ProcessState = 2
	StateFailed       ProcessState = 3
)

func (s ProcessState) String() string {
	switch s {
	case StateRunning:
		return "running"
	case StateLocked:
		return "locked"
	case StateCheckpointed:
		return "checkpointed"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// The calls act on process pid; the driver must be loaded (Load), no context
// is needed.

// CheckpointState is cuCheckpointProcessGetState: where pid is.
func CheckpointState(pid int) (ProcessState, error) {
	var s C.int
	err := check("cuCheckpointProcessGetState", C.gs_ckpt_state(C.int(pid), &s))
	return ProcessState(s), err
}

// CheckpointLock is cuCheckpointProcessLock: running -> locked, waiting at
// most timeoutMs for the lock.
func CheckpointLock(pid int, timeoutMs uint32) error {
	return check("cuCheckpointProcessLock", C.gs_ckpt_lock(C.int(pid), C.unsigned(timeoutMs)))
}

// CheckpointCheckpoint is cuCheckpointProcessCheckpoint: locked ->
// checkpointed (the driver keeps what it held of the process on the GPU in
// host memory).
func CheckpointCheckpoint(pid int) error {
	return check("cuCheckpointProcessCheckpoint", C.gs_ckpt_checkpoint(C.int(pid)))
}

// CheckpointRestore is cuCheckpointProcessRestore: checkpointed -> locked.
func CheckpointRestore(pid int) error {
	return check("cuCheckpointProcessRestore", C.gs_ckpt_restore(C.int(pid)))
}

// CheckpointUnlock is cuCheckpointProcessUnlock: locked -> running.
func CheckpointUnlock(pid int) error {
	return check("cuCheckpointProcessUnlock", C.gs_ckpt_unlock(C.int(pid)))
}
