package checkpoint

// Pre-copy: the GPU memory of a tree copied while it runs, round after
// round, before the dump that stops it; the dump then copies only the chunks
// that changed since the last round. For a migration, or any checkpoint
// whose stop should be short where most of the memory holds still (model
// weights, say).
//
// Each round is a GPU-only concurrent checkpoint of every GPU process of
// the tree: the process stops only while the helper snapshots its buffers
// on the device (milliseconds), and the snapshot is written afterwards, so
// every chunk of a round is exactly what the buffer held at that moment,
// stored under the hash of those bytes. A round is an incremental image
// against the round before it (DIR/gpucr-pre-copy/R-PID), so it copies
// only what changed since; rounds go on while that shrinks. The dump's GPU
// image has the last round as its parent: at the final stop every chunk is
// hashed on the GPU, and only one whose hash no round stored is copied. The
// image is exact by construction, whatever the process did in between.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gpucr/gpucr/helper/internal/units"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
)

// PreCopyDir is where a pre-copy's rounds go, inside the image directory:
// the final image is written against them, so they are part of the image
// until it is committed (a migration sends them along; --force puts them
// aside with the rest). Then the checkpoint folds what the image reads
// from them into it and removes them (foldPreCopy): the directory holds
// the image once, not once per round.
const PreCopyDir = "gpucr-pre-copy"

// PreCopy configures the rounds before a dump.
type PreCopy struct {
	// Rounds is the most rounds (0: no pre-copy).
	Rounds int
	// Enough: a round that copied at most this many bytes is the last one.
	// 0: 1% of the tree's GPU memory.
	Enough uint64
}

// PreCopyRound is one round, all the tree's GPU processes together.
type PreCopyRound struct {
	Round   int     `json:"round"`
	Seconds float64 `json:"seconds"`
	// Bytes is the GPU memory of the round; CopiedBytes what it copied
	// (chunks no earlier round had).
	Bytes       uint64 `json:"bytes"`
	CopiedBytes uint64 `json:"copied_bytes"`
	// StallSeconds is the longest the round stopped a process: its
	// quiesce and device-to-device snapshot.
	StallSeconds float64 `json:"stall_seconds"`
}

// preCopyResult is what the rounds left: the parent of the dump's GPU image.
type preCopyResult struct {
	rounds  []PreCopyRound
	last    string // the last image written (absolute), "" if none
	seconds float64
}

// foldPreCopy makes the committed image in dir read nothing from its
// pre-copy rounds (image.FoldParents: their chunk files it uses are linked
// into it) and removes the rounds. Should the fold fail, the rounds stay
// (the image reads them), and the caller is warned.
func foldPreCopy(dir string, ev *emitter) {
	base := filepath.Join(dir, PreCopyDir)
	own := &image.Owner{UID: os.Geteuid(), GID: os.Getegid()}
	if _, err := image.FoldParents(dir, own); err != nil {
		ev.emit(Event{Kind: Warning, Text: fmt.Sprintf("the image still reads chunks of its pre-copy rounds, which stay in %s: %v", base, err)})
		return
	}
	// RemoveAll removes a symlink, it does not follow it.
	if err := os.RemoveAll(base); err != nil {
		ev.emit(Event{Kind: Warning, Text: fmt.Sprintf("the pre-copy rounds in %s, which the image no longer reads, could not all be removed: %v", base, err)})
		return
	}
	ev.emit(Event{Kind: Note, Text: "the pre-copy rounds are folded into the image and removed"})
}

// preCopy runs the rounds for the GPU processes pids of a tree whose image
// goes into dir, starting from parent (the caller's, "" for none).
func preCopy(ctx context.Context, o PreCopy, dir, parent string, pids []proc.Pid, total uint64, env Environment, ev *emitter) (*preCopyResult, error) {
	res := &preCopyResult{last: parent}
	if o.Rounds <= 0 || len(pids) == 0 {
		return res, nil
	}
	t0 := time.Now()
	base := filepath.Join(dir, PreCopyDir)
	if err := os.RemoveAll(base); err != nil {
		return nil, fmt.Errorf("pre-copy: an earlier pre-copy's %s: %w", base, err)
	}
	enough := o.Enough
	if enough == 0 {
		enough = total / 100
	}
	var prevCopied uint64
	for round := 1; round <= o.Rounds; round++ {
		r := PreCopyRound{Round: round}
		start := time.Now()
		for _, pid := range pids {
			into := filepath.Join(base, strconv.Itoa(round)+"-"+pid.String())
			reply, err := DumpGPU(ctx, GPUOptions{Pid: pid, Dir: into, Parent: res.last, LeaveRunning: true, Concurrent: true,
				Socket: env.Socket})
			if err != nil {
				_ = os.RemoveAll(base)
				return nil, fmt.Errorf("pre-copy round %d of pid %d (it runs on): %w", round, pid, err)
			}
			res.last = into
			r.Bytes += reply.GetBytes()
			r.CopiedBytes += reply.GetBytesMoved()
			var stall float64
			for _, ph := range reply.GetPhases() {
				if ph.GetName() == "background-copy" {
					break
				}
				stall += ph.GetSeconds()
			}
			r.StallSeconds = max(r.StallSeconds, stall)
		}
		r.Seconds = time.Since(start).Seconds()
		res.rounds = append(res.rounds, r)
		ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("pre-copy round %d: %s copied of %s in %.3f s (the tree stopped %.3f s)",
			round, units.Bytes(r.CopiedBytes), units.Bytes(r.Bytes), r.Seconds, r.StallSeconds)})
		// Go on while what a round copies shrinks (by a tenth at least)
		// and is still more than enough.
		if r.CopiedBytes <= enough || (round > 1 && r.CopiedBytes*10 > prevCopied*9) {
			break
		}
		prevCopied = r.CopiedBytes
	}
	res.seconds = time.Since(t0).Seconds()
	return res, nil
}
