package daemon

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// recordingResiduals is a Residuals that keeps one state per pid, as the
// driver does, and records the calls made to it.
type recordingResiduals struct {
	state       map[int]ResidualState
	calls       []string
	failRestore error
}

func (r *recordingResiduals) State(pid int) (ResidualState, error) { return r.state[pid], nil }
func (r *recordingResiduals) Lock(pid int, _ time.Duration) error {
	r.calls = append(r.calls, "lock")
	r.state[pid] = ResidualLocked
	return nil
}
func (r *recordingResiduals) Save(pid int) error {
	r.calls = append(r.calls, "save")
	r.state[pid] = ResidualSaved
	return nil
}
func (r *recordingResiduals) Restore(pid int, pairs []GPUPair) error {
	r.calls = append(r.calls, "restore "+pairsText(pairs))
	if r.failRestore != nil {
		return r.failRestore
	}
	r.state[pid] = ResidualLocked
	return nil
}
func (r *recordingResiduals) Unlock(pid int) error {
	r.calls = append(r.calls, "unlock")
	r.state[pid] = ResidualRunning
	return nil
}

// TestResumeResidual: a residual context comes back to running from
// wherever a checkpoint left it, through the seam alone, and onto the GPUs
// asked for.
func TestResumeResidual(t *testing.T) {
	pairs := []GPUPair{{Old: "GPU-a", New: "GPU-b"}}
	for _, c := range []struct {
		from  ResidualState
		pairs []GPUPair
		want  []string
	}{
		{ResidualSaved, nil, []string{"restore ", "unlock"}},
		{ResidualSaved, pairs, []string{"restore GPU-a->GPU-b", "unlock"}},
		{ResidualLocked, nil, []string{"unlock"}},
		{ResidualRunning, nil, nil},
	} {
		r := &recordingResiduals{state: map[int]ResidualState{7: c.from}}
		if err := resumeResidual(r, 7, c.pairs); err != nil {
			t.Fatalf("from %v: %v", c.from, err)
		}
		if !slices.Equal(r.calls, c.want) || r.state[7] != ResidualRunning {
			t.Errorf("from %v: calls %q, state %v; want %q, running", c.from, r.calls, r.state[7], c.want)
		}
	}
	r := &recordingResiduals{state: map[int]ResidualState{7: ResidualSaved}, failRestore: errors.New("no such GPU")}
	err := resumeResidual(r, 7, pairs)
	if err == nil || !strings.Contains(err.Error(), "onto other GPUs (GPU-a->GPU-b): no such GPU") || slices.Contains(r.calls, "unlock") {
		t.Errorf("a failed restore: %v, calls %q; want the pairs named and no unlock", err, r.calls)
	}
}

// TestResidualStateWords: the states read as the messages have always
// said them ("pid N is locked, not checkpointed").
func TestResidualStateWords(t *testing.T) {
	for s, w := range map[ResidualState]string{ResidualRunning: "running", ResidualLocked: "locked", ResidualSaved: "checkpointed", ResidualFailed: "failed"} {
		if s.String() != w {
			t.Errorf("%d reads %q, want %q", int(s), s.String(), w)
		}
	}
}
