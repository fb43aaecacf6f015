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

import (
	"encoding/hex"
	"fmt"
	"strings"
	"unsafe"
)

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

// CheckpointRestore is cuCheckpointProcessRestore: checkpointed -> locked,
// on the GPUs the process had.
func CheckpointRestore(pid int) error { return CheckpointRestoreOnto(pid, nil) }

// GPUPair is a GPU a process was checkpointed on and the GPU its restore
// puts it on (cuCheckpointProcessRestore's gpuPairs), by UUID as UUIDString
// writes them.
type GPUPair struct{ Old, New string }

// CheckpointRestoreOnto is cuCheckpointProcessRestore onto other GPUs: the
// driver wants every GPU the process was checkpointed on paired (none: the
// same GPUs).
func CheckpointRestoreOnto(pid int, pairs []GPUPair) error {
	if len(pairs) > C.GS_MAX_GPU_PAIRS {
		return fmt.Errorf("cuCheckpointProcessRestore: %d GPU pairs, at most %d", len(pairs), C.GS_MAX_GPU_PAIRS)
	}
	raw := make([]byte, 32*len(pairs)+1) // +1: a valid pointer even without pairs
	for i, p := range pairs {
		o, err := ParseUUID(p.Old)
		if err != nil {
			return fmt.Errorf("cuCheckpointProcessRestore: GPU pair %d: %w", i, err)
		}
		n, err := ParseUUID(p.New)
		if err != nil {
			return fmt.Errorf("cuCheckpointProcessRestore: GPU pair %d: %w", i, err)
		}
		copy(raw[32*i:], o[:])
		copy(raw[32*i+16:], n[:])
	}
	return check("cuCheckpointProcessRestore",
		C.gs_ckpt_restore(C.int(pid), (*C.uchar)(unsafe.Pointer(&raw[0])), C.unsigned(len(pairs))))
}

// ParseUUID reads a GPU UUID as the driver's tools write it
// ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; the prefix may be left out).
func ParseUUID(s string) ([16]byte, error) {
	var u [16]byte
	h := strings.ReplaceAll(strings.TrimPrefix(s, "GPU-"), "-", "")
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != 16 {
		return u, fmt.Errorf("%q is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", s)
	}
	copy(u[:], b)
	return u, nil
}

// CheckpointUnlock is cuCheckpointProcessUnlock: locked -> running.
func CheckpointUnlock(pid int) error {
	return check("cuCheckpointProcessUnlock", C.gs_ckpt_unlock(C.int(pid)))
}
