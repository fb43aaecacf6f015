package daemon

// Restores that load on demand: the restored processes run while their GPU
// data loads. Each gets a loading window with its Resume (the interposer
// holds every call that may touch memory not loaded yet and asks LoadFirst
// for it); the window ends with Unguard once everything is in. A load that
// fails ends the processes still waiting on it: none may run on with
// memory that never came.

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// demandLoad is an on-demand load as one restored process sees it.
type demandLoad struct {
	l    *engine.Loading
	mine []int     // this process's regions of the load
	out  *outcomes // where its restore's result went
}

// overlapping is the process's regions that the ranges touch (all of them,
// for all).
func (d *demandLoad) overlapping(ranges []*helperpb.AddressRange, all bool) []int {
	if all {
		return d.mine
	}
	var idx []int
	for _, i := range d.mine {
		r := d.l.Region(i)
		for _, a := range ranges {
			if a.Size > 0 && a.Address < r.Address+r.Size && r.Address < a.Address+a.Size {
				idx = append(idx, i)
				break
			}
		}
	}
	return idx
}

// window is the Resume's loading window: every region of the process, all
// chunks pending of those not loaded yet (the loaded ones are there too:
// the interposer records the order the process first touches each region
// in, for the next restore's load order).
func (d *demandLoad) window(res *helperpb.Resume) {
	chunk := d.l.ChunkSize()
	res.GuardChunk = chunk
	res.Loading = true
	for _, i := range d.mine {
		r := d.l.Region(i)
		pending := !d.l.Loaded(i)
		res.Guard = append(res.Guard, guardRegion(r, int((r.Size+chunk-1)/chunk), func(int) bool { return pending }))
	}
}

// demandNow is cl's on-demand load, if one is still open.
func (cl *client) demandNow() *demandLoad {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.demand
}

// loadFirst serves a LoadFirst of cl: the ranges' regions are loaded first,
// and the answer comes once they are in, or with the load's error.
func (cl *client) loadFirst(id uint64, req *helperpb.LoadFirst) *helperpb.Response {
	d := cl.demandNow()
	if d == nil {
		return okResp(id) // all in: the window is closing
	}
	if err := d.l.Need(d.overlapping(req.Ranges, req.All)); err != nil {
		return errResp(id, loadErrCode(err), "loading its GPU image: %v", err)
	}
	return okResp(id)
}

// watch waits for cl's on-demand load d to end: the window is closed if it
// loaded, and the process ended if it failed; wait bounds each control call.
func (d *demandLoad) watch(cl *client, wait time.Duration) {
	<-d.l.Done()
	if err := d.l.Err(); err != nil {
		d.failed(cl, err, wait)
		return
	}
	if err := cl.withControl(wait, func(ctl *control) error { return d.close(cl, ctl, wait) }); err != nil &&
		!errors.Is(err, errNoControl) {
		cl.log.Warn("the loading window could not be closed (calls still ask the helper first, and it answers at once)", zap.Error(err))
	}
}

// close ends cl's loading window (once): everything is in.
func (d *demandLoad) close(cl *client, ctl *control, wait time.Duration) error {
	cl.mu.Lock()
	if cl.demand != d {
		cl.mu.Unlock()
		return nil
	}
	cl.demand = nil
	cl.mu.Unlock()
	_, err := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Unguard{Unguard: &helperpb.Unguard{}}}, wait)
	if err == nil {
		cl.log.Info("restored process has all its GPU data; loading window closed")
	}
	return err
}

// failed ends cl, whose on-demand load d failed: some of its memory never
// came, and it must not run on with what is there instead. Its calls that
// wait for that memory get the error too (and end it).
func (d *demandLoad) failed(cl *client, err error, wait time.Duration) {
	reason := "its GPU image failed to load after it began to run: " + err.Error()
	cl.log.Error("on-demand load failed; ending the restored process", zap.Error(err))
	d.out.fail(cl, reason)
	cerr := cl.withControl(wait, func(ctl *control) error {
		_, aerr := controlCall(ctl, &helperpb.Request{Body: &helperpb.Request_Abort{Abort: &helperpb.Abort{Reason: reason}}}, 5*time.Second)
		return aerr
	})
	if cerr != nil {
		// No control connection: kill it (the interposer would otherwise
		// end it only at its next call that touches the missing memory).
		if perr := cl.onLive(func(pid int) error { return unix.Kill(pid, unix.SIGKILL) }); perr != nil {
			cl.log.Warn("cannot end the process whose GPU image failed to load", zap.Error(fmt.Errorf("%w; %w", cerr, perr)))
		}
	}
}

// waitDemand waits (at most limit) for cl's on-demand load and closes its
// window, before a checkpoint: an image of a process whose memory is still
// loading would not hold what it computes with. ctl is held by the caller;
// wait bounds the control call.
func (cl *client) waitDemand(ctl *control, limit, wait time.Duration) error {
	d := cl.demandNow()
	if d == nil {
		return nil
	}
	select {
	case <-d.l.Done():
	case <-time.After(limit):
		return fmt.Errorf("its GPU image is still loading after %v (a restore on demand)", limit)
	}
	if err := d.l.Err(); err != nil {
		return fmt.Errorf("its GPU image failed to load: %w", err)
	}
	return d.close(cl, ctl, wait)
}
