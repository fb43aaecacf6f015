package checkpoint

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
)

// RestoreOptions is a restore of a whole-process image.
type RestoreOptions struct {
	Dir    string // the image directory (absolute)
	CRIU   CRIU
	Env    Environment
	Events Events
	// LazyPages: the tree runs before its host memory is read back; CRIU's
	// lazy-pages daemon serves each page when the tree touches it, and the
	// rest in the background (lazypages.go). Restore returns once every
	// page is in.
	LazyPages bool
	// DeviceMap puts the image's GPUs onto other GPUs of this machine:
	// "OLD=NEW[,OLD=NEW...]", each side a GPU UUID (or a unique start of
	// one) or an ordinal (OLD the image's, NEW the helper's). GPUs it does
	// not name go to the same GPU where it is here and has room, else to a
	// free GPU of the same model. The helper checks it.
	DeviceMap string
	// OnDemand lets the restored processes run before their GPU data is
	// all loaded: the interposer holds each call that may touch memory not
	// loaded yet until it is, and the rest loads behind. The restore
	// returns once it is all in (a load that fails then ends the processes
	// and fails the restore).
	OnDemand bool
	// WaitClosedPorts waits for the connections closed on the image's
	// listening TCP ports to end their TIME_WAIT (up to a minute) instead
	// of ending them.
	WaitClosedPorts bool
	// Restored (a part of a job) runs when CRIU has made every process and
	// socket of the tree and before any socket leaves repair mode or any
	// process runs: the job's barrier (jobrestore.go). The restore goes on
	// when it returns; on its error CRIU kills what it restored.
	Restored func() error
}

// RestoreResult is a restore that succeeded: every process runs, each GPU
// process with its GPU memory back.
type RestoreResult struct {
	Pid            proc.Pid     `json:"pid"` // the root of the restored tree
	ImagesDir      string       `json:"images_dir"`
	Seconds        float64      `json:"seconds"`
	GPU            *GPUCopy     `json:"gpu"`
	GPUProcesses   []GPUProcess `json:"gpu_processes"`
	PluginDir      string       `json:"plugin_dir"`
	PluginMessages []string     `json:"plugin_messages"`
	// Phases: "checks" (before CRIU), CRIU's (criu-start, criu-restore)
	// and "gpu-wait" (until every GPU process has its memory back).
	Phases []Step `json:"phases"`
	// DumpOptions are the options of the dump (its record in the image
	// directory) that the restore repeated ("--shell-job"), as CRIU
	// needs them repeated.
	DumpOptions []string `json:"dump_options,omitempty"`
	// Ready says when, since the command began, the restored tree could do
	// what; CRIU is CRIU's own account of its part (nil: none written).
	Ready RestoreReady      `json:"ready"`
	CRIU  *CRIURestoreStats `json:"criu,omitempty"`
}

// RestoreReady is when (seconds since the restore command began) the
// restored tree could run its first instruction (CRIU let it go), launch
// on the GPU (every GPU process has its memory back and its gate open),
// and had all its GPU data resident (the image's load ended; 0: no GPU
// data). A process whose threads use only the CPU runs from the first.
type RestoreReady struct {
	FirstInstruction float64 `json:"first_instruction_seconds"`
	GPULaunch        float64 `json:"gpu_launch_seconds"`
	GPUResident      float64 `json:"gpu_resident_seconds"`
	// HostResident (a lazy restore): when every page of host memory was in.
	HostResident float64 `json:"host_resident_seconds,omitempty"`
}

