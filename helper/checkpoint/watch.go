package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/internal/units"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// gpuWatch follows the helper's GPU copy for one image directory while CRIU
// runs (the plugin, inside CRIU, asks the helper for it): Progress events,
// and the copy's final numbers for the report.
type gpuWatch struct {
	stopc chan struct{}
	done  chan struct{}
	last  *helperpb.Transfer
	each  []*helperpb.Transfer // the copies last seen, one per process
}

// watchPoll is how often the helper is asked.
const watchPoll = 100 * time.Millisecond

// watchGPU starts watching the copy of dir in the given direction of the
// CRIU run begun at since.
func watchGPU(socket, dir string, direction helperpb.Transfer_Direction, since time.Time, ev *emitter) *gpuWatch {
	w := &gpuWatch{stopc: make(chan struct{}), done: make(chan struct{})}
	go w.run(socket, dir, direction, since, ev)
	return w
}

func (w *gpuWatch) run(socket, dir string, direction helperpb.Transfer_Direction, since time.Time, ev *emitter) {
	defer close(w.done)
	ctx := context.Background()
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	conn, err := client.Dial(dctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
	dcancel()
	if err != nil {
		return // no helper: the plugin says what went wrong
	}
	defer conn.Close()
	var sent uint64
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
			if ofThisRun(t, direction, since) {
				mine = append(mine, t)
			}
		}
		if len(mine) == 0 {
			return
		}
		w.last, w.each = combine(mine), mine
		if w.last.BytesDone != sent || w.last.Finished {
			sent = w.last.BytesDone
			ev.emit(Event{Kind: Progress, Transfer: w.last})
		}
	}
	tick := time.NewTicker(watchPoll)
	defer tick.Stop()
	for {
		select {
		case <-w.stopc:
			poll() // the final numbers
			return
		case <-tick.C:
			poll()
		}
	}
}

// ofThisRun says whether t is a copy in direction of the CRIU run begun at
// start (a copy begun up to a second before, clocks rounded, counts), but
// not one that had ended by then (the run before it, into the same
// directory: a concurrent dump taken again).
func ofThisRun(t *helperpb.Transfer, direction helperpb.Transfer_Direction, start time.Time) bool {
	return t.Direction == direction && time.UnixMilli(t.StartedUnixMs).After(start.Add(-time.Second)) &&
		!(t.Finished && t.FinishedUnixUs != 0 && time.UnixMicro(t.FinishedUnixUs).Before(start))
}

// combine sums copies into one: bytes, the span from the first start to the
// last end, finished when all are, the errors joined; from a resident copy
// when all were.
func combine(ts []*helperpb.Transfer) *helperpb.Transfer {
	out := &helperpb.Transfer{ImageDir: ts[0].ImageDir, Direction: ts[0].Direction, StartedUnixMs: ts[0].StartedUnixMs, Finished: true,
		FromResident: true}
	var end int64 // microseconds since the epoch
	for _, t := range ts {
		out.BytesDone += t.BytesDone
		out.BytesTotal += t.BytesTotal
		out.BytesMoved += t.BytesMoved
		out.Pids = append(out.Pids, t.Pids...)
		out.StartedUnixMs = min(out.StartedUnixMs, t.StartedUnixMs)
		end = max(end, t.StartedUnixMs*1000+int64(t.ElapsedUs))
		out.Finished = out.Finished && t.Finished
		out.FromResident = out.FromResident && t.FromResident
		out.FinishedUnixUs = max(out.FinishedUnixUs, t.FinishedUnixUs)
		if t.Error != "" {
			if out.Error != "" {
				out.Error += "; "
			}
			out.Error += t.Error
		}
	}
	out.ElapsedUs = uint64(max(0, end-out.StartedUnixMs*1000))
	if !out.Finished {
		out.FinishedUnixUs = 0
	}
	return out
}

// stop ends the watch and returns the copy it saw last (nil: none), all
// processes together and each.
func (w *gpuWatch) stop() (*helperpb.Transfer, []*helperpb.Transfer) {
	close(w.stopc)
	<-w.done
	return w.last, w.each
}

// GPUCopy is the helper's copy of the GPU data in a checkpoint or a
// restore, all processes together.
type GPUCopy struct {
	Bytes      uint64  `json:"bytes"`       // copied so far
	TotalBytes uint64  `json:"total_bytes"` // all of it
	BytesMoved uint64  `json:"bytes_moved"` // over PCIe (a dump with a parent moves only what the parent lacks)
	Seconds    float64 `json:"seconds"`
	GBPerS     float64 `json:"gb_per_s"`
	Finished   bool    `json:"finished"`
	Error      string  `json:"error,omitempty"`
	// FromResident: a load copied on the GPU from the image's resident
	// copy (gpucr image load); nothing crossed PCIe.
	FromResident bool `json:"from_resident,omitempty"`
	dump         bool
}

func gpuCopyOf(t *helperpb.Transfer) *GPUCopy {
	if t == nil {
		return nil
	}
	c := &GPUCopy{Bytes: t.BytesDone, TotalBytes: t.BytesTotal, BytesMoved: t.BytesMoved, Seconds: float64(t.ElapsedUs) / 1e6,
		Finished: t.Finished, Error: t.Error, FromResident: t.FromResident, dump: t.Direction == helperpb.Transfer_DIRECTION_DUMP}
	if c.Seconds > 0 {
		c.GBPerS = float64(t.BytesDone) / 1e9 / c.Seconds
	}
	return c
}

