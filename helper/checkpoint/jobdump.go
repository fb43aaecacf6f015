package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gpucr/gpucr/helper/proc"
)

// A job checkpoint: every host's part of a distributed job, dumped at one
// cut. The coordinator (this side) reaches each host over ssh and runs its
// agent there (jobagent.go); the protocol and why it is consistent are in
// docs/job-checkpoint.md. In short:
//
//	prepare  every agent lists its tree's connections to peers outside it;
//	         each must be another part's (seen from its other end), or the
//	         job is refused before anything stops
//	quiesce  every part's GPU processes are brought to one count of peer
//	         sync operations (NCCL's collectives), quiesced and drained,
//	         before any part freezes (jobhold.go)
//	frozen   every agent's CRIU has frozen its tree, none has dumped a file
//	drained  with every tree frozen, every job connection has nothing in
//	         flight (send queues empty at both ends, or holding only bytes
//	         a full receiver's closed window keeps: jobunsent.go)
//	dumped   every part is dumped and left stopped
//	commit   every part is ended (or continued) and its record written
//
// and a failure anywhere before the commit gives every part back, running.

// JobPartSpec is one part of a job: a process tree on a host.
type JobPartSpec struct {
	Target *SSHTarget // the host, reached as `gpucr migrate` reaches its target
	Pid    proc.Pid   // the tree's root there (in that host's pid namespace)
	Dir    string     // the image directory there (absolute, new or empty)
}

// JobCheckpointOptions is a checkpoint of a job.
type JobCheckpointOptions struct {
	Parts []JobPartSpec
	// LeaveRunning: the parts run on after the checkpoint.
	LeaveRunning bool
	// DrainTimeout bounds the wait for the job's connections to have
	// nothing in flight, every part frozen (0: 10 s).
	DrainTimeout time.Duration
	// QuiesceTimeout bounds the run of every GPU process to the job's
	// count of peer sync operations, and its quiesce (0: 30 s).
	QuiesceTimeout time.Duration
	// AgentArgs are the flags of every agent's `gpucr job-agent` (CRIU's
	// options, the helper's socket).
	AgentArgs []string
	// StepTimeout bounds each step's wait for an agent (0: 10 minutes, a
	// CRIU run's deadline).
	StepTimeout time.Duration
	Events      Events
}

// JobResult is a job checkpoint that succeeded.
type JobResult struct {
	ID    string          `json:"id"`
	Parts []JobPartResult `json:"parts"`
	// FrozenSeconds is from the first part's freeze to the last part's
	// dump: the longest any part was stopped before the commit.
	FrozenSeconds float64 `json:"frozen_seconds"`
	// QuiescedSeconds is the time every host's GPU processes took to
	// reach one point and drain, before any part froze.
	QuiescedSeconds float64 `json:"quiesced_seconds"`
	// GPUProcesses were brought to SyncCount operations that wait for a
	// peer (NCCL's collectives) each, on every host.
	GPUProcesses int     `json:"gpu_processes"`
	SyncCount    uint64  `json:"sync_count"`
	Seconds      float64 `json:"seconds"`
}

// JobPartResult is what became of one part.
type JobPartResult struct {
	Host  string          `json:"host"`
	Pid   proc.Pid        `json:"pid"`
	Dir   string          `json:"dir"`
	Conns []JobConn       `json:"conns,omitempty"`
	Dump  json.RawMessage `json:"dump,omitempty"`
	// Running: after a failed checkpoint, whether the part runs on.
	Running bool     `json:"running"`
	Notes   []string `json:"notes,omitempty"`
}

// JobError is a job checkpoint that failed; every part was asked to run
// on, and Parts says which do.
type JobError struct {
	Step  string // "prepare", "hold", "quiesce", "freeze", "drain", "dump", "commit"
	Err   error
	Parts []JobPartResult
}

func (e *JobError) Error() string {
	s := fmt.Sprintf("job checkpoint failed in its %s: %v", e.Step, e.Err)
	for _, p := range e.Parts {
		state := "does not run"
		if p.Running {
			state = "runs on"
		}
		s += fmt.Sprintf("\n  %s: pid %d %s", p.Host, p.Pid, state)
		for _, n := range p.Notes {
			s += "\n    " + n
		}
	}
	return s
}

func (e *JobError) Unwrap() error { return e.Err }

// defaultStepTimeout bounds one step's wait for an agent.
const defaultStepTimeout = 10 * time.Minute

