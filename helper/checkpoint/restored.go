package checkpoint

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// restoredWait bounds how long a restore waits, after CRIU, for the
// restored processes to have their GPU memory back.
const restoredWait = time.Minute

// GPUProcess is one GPU process of a checkpoint's or a restore's tree.
type GPUProcess struct {
	Pid      proc.Pid `json:"pid"`
	ImagePid proc.Pid `json:"image_pid"` // its pid in the image (a checkpoint's: Pid)
	// State: after a checkpoint "checkpointed"; after a restore "running",
	// "failed" or "pending" (no GPU memory back within the wait).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Phases are the helper's steps of a checkpoint of it (quiesce,
	// gpu-hash, copy, drop, driver-checkpoint...), or of its return after
	// a restore (restore-check, driver-restore, reimport, resume).
	Phases []Step `json:"phases,omitempty"`
	// StoppedSeconds (a checkpoint that left it running): from its quiesce
	// to its resume.
	StoppedSeconds float64 `json:"stopped_seconds,omitempty"`
}

// waitGPURestored asks the helper what became of the GPU processes of the
// restore from dir: CRIU's success says only that the processes exist; each
// must also have got its GPU memory back (the helper checks that the image
// holds exactly the memory the process had, and aborts it otherwise). An
// error lists those that failed, or have not got their memory back within
// the wait.
func waitGPURestored(socket, dir string, wait time.Duration) ([]GPUProcess, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait+5*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
	if err != nil {
		return nil, fmt.Errorf("asking the helper whether the restored processes have their GPU memory back: %w", err)
	}
	defer conn.Close()
	rs, err := conn.WaitRestored(ctx, dir, wait)
	if err != nil {
		return nil, fmt.Errorf("asking the helper whether the restored processes have their GPU memory back: %w", err)
	}
	out, bad := restoredProcesses(rs, wait)
	if len(bad) > 0 {
		return out, fmt.Errorf("the restored processes' GPU state: %s", strings.Join(bad, "; "))
	}
	return out, nil
}

// restoredProcesses turns the helper's answer into the report's processes,
// and says which of them did not get their GPU memory back.
func restoredProcesses(rs []*helperpb.RestoreResult, wait time.Duration) (out []GPUProcess, bad []string) {
	for _, r := range rs {
		p := GPUProcess{Pid: proc.Pid(r.Pid), ImagePid: proc.Pid(r.ImagePid), Reason: r.Reason}
		for _, ph := range r.Phases {
			p.Phases = append(p.Phases, Step{ph.GetName(), ph.GetSeconds()})
		}
		switch r.State {
		case helperpb.RestoreState_RESTORE_STATE_RUNNING:
			p.State = "running"
		case helperpb.RestoreState_RESTORE_STATE_FAILED:
			p.State = "failed"
			bad = append(bad, fmt.Sprintf("%s: %s", restoredName(p.Pid, p.ImagePid), r.Reason))
		default:
			p.State = "pending"
			bad = append(bad, fmt.Sprintf("%s has not got its GPU memory back within %v", restoredName(p.Pid, p.ImagePid), wait))
		}
		out = append(out, p)
	}
	return out, bad
}

// restoredName names a process of a restore: "pid 1234", with its pid in
// the image where that differs ("pid 1240 (1234 in the image)"), or, where
// the helper never saw it come back (no pid here: 0), by its image's pid
// alone.
func restoredName(pid, imagePid proc.Pid) string {
	switch {
	case pid == 0:
		return fmt.Sprintf("the image's process %d (not restored)", imagePid)
	case pid == imagePid || imagePid == 0:
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d (%d in the image)", pid, imagePid)
}
