package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// A job restore: every part of one job checkpoint, restored on its host, so
// that no part's socket leaves repair mode before every part's socket
// exists: a segment (the window probe a socket sends as it leaves repair
// mode, a retransmission) that reached a host where the connection's other
// end is not there yet would be answered with a reset, and the connection
// lost. Every agent's CRIU holds at its post-restore notice (every process
// and socket made, sockets in repair mode, nothing running) until all are
// there; then all go on (docs/job-checkpoint.md).

// JobRestorePart is a part to restore: its host and its image directory
// there.
type JobRestorePart struct {
	Target *SSHTarget
	Dir    string
}

// JobRestoreOptions is a restore of a job.
type JobRestoreOptions struct {
	Parts       []JobRestorePart
	AgentArgs   []string
	StepTimeout time.Duration
	Events      Events
}

// JobRestoreResult is a job restore that succeeded.
type JobRestoreResult struct {
	ID    string            `json:"id"`
	Parts []JobRestoredPart `json:"parts"`
	// HeldSeconds is from the first part made (its sockets in repair
	// mode) to the go: what the barrier added to the restore.
	HeldSeconds float64 `json:"held_seconds"`
	Seconds     float64 `json:"seconds"`
}

// JobRestoredPart is one restored part.
type JobRestoredPart struct {
	Host    string          `json:"host"`
	Dir     string          `json:"dir"`
	Restore json.RawMessage `json:"restore"`
}

// RestoreJob restores every part of a job checkpoint.
func RestoreJob(ctx context.Context, o JobRestoreOptions) (*JobRestoreResult, error) {
	ev := &emitter{out: o.Events, start: time.Now()}
	if len(o.Parts) == 0 {
		return nil, errors.New("a job restore without parts")
	}
	targets := make([]*SSHTarget, len(o.Parts))
	for i, p := range o.Parts {
		targets[i] = p.Target
	}
	j, err := openJob(ctx, targets, o.AgentArgs, o.StepTimeout, ev)
	if err != nil {
		return nil, fmt.Errorf("job restore refused: %w", err)
	}
	defer j.close(targets)
	ready, err := j.all(func(i int) jobMsg { return jobMsg{Op: opRestorePrepare, Dir: o.Parts[i].Dir} }, evReady)
	if err != nil {
		return nil, fmt.Errorf("job restore refused: %w", err)
	}
	if err := sameCheckpoint(o.Parts, ready); err != nil {
		return nil, fmt.Errorf("job restore refused: %w", err)
	}
	res := &JobRestoreResult{ID: ready[0].Record.ID}
	records := make([]*JobRecord, len(ready))
	for i, m := range ready {
		records[i] = m.Record
	}
	// the parts that send bytes left unsent after every other is made
	// (jobunsent.go)
	var first time.Time
	early, late := restorePhases(records)
	for pi, phase := range [][]int{early, late} {
		for _, i := range phase {
			if err := j.agents[i].send(jobMsg{Op: opRestore, Dir: o.Parts[i].Dir}); err != nil {
				return nil, j.abortRestore("restore", err)
			}
		}
		for _, i := range phase {
			if _, err := j.agents[i].expect(evMade, j.step); err != nil {
				return nil, j.abortRestore("restore", err)
			}
			if first.IsZero() {
				first = time.Now()
			}
		}
		if pi == 0 && len(late) > 0 {
			ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("%d parts made first; now the %d whose connections hold bytes never sent", len(early), len(late))})
		}
	}
	ev.emit(Event{Kind: Phase, Text: "every part is made, its sockets in repair mode; every part goes on"})
	res.HeldSeconds = time.Since(first).Seconds()
	restored, err := j.all(func(int) jobMsg { return jobMsg{Op: opGo} }, evRestored)
	for i, m := range restored {
		res.Parts = append(res.Parts, JobRestoredPart{Host: o.Parts[i].Target.Name(), Dir: o.Parts[i].Dir, Restore: m.Result})
	}
	if err != nil {
		// Past the go a part failed (its GPU memory did not come back):
		// the others would wait for it for good. Every part is ended, so
		// that no half of the job runs and the same restore can be run
		// again (the images stay).
		return nil, j.endRestored(err)
	}
	res.Seconds = time.Since(ev.start).Seconds()
	return res, nil
}