// newJobID names a checkpoint of a job.
func newJobID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// jobRun is the coordinator's state of a checkpoint or a restore.
type jobRun struct {
	agents []*agentConn
	step   time.Duration
	ev     *emitter
}

// open checks every host and starts its agent, before anything stops.
func openJob(ctx context.Context, targets []*SSHTarget, args []string, step time.Duration, ev *emitter) (*jobRun, error) {
	if step <= 0 {
		step = defaultStepTimeout
	}
	j := &jobRun{step: step, ev: ev}
	for _, t := range targets {
		t.Shared = true // the images stay on their hosts
		t.Features = append(t.Features, FeatureJobAgent)
		if err := t.Check(ctx); err != nil {
			j.close(targets)
			return nil, fmt.Errorf("host %s: %w", t.Name(), err)
		}
		a, err := startAgent(ctx, t, args)
		if err != nil {
			j.close(targets)
			return nil, fmt.Errorf("host %s: %w", t.Name(), err)
		}
		j.agents = append(j.agents, a)
	}
	return j, nil
}

// close ends every agent's session and every shared connection.
func (j *jobRun) close(targets []*SSHTarget) {
	for _, a := range j.agents {
		a.close()
	}
	for _, t := range targets {
		_ = t.Close()
	}
}

// all sends each agent its request (req(i)) and then reads each one's
// answer, which must be want: the answers, and the first error.
func (j *jobRun) all(req func(i int) jobMsg, want string) ([]jobMsg, error) {
	var errs []error
	sent := make([]bool, len(j.agents))
	for i, a := range j.agents {
		if err := a.send(req(i)); err != nil {
			errs = append(errs, err)
			continue
		}
		sent[i] = true
	}
	got := make([]jobMsg, len(j.agents))
	for i, a := range j.agents {
		if !sent[i] {
			continue
		}
		m, err := a.expect(want, j.step)
		if err != nil {
			errs = append(errs, err)
		}
		got[i] = m
	}
	return got, errAgents(errs)
}

// CheckpointJob checkpoints every part of a job at one cut.
func CheckpointJob(ctx context.Context, o JobCheckpointOptions) (*JobResult, error) {
	ev := &emitter{out: o.Events, start: time.Now()}
	if len(o.Parts) == 0 {
		return nil, errors.New("a job checkpoint without parts")
	}
	targets := make([]*SSHTarget, len(o.Parts))
	for i, p := range o.Parts {
		targets[i] = p.Target
	}
	j, err := openJob(ctx, targets, o.AgentArgs, o.StepTimeout, ev)
	if err != nil {
		return nil, fmt.Errorf("job checkpoint refused before anything was stopped: %w", err)
	}
	defer j.close(targets)
	// A part whose dump met a TCP connection in flight (connected, not yet
	// accepted when its tree froze) failed the job, every part running on
	// as it was (a dump of one part alone is never taken again: the
	// others are stopped at its cut): the whole job is taken again, as a
	// single-host dump is (dump.go), the same agents from their prepare.
	for attempt := 1; ; attempt++ {
		res, err := j.checkpointOnce(ctx, o, ev)
		if err == nil || attempt > inFlightRetries || !jobInFlight(err) || ctx.Err() != nil {
			return res, err
		}
		ev.emit(Event{Kind: Warning, Text: fmt.Sprintf("a part's TCP connection was in flight (connected, not yet accepted) when its tree froze; "+
			"every part runs on as it was: checkpointing the job again (%d of %d)", attempt, inFlightRetries)})
		select {
		case <-time.After(inFlightPause):
		case <-ctx.Done():
			return nil, err
		}
	}
}

// jobInFlight says whether a job checkpoint failed for a part's connection
// in flight alone, every part running on.
func jobInFlight(err error) bool {
	var je *JobError
	if !errors.As(err, &je) || !errors.Is(err, errPartInFlight) {
		return false
	}
	for _, p := range je.Parts {
		if !p.Running {
			return false
		}
	}
	return len(je.Parts) > 0
}

