package checkpoint

import (
	"time"

	"github.com/gpucr/gpucr/helper/internal/printable"
	"github.com/gpucr/gpucr/helper/proc"
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