// Restore restores the tree imaged in o.Dir. Before CRIU starts it checks
// the directory, that every pid of the image is free (waiting briefly for
// zombies to be reaped) and that every TCP port the image listens on can be
// bound again (ending the connections closed on them that wait out their
// TIME_WAIT, or waiting up to a minute for them: ports.go), and it makes
// the directories of the image's unix sockets that were removed since
// (sockdirs.go) and CRIU's links to files the processes had unlinked,
// from the image's copies (linkremap.go); after CRIU, that each GPU
// process has its GPU memory back. Cancelling ctx stops CRIU and kills
// what it had restored.
func Restore(ctx context.Context, o RestoreOptions) (*RestoreResult, error) {
	ev := &emitter{out: o.Events, start: time.Now()}
	if !filepath.IsAbs(o.Dir) {
		return nil, fmt.Errorf("image directory %q: must be absolute", o.Dir)
	}
	if err := o.CRIU.check(); err != nil {
		return nil, err
	}
	dir := o.Dir
	// The image's lock first, held until the restore ends: a second
	// restore of the same image at the same time would load its GPU memory
	// again and fail on the pids the first one takes back, and make the
	// first one fail with it.
	lock, err := lockImageDir(dir)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := restoreDir(dir); err != nil {
		return nil, err
	}
	applied, err := repeatDumpOptions(dir, &o.CRIU, ev)
	if err != nil {
		return nil, err
	}
	pids, err := restorePidsFree(ctx, dir)
	if err != nil {
		return nil, err
	}
	files, err := imageFiles(dir)
	if err != nil {
		return nil, err
	}
	if err := restorePortsFree(ctx, dir, files, o.WaitClosedPorts, ev); err != nil {
		return nil, err
	}
	if err := remakeSocketDirs(dir, files, ev); err != nil {
		return nil, err
	}
	if err := remakeLinkRemaps(dir, files, ev); err != nil {
		return nil, err
	}
	_, statErr := os.Stat(filepath.Join(dir, image.SubDir))
	if statErr == nil && o.CRIU.PluginDir == "" {
		return nil, fmt.Errorf("restore refused: %s holds GPU state (gpucr/), and %s", dir, o.CRIU.NoPlugin)
	}
	if o.LazyPages && statErr == nil && !servedOnly(dir) {
		if err := lazyPagesPay(); err != nil {
			return nil, err
		}
	}
	checked := time.Now()
	r, err := run(ctx, job{dir: dir, criu: o.CRIU, env: o.Env, what: "criu restore from " + dir, ev: ev, lazy: o.LazyPages, deviceMap: o.DeviceMap, onDemand: o.OnDemand,
		imagePids: pids, postRestore: o.Restored, fill: func(opts *rpc.CriuOpts) { opts.RstSibling = proto.Bool(true) }})
	_, statErr = os.Stat(image.ManifestPath(dir))
	gpuState := statErr == nil
	if err != nil {
		// CRIU also fails when a restored process that cannot get its GPU
		// memory back is stopped while CRIU still detaches from it: the
		// helper knows why.
		if gpuState {
			if _, werr := waitGPURestored(o.Env.Socket, dir, 3*time.Second); werr != nil && !strings.Contains(werr.Error(), "no restore from") {
				return nil, fmt.Errorf("%w; %v", err, werr)
			}
		}
		return nil, err
	}
	if r.lazyErr != nil {
		// The tree runs, but part of its memory never came: it would fault
		// on it forever.
		return nil, fmt.Errorf("restore from %s: the tree runs, but its host memory did not all come in: %w", dir, r.lazyErr)
	}
	// CRIU is done; with GPU state, each process must also have its GPU
	// memory back before the tree is said to run.
	procs := []GPUProcess{}
	waited := time.Now()
	ready := RestoreReady{FirstInstruction: r.end.Sub(ev.start).Seconds()}
	if !r.lazyDone.IsZero() {
		ready.HostResident = r.lazyDone.Sub(ev.start).Seconds()
	}
	if gpuState {
		ev.emit(Event{Kind: Phase, Text: "waiting for the GPU memory of the restored processes"})
		if procs, err = waitGPURestored(o.Env.Socket, dir, restoredWait); err != nil {
			return nil, fmt.Errorf("restore from %s: CRIU restored the processes, but %w", dir, err)
		}
	}
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("pid %d runs", r.pid), Pid: r.pid})
	ready.GPULaunch = time.Since(ev.start).Seconds()
	if o.OnDemand && gpuState {
		// The processes run; their data is still coming in.
		t, err := awaitLoaded(ctx, o.Env.Socket, dir, checked, loadedWait)
		if err != nil {
			return nil, fmt.Errorf("restore from %s: the processes ran before their GPU data was all loaded, and %w", dir, err)
		}
		if t != nil {
			r.gpu = t
		}
		// A process may also have ended while its data loaded.
		if procs, err = waitGPURestored(o.Env.Socket, dir, restoredWait); err != nil {
			return nil, fmt.Errorf("restore from %s: the processes ran before their GPU data was all loaded, and %w", dir, err)
		}
	}
	if t := r.gpu; t != nil && t.Finished && t.FinishedUnixUs != 0 {
		ready.GPUResident = max(0, time.UnixMicro(t.FinishedUnixUs).Sub(ev.start).Seconds())
	}
	phases := append(append([]Step{{"checks", checked.Sub(ev.start).Seconds()}}, r.phases...), Step{"gpu-wait", time.Since(waited).Seconds()})
	return &RestoreResult{Pid: r.pid, ImagesDir: dir, Seconds: time.Since(ev.start).Seconds(), GPU: gpuCopyOf(r.gpu),
		GPUProcesses: nonNil(procs), PluginDir: o.CRIU.PluginDir, PluginMessages: nonNil(r.plugin), Phases: phases,
		Ready: ready, CRIU: restoreStats(dir, checked.Add(-time.Second)), DumpOptions: applied}, nil
}

// repeatDumpOptions turns on in c the options the image's dump ran CRIU
// with that its restore must repeat (dumprecord.go), saying so, and warns
// of a record it does not read and of what it does not repeat.
func repeatDumpOptions(dir string, c *CRIU, ev *emitter) ([]string, error) {
	rec, why, err := readDumpRecord(dir)
	if err != nil {
		return nil, err
	}
	if why != "" {
		ev.emit(Event{Kind: Warning, Text: "the record of how the image was dumped is not used: " + why})
		return nil, nil
	}
	if rec == nil {
		return nil, nil
	}
	applied := rec.applyTo(c)
	if len(applied) > 0 {
		ev.emit(Event{Kind: Note, Text: fmt.Sprintf("the image was dumped with %s: restoring with it too", strings.Join(applied, " "))})
	}
	for _, n := range rec.notes(*c) {
		ev.emit(Event{Kind: Warning, Text: n})
	}
	return applied, nil
}
