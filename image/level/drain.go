package level

// Drains: a push that runs in the background after a checkpoint
// (`gpucr checkpoint --drain URL`), recorded in a file of the user's own
// (DrainDir) that `gpucr status` reads: how far it is, and how it ended.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// Drain is one background push, as its record says.
type Drain struct {
	Pid        int       `json:"pid"`
	Dir        string    `json:"images_dir"`
	URL        string    `json:"url"`
	Started    time.Time `json:"started"`
	Files      int       `json:"files"`
	FilesDone  int       `json:"files_done"`
	Bytes      int64     `json:"bytes"`
	BytesDone  int64     `json:"bytes_done"`
	BytesMoved int64     `json:"bytes_moved"`
	// State: "running", "done" (the image is on the level), "failed"
	// (Error says why) or "died" (its process ended without saying: the
	// level has no index of it, so no image).
	State    string    `json:"state"`
	Error    string    `json:"error,omitempty"`
	Finished time.Time `json:"finished,omitzero"`
	// Pruned: the series' older images that this drain's --keep removed or
	// kept, once the push was done.
	Pruned []Pruned `json:"pruned,omitempty"`
}

// DrainDir is where the caller's drains are recorded: $GPUCR_DRAIN_DIR, else
// /run/gpucr/drains for root, else $XDG_RUNTIME_DIR/gpucr/drains, else a
// directory of the user's own in the system's temporary directory.
func DrainDir() string {
	if d := os.Getenv("GPUCR_DRAIN_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/run/gpucr/drains"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "gpucr", "drains")
	}
	return filepath.Join(os.TempDir(), "gpucr-drains-"+strconv.Itoa(os.Geteuid()))
}

// Recorder writes one drain's record as it goes.
type Recorder struct {
	path  string
	d     Drain
	last  time.Time
	every time.Duration
}

// StartRecord records the drain that process pid (just started) is to run,
// before it runs: a drain killed before it wrote a word is "died" in
// status, not missing from it.
func StartRecord(pid int, dir, url string) error {
	base := DrainDir()
	if err := os.MkdirAll(base, 0o700); err != nil {
		return fmt.Errorf("drain record: %w", err)
	}
	r := &Recorder{path: filepath.Join(base, strconv.Itoa(pid)+".json"),
		d: Drain{Pid: pid, Dir: dir, URL: url, Started: time.Now().UTC(), State: "running"}}
	return r.write()
}

// NewRecorder starts the record of this process's drain of dir to url.
func NewRecorder(dir, url string) (*Recorder, error) {
	base := DrainDir()
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, fmt.Errorf("drain record: %w", err)
	}
	if fi, err := os.Lstat(base); err != nil || !fi.IsDir() || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		return nil, fmt.Errorf("drain record: %s is not a directory of this user's", base)
	}
	r := &Recorder{path: filepath.Join(base, strconv.Itoa(os.Getpid())+".json"), every: 250 * time.Millisecond,
		d: Drain{Pid: os.Getpid(), Dir: dir, URL: url, Started: time.Now().UTC(), State: "running"}}
	return r, r.write()
}

// Progress records how far the push is (at most every 250 ms).
func (r *Recorder) Progress(p Progress) {
	r.d.Files, r.d.FilesDone, r.d.Bytes, r.d.BytesDone, r.d.BytesMoved = p.Files, p.FilesDone, p.Bytes, p.BytesDone, p.BytesMoved
	if time.Since(r.last) >= r.every {
		_ = r.write()
	}
}

// SetPruned records what the prune after the push did (before End).
func (r *Recorder) SetPruned(p []Pruned) { r.d.Pruned = p }

// End records how the push ended.
func (r *Recorder) End(err error) error {
	r.d.State = "done"
	if err != nil {
		r.d.State, r.d.Error = "failed", scrub(err)
	}
	r.d.Finished = time.Now().UTC()
	return r.write()
}

func (r *Recorder) write() error {
	r.last = time.Now()
	b, err := json.Marshal(r.d)
	if err != nil {
		return err
	}
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, r.path)
}

// keepFinished: the finished drains Drains keeps listing.
const keepFinished = 20

// Drains lists the caller's drains, newest first. A running one whose
// process is gone is "died"; finished ones past the newest keepFinished
// are forgotten.
func Drains() ([]Drain, error) {
	base := DrainDir()
	ents, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Drain
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".json" || !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(base, e.Name()))
		if err != nil || len(b) > 1<<20 {
			continue
		}
		var d Drain
		if json.Unmarshal(b, &d) != nil || strconv.Itoa(d.Pid)+".json" != e.Name() {
			continue
		}
		if d.State == "running" && !isDrainProcess(d.Pid) {
			d.State = "died"
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.After(out[j].Started) })
	finished := 0
	kept := out[:0]
	for _, d := range out {
		if d.State != "running" {
			if finished++; finished > keepFinished {
				_ = os.Remove(filepath.Join(base, strconv.Itoa(d.Pid)+".json"))
				continue
			}
		}
		kept = append(kept, d)
	}
	return kept, nil
}

// isDrainProcess: pid runs (a zombie does not), is this user's, and is a
// push (a pid taken since by another process is not the drain).
func isDrainProcess(pid int) bool {
	p := "/proc/" + strconv.Itoa(pid)
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil || st.Uid != uint32(os.Geteuid()) {
		return false
	}
	stat, err := os.ReadFile(p + "/stat")
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	cmd, err := os.ReadFile(p + "/cmdline")
	return err == nil && bytes.Contains(cmd, []byte("\x00push\x00"))
}
