package daemon

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// keepFinished is how many finished transfers the helper remembers, so that
// a CLI can read the numbers of a copy that ended before it asked.
const keepFinished = 32

// transfer is one GPU copy between helper memory and an image: what
// Transfers reports while it runs and after.
type transfer struct {
	uid       uint32 // who asked for it: Transfers shows it to that uid (and root) only
	dir       string
	direction helperpb.Transfer_Direction
	total     uint64
	pids      []int64
	start     time.Time
	// background: a concurrent checkpoint's copy, finished once its image
	// is committed or dropped (background.go)
	background bool
	stopped    time.Time         // a checkpoint's: its process's quiesce
	stall      time.Duration     // from then to its resume (0: not resumed)
	after      []*helperpb.Phase // the resume's steps, when it came after the checkpoint
	idle       time.Duration     // a background copy's wait for its process: not copy time
	done       atomic.Uint64
	moved      atomic.Uint64 // over PCIe (a dump's copied chunks)
	// fromResident: a load copied on the device from a resident image
	// (nothing over PCIe); set before its first progress
	fromResident atomic.Bool

	mu         sync.Mutex
	finished   bool
	finishedAt time.Time
	err        string
	changed    bool              // err is a copy-on-write window's ChangedError
	phases     []*helperpb.Phase // a dump's checkpoint steps, once it has ended
}

// setPhases records the steps of the checkpoint this copy was part of.
func (t *transfer) setPhases(ph []*helperpb.Phase) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.phases = ph
}

// resumed records that the checkpoint's process runs again, after the steps
// ph of its resume (shown after the checkpoint's; nil where the checkpoint's
// own steps hold them). A nil t (no checkpoint stopped the process) records
// nothing.
func (t *transfer) resumed(ph []*helperpb.Phase) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped.IsZero() || t.stall > 0 {
		return
	}
	t.stall = time.Since(t.stopped)
	t.after = ph
}

// waited records that a background copy waited d for its process before
// it began: its elapsed time leaves that out.
func (t *transfer) waited(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.idle += d
}

// progress is the engines' Options.Progress: bytes moved so far, reported
// from several lanes at once (so never lowered).
func (t *transfer) progress(moved int64) {
	for {
		old := t.done.Load()
		if uint64(moved) <= old || t.done.CompareAndSwap(old, uint64(moved)) {
			return
		}
	}
}

// copied is the engines' Options.Copied: a dump copied n bytes over PCIe.
func (t *transfer) copied(n int64) { t.moved.Add(uint64(n)) }

func (t *transfer) finish(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.finished {
		return
	}
	t.finished = true
	t.finishedAt = time.Now()
	if err != nil {
		t.err = err.Error()
		t.changed = isChangedWindow(err)
	}
}

func (t *transfer) proto() *helperpb.Transfer {
	t.mu.Lock()
	defer t.mu.Unlock()
	end := time.Now()
	if t.finished {
		end = t.finishedAt
	}
	took := end.Sub(t.start)
	took -= min(t.idle, took)
	moved := t.moved.Load()
	if t.direction == helperpb.Transfer_DIRECTION_LOAD {
		moved = t.done.Load() // a load moves every byte it has done
		if t.fromResident.Load() {
			moved = 0
		}
	}
	return &helperpb.Transfer{ImageDir: t.dir, Direction: t.direction, BytesDone: t.done.Load(), BytesTotal: t.total,
		StartedUnixMs: t.start.UnixMilli(), ElapsedUs: uint64(took.Microseconds()), Finished: t.finished,
		Error: t.err, Pids: t.pids, BytesMoved: moved, Phases: append(append([]*helperpb.Phase(nil), t.phases...), t.after...),
		Background:     t.background,
		StoppedSeconds: t.stall.Seconds(), Changed: t.changed, FinishedUnixUs: unixMicroOrZero(t.finishedAt),
		FromResident: t.fromResident.Load()}
}

func unixMicroOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// transferLog holds the running transfers and the last finished ones.
type transferLog struct {
	mu   sync.Mutex
	list []*transfer // oldest first
}

// begin records a new transfer of total bytes for image directory dir, on
// root's behalf (restores: the plugin, or the helper itself for an orphan).
func (l *transferLog) begin(dir string, dump bool, total uint64, pids []int64) *transfer {
	return l.beginFor(0, dir, dump, total, pids)
}

// beginFor is begin on behalf of uid.
func (l *transferLog) beginFor(uid uint32, dir string, dump bool, total uint64, pids []int64) *transfer {
	d := helperpb.Transfer_DIRECTION_LOAD
	if dump {
		d = helperpb.Transfer_DIRECTION_DUMP
	}
	t := &transfer{uid: uid, dir: resolvedDir(dir), direction: d, total: total, pids: pids, start: time.Now()}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.list = append(l.list, t)
	// Forget the oldest finished ones beyond keepFinished.
	finished := 0
	for _, x := range l.list {
		x.mu.Lock()
		if x.finished {
			finished++
		}
		x.mu.Unlock()
	}
	kept := l.list[:0]
	for _, x := range l.list {
		x.mu.Lock()
		drop := x.finished && finished > keepFinished
		x.mu.Unlock()
		if drop {
			finished--
			continue
		}
		kept = append(kept, x)
	}
	l.list = kept
	return t
}

// snapshot lists the transfers of dir ("" for all) that uid may see (its
// own; root: all), oldest first.
func (l *transferLog) snapshot(dir string, uid uint32) []*helperpb.Transfer {
	if dir != "" {
		dir = resolvedDir(dir)
	}
	l.mu.Lock()
	list := append([]*transfer(nil), l.list...)
	l.mu.Unlock()
	var out []*helperpb.Transfer
	for _, t := range list {
		if (dir == "" || t.dir == dir) && (uid == 0 || t.uid == uid) {
			out = append(out, t.proto())
		}
	}
	return out
}

// resolvedDir is dir absolute with symlinks resolved (as given if that fails):
// the CLI, CRIU's plugin and the helper may each name one directory differently.
func resolvedDir(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r
	}
	return abs
}
