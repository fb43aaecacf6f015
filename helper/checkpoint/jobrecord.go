package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpucr/gpucr/helper/proc"
)

// A part of a job's image says which job it belongs to, which part it is,
// and where the others are: a job restore restores the parts of one
// checkpoint together, and refuses parts of different ones, or a job with
// a part missing.

// jobRecordName is the record's file in each part's image directory.
const jobRecordName = "gpucr-job.json"

// JobRecord is one part's record of a job checkpoint.
type JobRecord struct {
	ID    string          `json:"id"`   // the checkpoint's, the same in every part
	Part  int             `json:"part"` // this part's index in Parts
	Parts []JobRecordPart `json:"parts"`
}

// JobRecordPart is a part of the job as the coordinator reached it.
type JobRecordPart struct {
	Host  string    `json:"host"`
	Pid   proc.Pid  `json:"pid"`
	Dir   string    `json:"dir"`
	Conns []JobConn `json:"conns,omitempty"` // its connections to other parts
	// Unsent are those of Conns dumped with bytes in their send queues
	// that the peer's full buffer kept: their peers' parts are restored
	// first (jobrestore.go)
	Unsent []JobConn `json:"unsent,omitempty"`
}

// writeJobRecord writes r into the image directory dir: written whole to
// a temporary name and renamed, so that a record is never half there.
func writeJobRecord(dir string, r JobRecord) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".gpucr-"+jobRecordName)
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("the job record in %s: %w", dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, jobRecordName)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("the job record in %s: %w", dir, err)
	}
	return nil
}

// readJobRecord reads the job record of the image directory dir.
func readJobRecord(dir string) (*JobRecord, error) {
	b, err := os.ReadFile(filepath.Join(dir, jobRecordName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s holds no part of a job checkpoint (no %s): restore it with `gpucr restore`, or it is a job's part whose checkpoint did not complete", dir, jobRecordName)
	}
	if err != nil {
		return nil, err
	}
	var r JobRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("the job record %s: %w", filepath.Join(dir, jobRecordName), err)
	}
	if r.ID == "" || r.Part < 0 || r.Part >= len(r.Parts) {
		return nil, fmt.Errorf("the job record %s is not valid", filepath.Join(dir, jobRecordName))
	}
	return &r, nil
}
