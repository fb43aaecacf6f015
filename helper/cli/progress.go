package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/internal/units"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// eventPrinter shows a checkpoint's or a restore's events: each phase on a
// line of its own with the time since the start, warnings on stderr, and
// on a terminal a progress bar for the GPU copy. The bar's rate is the
// helper's (bytes copied over the copy's own time), not a guess from the
// moments this process happened to poll.
type eventPrinter struct {
	out, errw io.Writer
	quiet     bool // --json: phases and the bar are not shown
	terminal  bool
	bar       *progressbar.ProgressBar
	done      bool // the copy has finished; no bar again
}

func newEventPrinter(out, errw io.Writer, quiet bool) *eventPrinter {
	return &eventPrinter{out: out, errw: errw, quiet: quiet, terminal: isTerminal(out)}
}

// handle is a checkpoint.Events.
func (p *eventPrinter) handle(ev checkpoint.Event) {
	switch ev.Kind {
	case checkpoint.Warning:
		p.clearBar()
		fmt.Fprintf(p.errw, "gpucr: warning: %s\n", ev.Text)
	case checkpoint.Phase, checkpoint.Note:
		if p.quiet {
			return
		}
		p.clearBar()
		fmt.Fprintf(p.out, "  %6.3f s  %s\n", ev.Elapsed.Seconds(), ev.Text)
	case checkpoint.Progress:
		if p.quiet || !p.terminal || p.done || ev.Transfer == nil {
			return
		}
		p.progress(ev.Transfer)
	}
}

func (p *eventPrinter) progress(t *helperpb.Transfer) {
	what := "GPU -> image"
	if t.Direction == helperpb.Transfer_DIRECTION_LOAD {
		what = "image -> GPU"
	}
	if p.bar == nil {
		p.bar = progressbar.NewOptions64(int64(t.BytesTotal), progressbar.OptionSetWriter(p.out),
			progressbar.OptionSetWidth(30), progressbar.OptionThrottle(50*time.Millisecond),
			progressbar.OptionClearOnFinish(), progressbar.OptionShowBytes(false),
			progressbar.OptionSetPredictTime(false), progressbar.OptionSetElapsedTime(false))
	}
	if int64(t.BytesTotal) != p.bar.GetMax64() {
		p.bar.ChangeMax64(int64(t.BytesTotal))
	}
	rate := ""
	if t.ElapsedUs > 0 {
		rate = fmt.Sprintf(" %.1f GB/s", float64(t.BytesDone)/1e3/float64(t.ElapsedUs))
	}
	_ = p.bar.Set64(int64(t.BytesDone))
	p.bar.Describe(fmt.Sprintf("  %s %s/%s%s", what, units.Bytes(t.BytesDone), units.Bytes(t.BytesTotal), rate))
	if t.Finished {
		p.clearBar()
		p.done = true
	}
}

// clearBar takes the bar off its line before anything else is printed.
func (p *eventPrinter) clearBar() {
	if p.bar != nil {
		_ = p.bar.Clear()
		p.bar = nil
	}
}

// isTerminal says whether out is a terminal (progress bars only go there).
func isTerminal(out io.Writer) bool {
	f, ok := out.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
