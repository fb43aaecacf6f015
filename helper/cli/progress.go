package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// gpuWatch follows the helper's GPU copy for one image directory while CRIU
// runs (the plugin, inside CRIU, asks the helper for it): a progress bar on a
// terminal, and the copy's final numbers for the report.
type gpuWatch struct {
	stopc chan struct{}
	done  chan struct{}
	last  *helperpb.Transfer
}

// watchGPU starts watching the copy of dir in the given direction that starts
// after since. bar, if not nil, is where the progress bar goes (a terminal).
func watchGPU(socket, dir string, direction helperpb.Transfer_Direction, since time.Time, bar io.Writer) *gpuWatch {
	w := &gpuWatch{stopc: make(chan struct{}), done: make(chan struct{})}
	go w.run(socket, dir, direction, since, bar)
	return w
}

func (w *gpuWatch) run(socket, dir string, direction helperpb.Transfer_Direction, since time.Time, out io.Writer) {
	defer close(w.done)
	ctx := context.Background()
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	conn, err := client.Dial(dctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
	dcancel()
	if err != nil {
		return // no helper: the plugin says what went wrong
	}
	defer conn.Close()
	var bar *progressbar.ProgressBar
	poll := func() {
		qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
		defer qcancel()
		list, err := conn.Transfers(qctx, dir)
		if err != nil {
			return
		}
		// A dump of a process tree makes one copy per process.
		var mine []*helperpb.Transfer
		for _, t := range list {
			if t.Direction == direction && time.UnixMilli(t.StartedUnixMs).After(since.Add(-time.Second)) {
				mine = append(mine, t)
			}
		}
		if len(mine) > 0 {
			w.last = combine(mine)
		}
		if w.last == nil || out == nil {
			return
		}
		if bar != nil && int64(w.last.BytesTotal) != bar.GetMax64() {
			bar.ChangeMax64(int64(w.last.BytesTotal))
		}
		if bar == nil {
			what := "GPU -> image"
			if direction == helperpb.Transfer_DIRECTION_LOAD {
				what = "image -> GPU"
			}
			bar = progressbar.NewOptions64(int64(w.last.BytesTotal), progressbar.OptionSetWriter(out),
				progressbar.OptionSetDescription("  "+what), progressbar.OptionShowBytes(true),
				progressbar.OptionSetWidth(30), progressbar.OptionThrottle(50*time.Millisecond),
				progressbar.OptionClearOnFinish())
		}
		_ = bar.Set64(int64(w.last.BytesDone))
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.stopc:
			poll() // the final numbers
			if bar != nil {
				_ = bar.Finish()
			}
			return
		case <-tick.C:
			poll()
		}
	}
}

// combine sums copies into one: bytes, the span from the first start to the
// last end, finished when all are, the errors joined.
func combine(ts []*helperpb.Transfer) *helperpb.Transfer {
	out := &helperpb.Transfer{ImageDir: ts[0].ImageDir, Direction: ts[0].Direction, StartedUnixMs: ts[0].StartedUnixMs, Finished: true}
	var end int64 // microseconds since the epoch
	for _, t := range ts {
		out.BytesDone += t.BytesDone
		out.BytesTotal += t.BytesTotal
		out.BytesMoved += t.BytesMoved
		out.Pids = append(out.Pids, t.Pids...)
		out.StartedUnixMs = min(out.StartedUnixMs, t.StartedUnixMs)
		end = max(end, t.StartedUnixMs*1000+int64(t.ElapsedUs))
		out.Finished = out.Finished && t.Finished
		if t.Error != "" {
			if out.Error != "" {
				out.Error += "; "
			}
			out.Error += t.Error
		}
	}
	out.ElapsedUs = uint64(max(0, end-out.StartedUnixMs*1000))
	return out
}

// stop ends the watch and returns the copy it saw last (nil: none).
func (w *gpuWatch) stop() *helperpb.Transfer {
	close(w.stopc)
	<-w.done
	return w.last
}

// isTerminal says whether out is a terminal (progress bars only go there).
func isTerminal(out io.Writer) bool {
	f, ok := out.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// gpuSummary is the report's view of a copy.
func gpuSummary(t *helperpb.Transfer) (map[string]any, string) {
	if t == nil {
		return nil, ""
	}
	secs := float64(t.ElapsedUs) / 1e6
	rate := 0.0
	if secs > 0 {
		rate = float64(t.BytesDone) / 1e9 / secs
	}
	m := map[string]any{"bytes": t.BytesDone, "total_bytes": t.BytesTotal, "seconds": secs, "gb_per_s": rate, "finished": t.Finished,
		"bytes_moved": t.BytesMoved}
	line := fmt.Sprintf("GPU data: %s in %.3f s (%.1f GB/s)", humanBytes(t.BytesDone), secs, rate)
	if t.Direction == helperpb.Transfer_DIRECTION_DUMP && t.BytesMoved < t.BytesDone {
		line += fmt.Sprintf(", %s of it over PCIe (the rest the parent image had)", humanBytes(t.BytesMoved))
	}
	if t.Error != "" {
		m["error"] = t.Error
		line += ", failed: " + t.Error
	} else if !t.Finished {
		line += ", still running"
	}
	return m, line
}
