package checkpoint

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/gpucr/gpucr/helper/proc"
)

// The words a job's coordinator and its agents (`gpucr job-agent`, one on
// each host, on the stdin and stdout of an ssh session) exchange: one JSON
// object a line. The coordinator sends requests (Op), an agent answers with
// events (Event); docs/job-checkpoint.md has the sequence.

// FeatureJobAgent is what `gpucr version --json` lists where gpucr has the
// job agent.
const FeatureJobAgent = "job-agent"

// Requests, coordinator to agent.
const (
	opPrepare        = "prepare"         // a checkpoint: look at the part (Pid, Dir)
	opMarkDir        = "mark-dir"        // leave a mark of this part beside its image directory (Dir, Token, Part)
	opFindMarks      = "find-marks"      // which other parts' marks are beside it; remove this part's
	opHold           = "hold"            // hold its GPU processes at their counts of peer sync operations
	opQuiesce        = "quiesce"         // bring them to the job's count (SyncTarget), quiesce and drain them
	opDump           = "dump"            // dump it (Conns, LeaveRunning)
	opDrain          = "drain"           // every part is frozen: wait for the send queues
	opGo             = "go"              // every part is drained (dump) or made (restore): go on
	opCommit         = "commit"          // every part is dumped: end it (or let it run on), keep the image
	opAbort          = "abort"           // a part failed: give this one back, running
	opRestorePrepare = "restore-prepare" // a restore: read the part's record (Dir)
	opRestore        = "restore"         // restore it
	opEnd            = "end"             // a part failed after the restore's go: end this one's restored tree
)

// Events, agent to coordinator.
const (
	evPrepared = "prepared" // Conns: the part's connections to peers outside its tree
	evMarked   = "marked"   // mark-dir done
	evMarks    = "marks"    // find-marks done: Shared, the other parts whose marks are there
	evHeld     = "held"     // its GPU processes are held: SyncCount, the highest count
	evQuiesced = "quiesced" // they are at the job's count, quiesced and drained
	evFrozen   = "frozen"   // CRIU froze the tree; it waits for drain
	evDrained  = "drained"  // the job's connections of this part have nothing in flight; it waits for go
	evDumped   = "dumped"   // the dump is complete, the tree stopped; it waits for commit or abort
	evDone     = "done"     // commit done
	evAborted  = "aborted"  // abort done: Running says whether the part runs
	evReady    = "ready"    // restore-prepare done: Record
	evMade     = "made"     // CRIU made the tree, sockets in repair mode; it waits for go
	evRestored = "restored" // the restored part runs
	evEnded    = "ended"    // end done: Running says whether anything of the part still runs
	evError    = "error"    // the request failed (Error)
)

// jobMsg is one line either way.
type jobMsg struct {
	Op    string `json:"op,omitempty"`
	Event string `json:"event,omitempty"`

	Pid          proc.Pid  `json:"pid,omitempty"`
	Dir          string    `json:"dir,omitempty"`
	Conns        []JobConn `json:"conns,omitempty"`
	LeaveRunning bool      `json:"leave_running,omitempty"`
	DrainMillis  int64     `json:"drain_ms,omitempty"`
	// SyncCount (held) and SyncTarget (quiesce): counts of peer sync
	// operations; QuiesceMillis bounds the quiesce.
	SyncCount     uint64 `json:"sync_count,omitempty"`
	SyncTarget    uint64 `json:"sync_target,omitempty"`
	QuiesceMillis int64  `json:"quiesce_ms,omitempty"`
	GPUProcesses  int    `json:"gpu_processes,omitempty"`
	// Token and Part name a part's mark beside its image directory;
	// Shared lists the other parts whose marks an agent found there.
	Token  string     `json:"token,omitempty"`
	Part   int        `json:"part,omitempty"`
	Shared []int      `json:"shared,omitempty"`
	Record *JobRecord `json:"record,omitempty"`
	// Unsent (drained): the part's job connections whose send queues hold
	// bytes their peers' full buffers keep (jobconn.go's waitDrained)
	Unsent []JobConn `json:"unsent,omitempty"`

	Error string `json:"error,omitempty"`
	// InFlight: the error is a dump's that met a TCP connection in flight
	InFlight bool     `json:"in_flight,omitempty"`
	Running  bool     `json:"running,omitempty"`
	Notes    []string `json:"notes,omitempty"`
	// Result: the part's DumpResult or RestoreResult, as its gpucr
	// reports it
	Result json.RawMessage `json:"result,omitempty"`
}

// jobLine writes messages, one a line, from any goroutine.
type jobLine struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *jobLine) send(m jobMsg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.w.Write(append(b, '\n'))
	return err
}

// readJobMsgs hands each line of r to out until r ends or a line does not
// parse; its error says why (nil: r ended). The caller closes out after
// it has kept the error, so that whoever sees out closed sees the error.
func readJobMsgs(r io.Reader, out chan<- jobMsg) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20) // a dump's result is a few KiB
	for sc.Scan() {
		var m jobMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return fmt.Errorf("a line that is not a job message: %q: %w", truncate(sc.Text(), 200), err)
		}
		out <- m
	}
	return sc.Err()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// errAborted is an abort the coordinator sent while this part waited.
var errAborted = errors.New("the job's coordinator aborted the checkpoint (another part failed)")