// sameCheckpoint makes sure the parts are all the parts of one checkpoint,
// each once.
func sameCheckpoint(parts []JobRestorePart, ready []jobMsg) error {
	id := ready[0].Record.ID
	var seen []int
	for i, m := range ready {
		r := m.Record
		if r == nil {
			return fmt.Errorf("%s:%s answered no job record", parts[i].Target.Name(), parts[i].Dir)
		}
		if r.ID != id {
			return fmt.Errorf("%s:%s is a part of checkpoint %s, %s:%s of checkpoint %s",
				parts[i].Target.Name(), parts[i].Dir, r.ID, parts[0].Target.Name(), parts[0].Dir, id)
		}
		if slices.Contains(seen, r.Part) {
			return fmt.Errorf("%s:%s is part %d of checkpoint %s again", parts[i].Target.Name(), parts[i].Dir, r.Part, id)
		}
		seen = append(seen, r.Part)
		if len(r.Parts) != len(parts) {
			var missing []string
			for k, p := range r.Parts {
				if !slices.ContainsFunc(ready, func(m jobMsg) bool { return m.Record != nil && m.Record.Part == k }) {
					missing = append(missing, fmt.Sprintf("part %d at %s:%s", k, p.Host, p.Dir))
				}
			}
			return fmt.Errorf("checkpoint %s has %d parts, %d were named; missing: %s", id, len(r.Parts), len(parts), namedList(missing))
		}
	}
	return nil
}

// abortRestore tells every agent to give up: one held at its barrier has
// CRIU kill what it made; one that failed has nothing running.
func (j *jobRun) abortRestore(step string, cause error) error {
	je := &JobError{Step: step, Err: cause}
	for _, a := range j.agents {
		p := JobPartResult{Host: a.host}
		if err := a.send(jobMsg{Op: opAbort}); err != nil {
			p.Notes = append(p.Notes, err.Error())
			je.Parts = append(je.Parts, p)
			continue
		}
		for {
			m, err := a.next(j.step)
			if err != nil && m.Event != evError {
				p.Notes = append(p.Notes, "no answer to the abort: "+err.Error())
				break
			}
			if m.Event == evAborted {
				p.Running = m.Running
				break
			}
		}
		je.Parts = append(je.Parts, p)
	}
	return &jobRestoreError{je}
}

// jobRestoreError is a job restore that failed before any part ran: no
// part runs, every image stays.
type jobRestoreError struct{ *JobError }

func (e *jobRestoreError) Error() string {
	s := fmt.Sprintf("job restore failed in its %s, before any part ran: %v", e.Step, e.Err)
	s += "\n  no part of the job runs; every image stays"
	for _, p := range e.Parts {
		for _, n := range p.Notes {
			s += fmt.Sprintf("\n  %s: %s", p.Host, n)
		}
	}
	return s
}

// endRestored asks every agent to end the tree its restore made, after a
// part failed past the restore's go, and says what became of each.
func (j *jobRun) endRestored(cause error) error {
	msg := fmt.Sprintf("job restore failed after every part was made: %v", cause)
	still := false
	for _, a := range j.agents {
		if err := a.send(jobMsg{Op: opEnd}); err != nil {
			msg += fmt.Sprintf("\n  %s: %v", a.host, err)
			still = true
			continue
		}
		m, err := a.expect(evEnded, j.step)
		switch {
		case err != nil:
			msg += fmt.Sprintf("\n  %s: not ended: %v", a.host, err)
			still = true
		case m.Running:
			msg += fmt.Sprintf("\n  %s: not all ended: %s", a.host, strings.Join(m.Notes, "; "))
			still = true
		default:
			msg += fmt.Sprintf("\n  %s: its part was ended", a.host)
		}
	}
	if still {
		return errors.New(msg + "\n  end what still runs of the job, then run the same restore again: every image stays")
	}
	return errors.New(msg + "\n  no part of the job runs, and every image stays: run the same restore again")
}
