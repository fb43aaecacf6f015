package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// On a terminal the GPU copy's bar never shares a line with a phase: it is
// cleared before each phase line, its rate is the helper's (bytes over the
// copy's own time, never a spike from two polls close together), and once
// the copy has finished it is gone.
func TestEventPrinterTerminal(t *testing.T) {
	var out, errw bytes.Buffer
	p := newEventPrinter(&out, &errw, false)
	p.terminal = true
	tr := func(done uint64, us uint64, fin bool) *helperpb.Transfer {
		return &helperpb.Transfer{BytesDone: done, BytesTotal: 8 << 30, ElapsedUs: us, Finished: fin, Direction: helperpb.Transfer_DIRECTION_LOAD}
	}
	p.handle(checkpoint.Event{Kind: checkpoint.Phase, Text: "restoring", Elapsed: 10 * time.Millisecond})
	p.handle(checkpoint.Event{Kind: checkpoint.Progress, Transfer: tr(1<<30, 100_000, false)})
	time.Sleep(60 * time.Millisecond) // past the bar's throttle
	p.handle(checkpoint.Event{Kind: checkpoint.Progress, Transfer: tr(4<<30, 400_000, false)})
	p.handle(checkpoint.Event{Kind: checkpoint.Phase, Text: "CRIU restored pid 42", Elapsed: 500 * time.Millisecond})
	p.handle(checkpoint.Event{Kind: checkpoint.Progress, Transfer: tr(8<<30, 800_000, true)})
	p.handle(checkpoint.Event{Kind: checkpoint.Phase, Text: "pid 42 runs", Elapsed: 900 * time.Millisecond})
	p.handle(checkpoint.Event{Kind: checkpoint.Warning, Text: "careful"})
	s := out.String()
	if !strings.Contains(s, "image -> GPU") || !strings.Contains(s, "10.7 GB/s") {
		t.Errorf("no bar with the helper's rate (4 GiB in 0.4 s):\n%q", s)
	}
	for _, phase := range []string{"CRIU restored pid 42", "pid 42 runs"} {
		i := strings.Index(s, phase)
		// the line it is on holds nothing but the phase (the bar was cleared:
		// a carriage return before the phase's own text)
		line := s[strings.LastIndexAny(s[:i], "\r\n")+1:]
		line = line[:strings.IndexByte(line, '\n')]
		if strings.Contains(line, "GPU") || !strings.HasSuffix(line, phase) {
			t.Errorf("phase %q shares its line: %q", phase, line)
		}
	}
	if errw.String() != "gpucr: warning: careful\n" {
		t.Errorf("warning: %q", errw.String())
	}
	// with --json nothing but warnings
	out.Reset()
	q := newEventPrinter(&out, &errw, true)
	q.terminal = true
	q.handle(checkpoint.Event{Kind: checkpoint.Phase, Text: "restoring"})
	q.handle(checkpoint.Event{Kind: checkpoint.Progress, Transfer: tr(1, 1, false)})
	if out.Len() != 0 {
		t.Errorf("--json printed %q", out.String())
	}
}
