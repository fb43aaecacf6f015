// Package fault names the failures gpucr injects on purpose, for the tests
// that check what a failure at one step leaves behind (GPUCR_FAULT in the
// environment of `gpucr helper` or a job agent). A name that is not one of
// them is refused where it is read, so that a test with a misspelt fault
// fails at once instead of passing without its failure.
package fault

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Name is one injectable failure.
type Name string

// The helper's faults. Those that name a checkpoint step may be limited to
// the helper's N-th checkpoint ("STEP@N": the second process of a dumped
// tree, say).
const (
	// DriverLock and DriverCheckpoint fail that step of a checkpoint:
	// tests check that every step before it is undone.
	DriverLock       Name = "driver-lock"
	DriverCheckpoint Name = "driver-checkpoint"
	// StallCopy holds a checkpoint a minute before its copy, or until its
	// requester closes the connection (tests kill the helper or CRIU there).
	StallCopy Name = "stall-copy"
	// StallDropped is the same once the process dropped its memory (its
	// image part sealed, the image not committed).
	StallDropped Name = "stall-dropped"
	// StallBackground holds a concurrent checkpoint's background copy back
	// 5 s (the process runs on meanwhile).
	StallBackground Name = "stall-background"
	// SlowLoad holds each chunk of a restore's load back 200 ms: a restore
	// on demand runs long before its data is in.
	SlowLoad Name = "slow-load"
	// StallReattach makes the reply to a reattaching process wait until it
	// closes its connection (tests kill it there).
	StallReattach Name = "stall-reattach"
	// NoGroupHold quiesces processes that share GPU memory one by one,
	// without first bringing them to a common point (the checkpoint then
	// fails, bounded, and the processes run on).
	NoGroupHold Name = "no-group-hold"
)

// The job agent's faults.
const (
	// JobAfterDump fails the part once it is dumped and stopped, as a dump
	// that fails late would, after the other parts may have dumped too.
	JobAfterDump Name = "job-after-dump"
	// JobInFlightOnce fails the agent's first dump as one that met a
	// connection in flight.
	JobInFlightOnce Name = "job-in-flight-once"
	// JobAfterRestore fails the part once restored.
	JobAfterRestore Name = "job-after-restore"
)

// Helper lists the faults `gpucr helper` takes; Job those a job agent takes.
var (
	Helper = []Name{DriverLock, DriverCheckpoint, StallCopy, StallDropped, StallBackground, SlowLoad, StallReattach, NoGroupHold}
	Job    = []Name{JobAfterDump, JobInFlightOnce, JobAfterRestore}
	// steps are the helper's faults that count checkpoints (STEP@N).
	steps = []Name{DriverLock, DriverCheckpoint, StallCopy, StallDropped, StallBackground}
)

// Injected is the fault a process was started with: none (the zero
// value), or a name, for a checkpoint step perhaps limited to one
// checkpoint.
type Injected struct {
	Name Name
	Nth  uint64 // STEP@N: only the N-th checkpoint (1 the first); 0 every one
}

// Parse reads s (GPUCR_FAULT's value) as one of known; "" is none.
func Parse(s string, known []Name) (Injected, error) {
	if s == "" {
		return Injected{}, nil
	}
	name, nth, counted := strings.Cut(s, "@")
	f := Injected{Name: Name(name)}
	if !slices.Contains(known, f.Name) {
		return Injected{}, fmt.Errorf("GPUCR_FAULT=%s: no such fault here (these are: %s)", s, list(known))
	}
	if counted {
		n, err := strconv.ParseUint(nth, 10, 64)
		if err != nil || n == 0 || !slices.Contains(steps, f.Name) {
			return Injected{}, fmt.Errorf("GPUCR_FAULT=%s: @N (N from 1) limits only a checkpoint step to one checkpoint (%s)", s, list(steps))
		}
		f.Nth = n
	}
	return f, nil
}

// Is says the fault is name.
func (f Injected) Is(name Name) bool { return f.Name == name }

// At says the fault is name, for the helper's nth checkpoint.
func (f Injected) At(name Name, nth uint64) bool {
	return f.Name == name && (f.Nth == 0 || f.Nth == nth)
}

// String is the fault as GPUCR_FAULT gives it.
func (f Injected) String() string {
	if f.Nth != 0 {
		return fmt.Sprintf("%s@%d", f.Name, f.Nth)
	}
	return string(f.Name)
}

func list(names []Name) string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return strings.Join(s, ", ")
}
