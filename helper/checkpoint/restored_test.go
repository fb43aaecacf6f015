package checkpoint

import (
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// A process of a failed restore that was never restored has no pid here:
// it is named by its image's pid, never as "pid 0".
func TestRestoredProcessesNamesNoPidZero(t *testing.T) {
	rs := []*helperpb.RestoreResult{
		{ImagePid: 21247, State: helperpb.RestoreState_RESTORE_STATE_FAILED, Reason: "the restore was abandoned"},
		{ImagePid: 300, State: helperpb.RestoreState_RESTORE_STATE_PENDING},
		{Pid: 410, ImagePid: 400, State: helperpb.RestoreState_RESTORE_STATE_FAILED, Reason: "damaged chunk"},
		{Pid: 500, ImagePid: 500, State: helperpb.RestoreState_RESTORE_STATE_RUNNING},
	}
	out, bad := restoredProcesses(rs, time.Minute)
	text := strings.Join(bad, "; ")
	for _, want := range []string{
		"the image's process 21247 (not restored): the restore was abandoned",
		"the image's process 300 (not restored) has not got its GPU memory back within 1m0s",
		"pid 410 (400 in the image): damaged chunk",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("%q lacks %q", text, want)
		}
	}
	if strings.Contains(text, "pid 0") || len(bad) != 3 || len(out) != 4 || out[3].State != "running" {
		t.Errorf("%d processes, problems %q", len(out), text)
	}
}
