package checkpoint

import (
	"time"

	"github.com/gpucr/gpucr/helper/internal/printable"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// After a dump is killed: when CRIU dies, the plugin's connection to the
// helper closes, and the helper gives every process it detached for that
// dump its GPU back (a process it is still copying gets it when the copy
// ends). The checkpoint waits a little for that, to say whether it happened.

// gpuBackWait is how long a checkpoint waits for the processes to run again.
const gpuBackWait = 5 * time.Second

// gpuBackPoll is how often it asks the helper meanwhile.
const gpuBackPoll = 100 * time.Millisecond

// waitGPUBack asks the helper at socket until each of pids is a running
// client again (or has exited), for up to wait, and says what each is then.
func waitGPUBack(socket string, pids []proc.Pid, wait time.Duration) []ProcessAfter {
	deadline := time.Now().Add(wait)
	for {
		out := make([]ProcessAfter, 0, len(pids))
		settled := true
		st, err := helperStatus(socket, pids)
		for _, pid := range pids {
			p := ProcessAfter{PID: pid, State: "unknown (the helper does not answer)"}
			switch {
			case !proc.Exists(pid):
				p.State = "gone"
			case err == nil:
				p.State = "not a client of the helper"
				for _, cl := range st.Clients { // a pid may be listed twice while it reattaches
					if proc.Pid(cl.Pid) != pid || p.Running {
						continue
					}
					p.State = stateName(cl.State)
					if cl.State == helperpb.ClientState_CLIENT_STATE_DROPPED && len(cl.NotCheckpointable) > 0 {
						p.State += " (" + printable.String(cl.NotCheckpointable[0]) + ")"
					}
					p.Running = cl.ControlConnected && cl.State == helperpb.ClientState_CLIENT_STATE_RUNNING
				}
			}
			if !p.Running && p.State != "gone" {
				settled = false
			}
			out = append(out, p)
		}
		if settled || time.Now().After(deadline) {
			return out
		}
		time.Sleep(gpuBackPoll)
	}
}

// MayWait is what image.RemoveUnfinished asks of each process whose part
// an unfinished image holds: whether it may still wait for its GPU memory
// in it. Not if it is gone, or its pid is another process's now (the
// part's start time), or the helper at socket says it runs again with its
// memory (connected and running: adopted from the part, or it never gave
// its memory up). Otherwise it may: no helper answers (one that starts
// gives it back from the part), or the helper does not have it running.
func MayWait(socket string) func(image.ProcessInfo) bool {
	return func(p image.ProcessInfo) bool {
		pid := proc.Pid(p.Pid)
		st, err := proc.ReadStat(pid)
		if err != nil || !st.Alive() {
			return false
		}
		if p.StartTime != 0 && st.Start != p.StartTime {
			return false
		}
		reply, err := helperStatus(socket, []proc.Pid{pid})
		if err != nil {
			return true
		}
		for _, cl := range reply.Clients {
			if proc.Pid(cl.Pid) == pid && cl.ControlConnected && cl.State == helperpb.ClientState_CLIENT_STATE_RUNNING {
				return false
			}
		}
		return true
	}
}