// checkpointOnce is one attempt of CheckpointJob with the job's agents.
func (j *jobRun) checkpointOnce(ctx context.Context, o JobCheckpointOptions, ev *emitter) (*JobResult, error) {
	res := &JobResult{ID: newJobID(), Parts: make([]JobPartResult, len(o.Parts))}
	for i, p := range o.Parts {
		res.Parts[i] = JobPartResult{Host: p.Target.Name(), Pid: p.Pid, Dir: p.Dir, Running: true}
	}
	// prepare: which connections go where
	prep, err := j.all(func(i int) jobMsg { return jobMsg{Op: opPrepare, Pid: o.Parts[i].Pid} }, evPrepared)
	if err != nil {
		return nil, fmt.Errorf("job checkpoint refused before anything was stopped: %w", err)
	}
	conns := make([][]JobConn, len(prep))
	for i, m := range prep {
		conns[i] = m.Conns
	}
	if err := matchJobConns(res.Parts, conns); err != nil {
		return nil, fmt.Errorf("job checkpoint refused before anything was stopped: %w", err)
	}
	for i := range res.Parts {
		res.Parts[i].Conns = conns[i]
	}
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("%d parts answer; %d connections between them", len(o.Parts), jobConnCount(conns))})
	if err := j.sharedDirs(o.Parts, res.ID); err != nil {
		return nil, fmt.Errorf("job checkpoint refused before anything was stopped: %w", err)
	}
	drain := o.DrainTimeout
	if drain <= 0 {
		drain = defaultDrainTimeout
	}
	// every host's GPU processes at one point before any host freezes
	// (jobhold.go)
	quiesce := o.QuiesceTimeout
	if quiesce <= 0 {
		quiesce = defaultQuiesceTimeout
	}
	t0 := time.Now()
	held, err := j.all(func(int) jobMsg { return jobMsg{Op: opHold} }, evHeld)
	if err != nil {
		return nil, j.abort(res, "hold", err)
	}
	var target uint64
	gpus := 0
	for _, m := range held {
		target = max(target, m.SyncCount)
		gpus += m.GPUProcesses
	}
	if _, err := j.all(func(int) jobMsg {
		return jobMsg{Op: opQuiesce, SyncTarget: target, QuiesceMillis: quiesce.Milliseconds()}
	}, evQuiesced); err != nil {
		return nil, j.abort(res, "quiesce", err)
	}
	res.QuiescedSeconds = time.Since(t0).Seconds()
	res.GPUProcesses, res.SyncCount = gpus, target
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("%d GPU processes at %d operations that wait for a peer, quiesced and drained in %.3f s",
		gpus, target, res.QuiescedSeconds)})
	// dump, held at the barriers
	if _, err := j.all(func(i int) jobMsg {
		return jobMsg{Op: opDump, Dir: o.Parts[i].Dir, Conns: conns[i], LeaveRunning: o.LeaveRunning, DrainMillis: drain.Milliseconds()}
	}, evFrozen); err != nil {
		return nil, j.abort(res, "freeze", err)
	}
	frozen := time.Now()
	ev.emit(Event{Kind: Phase, Text: "every part is frozen; waiting for the job's connections to drain"})
	drained, err := j.all(func(int) jobMsg { return jobMsg{Op: opDrain} }, evDrained)
	if err != nil {
		return nil, j.abort(res, "drain", err)
	}
	ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("drained in %.3f s; every part dumps", time.Since(frozen).Seconds())})
	// the job's record, each part with its connections dumped with unsent
	// bytes (a receiver's buffer was full), which the restored sender
	// sends on: said, per part, and refused where no restore could order
	// the parts (jobunsent.go)
	rec := JobRecord{ID: res.ID}
	fullNotes := make([][]string, len(drained))
	for i, p := range res.Parts {
		rec.Parts = append(rec.Parts, JobRecordPart{Host: p.Host, Pid: p.Pid, Dir: p.Dir, Conns: p.Conns, Unsent: drained[i].Unsent})
		for _, c := range drained[i].Unsent {
			n := fmt.Sprintf("%s, dumped with bytes never sent in its queue: its receiver's buffer was full, its window closed", c)
			fullNotes[i] = append(fullNotes[i], n)
			ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("%s: the job's connection %s", p.Host, n)})
		}
	}
	if err := restorableOrder(rec.Parts); err != nil {
		return nil, j.abort(res, "drain", err)
	}
	dumped, err := j.all(func(int) jobMsg { return jobMsg{Op: opGo} }, evDumped)
	if err != nil {
		return nil, j.abort(res, "dump", err)
	}
	res.FrozenSeconds = time.Since(frozen).Seconds()
	for i, m := range dumped {
		res.Parts[i].Dump = m.Result
	}
	// commit: the images are complete everywhere; from here on no part
	// goes back (a commit that fails on a host is reported, the images
	// stand).
	done, err := j.all(func(i int) jobMsg {
		r := rec
		r.Part = i
		return jobMsg{Op: opCommit, Record: &r}
	}, evDone)
	for i, m := range done {
		res.Parts[i].Notes = append(fullNotes[i], m.Notes...)
		res.Parts[i].Running = o.LeaveRunning
	}
	if err != nil {
		return nil, &JobError{Step: "commit", Err: err, Parts: res.Parts}
	}
	res.Seconds = time.Since(ev.start).Seconds()
	return res, nil
}

