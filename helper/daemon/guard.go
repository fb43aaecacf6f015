package daemon

// Copy-on-write windows (engine.Guard) of concurrent checkpoints, as the
// helper runs them: the window is armed at the quiesce point, opens with
// the Resume that lets the process run on (the guarded chunks go with it),
// serves the interposer's SaveFirst requests on its calls connection while
// the background saves the rest, and closes with Unguard.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// ConcurrentMode is how a concurrent checkpoint keeps the buffers of a
// process that runs on while they are saved.
type ConcurrentMode int

const (
	// ConcurrentAuto: a snapshot in spare GPU memory where it fits, a
	// copy-on-write window for the rest.
	ConcurrentAuto ConcurrentMode = iota
	// ConcurrentSnapshot: a snapshot where it fits; the rest is copied
	// while the process waits.
	ConcurrentSnapshot
	// ConcurrentCopyOnWrite: every buffer in a copy-on-write window; no
	// snapshot memory.
	ConcurrentCopyOnWrite
)

var concurrentModes = []string{"auto", "snapshot", "copy-on-write"}

func (m ConcurrentMode) String() string { return concurrentModes[m] }

// ParseConcurrentMode reads a --concurrent-mode value.
func ParseConcurrentMode(s string) (ConcurrentMode, error) {
	for i, name := range concurrentModes {
		if strings.EqualFold(strings.TrimSpace(s), name) {
			return ConcurrentMode(i), nil
		}
	}
	return 0, fmt.Errorf("%q is not one of %s", s, strings.Join(concurrentModes, ", "))
}

// guardWaitLimit bounds how long a checkpoint of a process waits for the
// window of its previous checkpoint to end.
const guardWaitLimit = 5 * time.Minute

// setGuard arms g for cl: the next Resume it is sent opens the window.
func (cl *client) setGuard(g *engine.Guard) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.guard = g
	cl.guardOver = make(chan struct{})
}

// guardNow is cl's window (armed or open), or nil.
func (cl *client) guardNow() *engine.Guard {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.guard
}

// clearGuard forgets g (if it is still cl's window) and tells whoever waits
// for it to end.
func (cl *client) clearGuard(g *engine.Guard) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.guard != g || g == nil {
		return false
	}
	cl.guard = nil
	close(cl.guardOver)
	return true
}

// waitGuard waits until cl has no window (a checkpoint of a process whose
// previous window is still open), at most limit; false if one remains.
func (cl *client) waitGuard(limit time.Duration) bool {
	cl.mu.Lock()
	over := cl.guardOver
	open := cl.guard != nil
	cl.mu.Unlock()
	if !open {
		return true
	}
	select {
	case <-over:
		return true
	case <-time.After(limit):
		return false
	}
}

// resumeRequest is the Resume cl is sent: with its armed window's pending
// chunks, if it has one.
func (cl *client) resumeRequest() *helperpb.Request {
	res := &helperpb.Resume{}
	if d := cl.demandNow(); d != nil {
		d.window(res)
		return &helperpb.Request{Body: &helperpb.Request_Resume{Resume: res}}
	}
	if g := cl.guardNow(); g != nil {
		res.GuardChunk = uint64(g.ChunkSize())
		pend := g.PendingChunks()
		for i, r := range g.Regions() {
			if slices.Contains(pend[i], true) {
				res.Guard = append(res.Guard, guardRegion(r, len(pend[i]), func(c int) bool { return pend[i][c] }))
			}
		}
	}
	return &helperpb.Request{Body: &helperpb.Request_Resume{Resume: res}}
}

// guardRegion is r in a Resume's window, of n chunks, those pending set.
func guardRegion(r engine.Region, n int, pending func(c int) bool) *helperpb.GuardRegion {
	bits := make([]byte, (n+7)/8)
	for c := range n {
		if pending(c) {
			bits[c/8] |= 1 << (c % 8)
		}
	}
	return &helperpb.GuardRegion{Address: r.Address, Size: r.Size, Pending: bits, Vmm: r.Kind == image.AllocVMM}
}

// saveFirst serves a SaveFirst: the ranges' pending chunks are saved before
// the answer, which is Ok whatever happened (the window's failure fails its
// checkpoint, not the application's call).
func (cl *client) saveFirst(id uint64, req *helperpb.SaveFirst) *helperpb.Response {
	if g := cl.guardNow(); g != nil {
		ranges := make([]engine.AddrRange, 0, len(req.Ranges))
		for _, r := range req.Ranges {
			ranges = append(ranges, engine.AddrRange{Addr: r.Address, Size: r.Size})
		}
		if err := g.Save(int(cl.pid), ranges); err != nil && !errors.Is(err, engine.ErrGuardClosed) {
			cl.log.Debug("a write the window held back goes ahead after the window failed", zap.Error(err))
		}
	}
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
}

// endGuard closes cl's window g: the interposer stops holding calls back
// (Unguard, sent beside whatever control exchange is under way: it is
// answered at once), and the window's device memory is freed.
func (cl *client) endGuard(g *engine.Guard, wait time.Duration) {
	if !cl.clearGuard(g) {
		g.Release()
		return
	}
	cl.mu.Lock()
	ctl := cl.ctrl
	cl.mu.Unlock()
	if ctl != nil {
		if _, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Unguard{Unguard: &helperpb.Unguard{}}}, wait); err != nil {
			cl.log.Info("the process was not told that its copy-on-write window is over (it ends with its control connection)", zap.Error(err))
		}
	}
	g.Release()
}

// guardFailed says why a window failed.
func guardFailed(err error, dir string) *stepError {
	if ce := (*engine.ChangedError)(nil); errors.As(err, &ce) {
		return stepFailed(helperpb.ErrorCode_ERROR_CHANGED, "copy-on-write window: %v; no image is made: take it again "+
			"(without --concurrent, the process waits while it is copied)", err)
	}
	return copyFailed(err, dir)
}
