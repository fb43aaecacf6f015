package checkpoint

import (
	"fmt"
	"strings"

	"github.com/gpucr/gpucr/helper/proc"
)

// Failure is a failed, timed-out or cancelled CRIU run, told with what
// CRIU's log and gpucr's plugin said (and, after a timeout, what became of
// the GPU processes), instead of the RPC's first log line.
type Failure struct {
	Summary   string         // first line: what failed, where the log is
	CRIU      []string       // CRIU's last error lines (criuLogErrors)
	Plugin    []string       // the plugin's messages (GPUCR_PLUGIN_LOG)
	Hints     []string       // what the messages mean for gpucr's flags
	Processes []ProcessAfter // after a timeout: each GPU process of the tree
	Log       string         // CRIU's log file
	TimedOut  bool
	Cancelled bool     // interrupted (SIGINT, SIGTERM): CRIU was stopped on purpose
	Cleanup   []string // what was done to the image directory afterwards
	Err       error    // the RPC's error, shown when neither log nor plugin says anything
	GPU       *GPUCopy // the GPU copy as far as it went (nil: none began)
	// background: CRIU's dump succeeded and the tree ran on; the GPU
	// image, written after that, failed (a concurrent checkpoint). No
	// process waits for its memory from the partial image.
	background bool
	cause      error // what failed the background copy (Unwrap)
}

// Unwrap is what failed a concurrent checkpoint's background copy, if that
// is what failed.
func (f *Failure) Unwrap() error { return f.cause }

// ProcessAfter is a GPU process after its dump was killed.
type ProcessAfter struct {
	PID     proc.Pid `json:"pid"`
	Running bool     `json:"running"`
	State   string   `json:"state"` // the helper's: running, quiesced, detached, gone...
}

func (f *Failure) Error() string {
	var b strings.Builder
	b.WriteString(f.Summary)
	for _, l := range f.Plugin {
		b.WriteString("\n  " + l)
	}
	for _, l := range f.CRIU {
		b.WriteString("\n  criu: " + l)
	}
	if len(f.Plugin) == 0 && len(f.CRIU) == 0 && f.Err != nil && !f.TimedOut && !f.Cancelled {
		fmt.Fprintf(&b, "\n  criu rpc: %v", f.Err)
	}
	for _, h := range f.Hints {
		b.WriteString("\n  hint: " + h)
	}
	for _, p := range f.Processes {
		b.WriteString("\n  " + p.describe())
	}
	for _, l := range f.Cleanup {
		b.WriteString("\n  " + l)
	}
	return b.String()
}

func (p ProcessAfter) describe() string {
	if p.Running {
		return fmt.Sprintf("pid %d runs again: the helper gave it its GPU back", p.PID)
	}
	if p.State == "gone" {
		return fmt.Sprintf("pid %d has exited", p.PID)
	}
	return fmt.Sprintf("pid %d has not got its GPU back yet (state %s): see `gpucr status`", p.PID, p.State)
}

// Fields are the failure's details for a JSON report (--json), beside its
// "error" (the Summary).
func (f *Failure) Fields() map[string]any {
	m := map[string]any{
		"criu_errors":     nonNil(f.CRIU),
		"plugin_messages": nonNil(f.Plugin),
		"hints":           nonNil(f.Hints),
		"log":             f.Log,
		"timed_out":       f.TimedOut,
		"cancelled":       f.Cancelled,
		"cleanup":         nonNil(f.Cleanup),
	}
	if len(f.Plugin) == 0 && len(f.CRIU) == 0 && f.Err != nil && !f.TimedOut && !f.Cancelled {
		m["go_criu_error"] = f.Err.Error()
	}
	if f.TimedOut || f.Cancelled {
		ps := f.Processes
		if ps == nil {
			ps = []ProcessAfter{}
		}
		m["processes"] = ps
	}
	if f.GPU != nil {
		m["gpu"] = f.GPU
	}
	return m
}