// abort asks every agent to give its part back and reads what each did.
func (j *jobRun) abort(res *JobResult, step string, cause error) error {
	je := &JobError{Step: step, Err: cause}
	for i, a := range j.agents {
		p := res.Parts[i]
		if err := a.send(jobMsg{Op: opAbort}); err != nil {
			// its session is gone: the agent gives the part back itself
			p.Running = false
			p.Notes = append(p.Notes, err.Error())
			je.Parts = append(je.Parts, p)
			continue
		}
		for {
			m, err := a.next(j.step)
			if err != nil && m.Event != evError {
				p.Running = false
				p.Notes = append(p.Notes, "no answer to the abort: "+err.Error())
				break
			}
			if m.Event == evAborted {
				p.Running = m.Running
				p.Notes = append(p.Notes, m.Notes...)
				break
			}
			// an event of the step it was in (its failure, or a late
			// frozen or drained): the abort's answer comes after it
		}
		je.Parts = append(je.Parts, p)
	}
	return je
}

// matchJobConns makes sure each part's connection to a peer outside its
// tree is another part's connection, seen from its other end.
func matchJobConns(parts []JobPartResult, conns [][]JobConn) error {
	var stray []string
	for i, cs := range conns {
		for _, c := range cs {
			found := false
			for k, other := range conns {
				if k == i {
					continue
				}
				for _, oc := range other {
					if oc == c.Peer() {
						found = true
					}
				}
			}
			if !found {
				stray = append(stray, fmt.Sprintf("%s (pid %d): %s", parts[i].Host, parts[i].Pid, c))
			}
		}
	}
	if len(stray) > 0 {
		return fmt.Errorf("TCP connections to peers in no part of the job: %s; checkpoint a job whose every connection is between its parts, "+
			"or name the host of the missing part", namedList(stray))
	}
	return nil
}

// jobConnCount counts the connections between parts (each is seen twice).
func jobConnCount(conns [][]JobConn) int {
	n := 0
	for _, cs := range conns {
		n += len(cs)
	}
	return n / 2
}

// sharedDirs refuses parts that name one image directory on a file system
// their hosts share (jobmarks.go); nothing to do where every part names a
// path of its own.
func (j *jobRun) sharedDirs(parts []JobPartSpec, id string) error {
	same := false
	for i := range parts {
		for k := range i {
			same = same || parts[i].Dir == parts[k].Dir
		}
	}
	if !same {
		return nil
	}
	if _, err := j.all(func(i int) jobMsg { return jobMsg{Op: opMarkDir, Dir: parts[i].Dir, Token: id, Part: i} }, evMarked); err != nil {
		_, _ = j.all(func(int) jobMsg { return jobMsg{Op: opFindMarks} }, evMarks) // removes the marks left
		return err
	}
	found, err := j.all(func(int) jobMsg { return jobMsg{Op: opFindMarks} }, evMarks)
	if err != nil {
		return err
	}
	// Each agent removes its mark once it has looked: of two that share,
	// the first to look sees the other's mark, the other may not.
	var pairs []string
	seen := map[[2]int]bool{}
	for i, m := range found {
		for _, k := range m.Shared {
			key := [2]int{min(i, k), max(i, k)}
			if k >= 0 && k < len(parts) && k != i && !seen[key] {
				seen[key] = true
				pairs = append(pairs, fmt.Sprintf("%s and %s", parts[key[0]].Target.Name(), parts[key[1]].Target.Name()))
			}
		}
	}
	if len(pairs) > 0 {
		return fmt.Errorf("%s share the file system of %s, which every part names: their images would mix there; give each part its own directory (--part HOST=PID:DIR)",
			namedList(pairs), parts[0].Dir)
	}
	return nil
}
