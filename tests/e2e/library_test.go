package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/proc"
)

// eventLog collects a checkpoint's or a restore's events.
type eventLog struct {
	mu     sync.Mutex
	events []checkpoint.Event
	on     func(checkpoint.Event)
}

func (l *eventLog) add(ev checkpoint.Event) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	on := l.on
	l.mu.Unlock()
	if on != nil {
		on(ev)
	}
}

func (l *eventLog) phases() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events {
		if e.Kind == checkpoint.Phase {
			out = append(out, e.Text)
		}
	}
	return out
}

// lastProgress is the last GPU copy the events reported (nil: none).
func (l *eventLog) lastProgress() *checkpoint.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.events) - 1; i >= 0; i-- {
		if l.events[i].Kind == checkpoint.Progress {
			return &l.events[i]
		}
	}
	return nil
}

// libraryOptions are the CRIU options and environment a program that uses
// package checkpoint passes: this build's plugin, the CRIU on PATH.
func libraryOptions(t *testing.T, h *helperProc) (checkpoint.CRIU, checkpoint.Environment) {
	t.Helper()
	plugins, err := filepath.Abs(filepath.Join(buildDir(t), "lib", "criu"))
	if err != nil {
		t.Fatal(err)
	}
	return checkpoint.CRIU{Binary: needTool(t, "criu"), PluginDir: plugins, Timeout: 2 * time.Minute},
		checkpoint.Environment{Socket: h.socket, Path: os.Getenv("PATH"), TempDir: t.TempDir()}
}

// TestLibraryDumpRestore: package checkpoint, called as a program would
// call it, checkpoints a GPU process and restores it: the events tell the
// phases in order and the GPU copy, the results name the GPU process, and
// every heartbeat after the restore equals an uninterrupted run's.
func TestLibraryDumpRestore(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	criu, cenv := libraryOptions(t, h)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	img := filepath.Join(dir, "img")
	var dumpEvents eventLog
	res, err := checkpoint.Dump(context.Background(), checkpoint.DumpOptions{Pid: proc.Pid(a.pid), Dir: img, CRIU: criu, Env: cenv,
		Events: dumpEvents.add})
	if err != nil {
		t.Fatalf("Dump: %v", err)
	}
	if ph := dumpEvents.phases(); len(ph) != 2 || !strings.HasPrefix(ph[0], "dumping") || ph[1] != "dumped" {
		t.Errorf("dump phases %q", ph)
	}
	if p := dumpEvents.lastProgress(); p == nil || !p.Transfer.Finished || p.Transfer.BytesDone < 16<<20 {
		t.Errorf("dump progress: last %+v, want a finished copy of at least 16 MiB", p)
	}
	if !res.GPUState || len(res.GPUProcesses) != 1 || res.GPUProcesses[0].Pid != proc.Pid(a.pid) || res.GPU == nil ||
		res.GPU.Bytes < 16<<20 || !slices.Contains(res.Tree, proc.Pid(a.pid)) || res.PidsReleasedAfterSeconds == nil {
		t.Errorf("dump result %+v", res)
	}
	// the steps: CRIU's, and the helper's of the GPU process (its stall)
	if names := stepNames(res.Phases); !slices.Equal(names, []string{"checks", "criu-start", "criu-dump", "criu-finish", "pids-released"}) {
		t.Errorf("dump steps %q", names)
	}
	if g := stepNames(res.GPUProcesses[0].Phases); !slices.Contains(g, "quiesce") || !slices.Contains(g, "copy") || !slices.Contains(g, "drop") {
		t.Errorf("the helper's steps of pid %d: %q", a.pid, g)
	}
	a.reap(30 * time.Second)
	before := a.lastIter()
	var restoreEvents eventLog
	rres, err := checkpoint.Restore(context.Background(), checkpoint.RestoreOptions{Dir: img, CRIU: criu, Env: cenv, Events: restoreEvents.add})
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	a.pid = int(rres.Pid)
	if ph := restoreEvents.phases(); len(ph) < 3 || !strings.HasPrefix(ph[0], "restoring") || ph[len(ph)-1] != "pid "+strconv.Itoa(a.pid)+" runs" {
		t.Errorf("restore phases %q", ph)
	}
	if names := stepNames(rres.Phases); !slices.Equal(names, []string{"checks", "criu-start", "criu-restore", "gpu-wait"}) {
		t.Errorf("restore steps %q", names)
	}
	if len(rres.GPUProcesses) != 1 || rres.GPUProcesses[0].State != "running" || rres.GPUProcesses[0].ImagePid != res.Pid {
		t.Errorf("restore result %+v", rres)
	}
	a.waitIter(before+10, time.Minute)
	stopAndCompare(t, a, env, []string{"--mib", "16", "--interval-ms", "20"}, before)
}

// TestLibraryDumpCancelled: cancelling the context of a dump once CRIU has
// begun stops CRIU; the process runs on with its GPU, the failure says it
// was cancelled, and the image directory keeps no partial GPU image.
func TestLibraryDumpCancelled(t *testing.T) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	criu, cenv := libraryOptions(t, h)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "64", "--interval-ms", "20")
	a.waitIter(10, time.Minute)
	img := filepath.Join(dir, "img")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := eventLog{on: func(ev checkpoint.Event) {
		if ev.Kind == checkpoint.Phase && strings.HasPrefix(ev.Text, "dumping") {
			cancel()
		}
	}}
	_, err := checkpoint.Dump(ctx, checkpoint.DumpOptions{Pid: proc.Pid(a.pid), Dir: img, CRIU: criu, Env: cenv, Events: events.add})
	ended := time.Now()
	var f *checkpoint.Failure
	if !errors.As(err, &f) || !f.Cancelled || !strings.Contains(f.Summary, "interrupted") {
		t.Fatalf("Dump after cancel: %v (%+v)", err, f)
	}
	if _, serr := os.Stat(filepath.Join(img, "gpucr")); serr == nil {
		t.Errorf("a partial GPU image stayed in %s: %v", img, f)
	}
	if _, serr := os.Stat(filepath.Join(img, "inventory.img")); serr == nil {
		t.Errorf("CRIU's images of a cancelled dump were published in %s", img)
	}
	runsAgainWithin(t, a, ended, a.lastIter(), 10*time.Second)
	if err := syscall.Kill(a.pid, 0); err != nil {
		t.Errorf("pid %d: %v", a.pid, err)
	}
}

func stepNames(steps []checkpoint.Step) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Name)
	}
	return out
}