// String is the copy in one line, for people.
func (c *GPUCopy) String() string {
	if c == nil {
		return ""
	}
	line := fmt.Sprintf("GPU data: %s in %.3f s (%.1f GB/s)", units.Bytes(c.Bytes), c.Seconds, c.GBPerS)
	if c.dump && c.BytesMoved < c.Bytes {
		line += fmt.Sprintf(", %s of it over PCIe (the rest the parent image had)", units.Bytes(c.BytesMoved))
	}
	if c.FromResident {
		line += ", copied on the GPU from the image's resident copy"
	}
	if c.Error != "" {
		line += ", failed: " + c.Error
	} else if !c.Finished {
		line += ", still running"
	}
	return line
}

// backgroundStall is how long the background copy of a concurrent
// checkpoint may go without progress before the checkpoint gives up on it.
const backgroundStall = 2 * time.Minute

// resumeWait bounds how long a leave-running dump waits, after CRIU, for
// its GPU processes to run again, to report how long they were stopped.
const resumeWait = 15 * time.Second

// awaitBackground waits until the helper's background copies of dir (those
// of concurrent checkpoints begun after since) have finished, which they do
// once the GPU image is committed or dropped: nil if committed, else why
// not. A copy that makes no progress for backgroundStall, or a helper that
// stops answering, is a failure: the image is not complete. With resumed,
// it also waits (up to resumeWait, without failing) until every GPU
// process of the dump runs again, so that the report says how long each
// was stopped.
func awaitBackground(ctx context.Context, socket, dir string, since time.Time, resumed bool) error {
	var lastDone uint64
	lastMove := time.Now()
	resumeBy := time.Now().Add(resumeWait)
	return pollTransfers(ctx, socket, dir, watchPoll, "the GPU image was still being written, and the helper no longer answers",
		func(list []*helperpb.Transfer) (bool, error) {
			var mine []*helperpb.Transfer
			waiting := false // for a process to run again
			for _, t := range list {
				if !ofThisRun(t, helperpb.Transfer_DIRECTION_DUMP, since) {
					continue
				}
				if t.Background {
					mine = append(mine, t)
				}
				if resumed && t.StoppedSeconds == 0 && t.Error == "" && time.Now().Before(resumeBy) {
					waiting = true
				}
			}
			var all *helperpb.Transfer
			if len(mine) > 0 {
				all = combine(mine)
				if all.Finished && all.Error != "" {
					for _, t := range mine {
						if t.Changed {
							return false, changedErr{all.Error}
						}
					}
					return false, errors.New(all.Error)
				}
			}
			switch {
			case (all == nil || all.Finished) && !waiting:
				return true, nil // committed (with the dump, or after it), and every process runs again
			case all == nil || all.Finished:
				// only a process's return is awaited
			case all.BytesDone != lastDone:
				lastDone, lastMove = all.BytesDone, time.Now()
			case time.Since(lastMove) > backgroundStall:
				return false, fmt.Errorf("the background copy of the GPU memory made no progress for %v (%s of %s done)",
					backgroundStall, units.Bytes(all.BytesDone), units.Bytes(all.BytesTotal))
			}
			return false, nil
		})
}

// pollTransfers asks the helper for dir's copies every period until step
// says they are done or fails; lost begins the error of a helper that no
// longer answers.
func pollTransfers(ctx context.Context, socket, dir string, period time.Duration, lost string,
	step func([]*helperpb.Transfer) (bool, error)) error {
	dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
	conn, err := client.Dial(dctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
	dcancel()
	if err != nil {
		return fmt.Errorf("%s: %w", lost, err)
	}
	defer conn.Close()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
		list, err := conn.Transfers(qctx, dir)
		qcancel()
		if err != nil {
			return fmt.Errorf("%s: %w", lost, err)
		}
		if done, err := step(list); done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// loadedWait bounds how long a restore on demand waits for the rest of its
// GPU data once its processes run (storage that hangs must not hold the
// command forever).
const loadedWait = 10 * time.Minute

// awaitLoaded waits until the helper's load of dir for the restore begun at
// since has ended, and returns it (nil: the helper showed none); a load
// that failed is the error.
func awaitLoaded(ctx context.Context, socket, dir string, since time.Time, wait time.Duration) (*helperpb.Transfer, error) {
	deadline := time.Now().Add(wait)
	var all *helperpb.Transfer
	err := pollTransfers(ctx, socket, dir, watchPoll/4, "the helper no longer answers", func(list []*helperpb.Transfer) (bool, error) {
		var mine []*helperpb.Transfer
		for _, t := range list {
			if ofThisRun(t, helperpb.Transfer_DIRECTION_LOAD, since) {
				mine = append(mine, t)
			}
		}
		if len(mine) == 0 {
			return true, nil
		}
		all = combine(mine)
		switch {
		case all.Finished && all.Error != "":
			return false, fmt.Errorf("their GPU data failed to load (the processes were ended): %s", all.Error)
		case all.Finished:
			return true, nil
		case time.Now().After(deadline):
			return false, fmt.Errorf("their GPU data was still loading after %v", wait)
		}
		return false, nil
	})
	return all, err
}
