package image

// A served process's template script (protocol/c/served.h): the records its
// library would send a new worker to make its objects again, written at a
// checkpoint's detach, which a worker can run before the restore (a
// template). The image keeps it beside the chunks as
// gpucr/template-HASH.script (HASH: its SHA-256, in hex), named in the
// manifest's Process.template with its size; whoever reads it checks both.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// TemplateScript is a template script as the manifest records it.
type TemplateScript struct {
	SHA256 [sha256.Size]byte
	Size   uint64
}

func (t TemplateScript) name() string {
	return "template-" + hex.EncodeToString(t.SHA256[:]) + ".script"
}

func (t *TemplateScript) pb() *imagepb.TemplateScript {
	if t == nil {
		return nil
	}
	return &imagepb.TemplateScript{Sha256: append([]byte(nil), t.SHA256[:]...), Size: t.Size}
}

// ErrTemplateDamaged is the error of a template script whose bytes are not
// those the manifest names.
var ErrTemplateDamaged = errors.New("template script damaged")

// AddTemplateScript copies src, from its start, into the image as process
// pid's template script; more than max bytes are refused. The file is the
// image's from then on: an Abort removes it.
func (w *Writer) AddTemplateScript(pid int, src *os.File, max int64) error {
	if pid <= 0 {
		return fmt.Errorf("template script of process %d: invalid pid", pid)
	}
	tmp := fmt.Sprintf("%stemplate-%s-%d", tmpPrefix, w.store.tmpTag, pid)
	f, err := w.g.create(tmp, unix.O_WRONLY|unix.O_CLOEXEC, w.store.own)
	if err != nil {
		return fmt.Errorf("template script of process %d: %w", pid, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.NewSectionReader(src, 0, max+1))
	if err == nil && n > max {
		err = fmt.Errorf("larger than %d bytes", max)
	}
	if err == nil {
		err = f.Sync()
	}
	id, ierr := idOf(f)
	f.Close()
	if err == nil {
		err = ierr
	}
	var t TemplateScript
	copy(t.SHA256[:], h.Sum(nil))
	t.Size = uint64(n)
	if err == nil {
		err = w.g.rename(tmp, w.g, t.name())
	}
	if err != nil {
		_ = unix.Unlinkat(w.g.fd(), tmp, 0)
		return fmt.Errorf("template script of process %d into %s: %w", pid, w.g.join(t.name()), err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != stateOpen {
		_ = w.g.removeOwn(t.name(), id)
		return w.stateErrLocked()
	}
	if w.procs == nil {
		w.procs = map[int]procRec{}
	}
	r := w.procs[pid]
	r.script = &t
	w.procs[pid] = r
	w.scripts = append(w.scripts, createdFile{t.name(), id})
	return nil
}

// createdFile is a file a Writer made beside the chunks, removed if it
// aborts.
type createdFile struct {
	name string
	id   fileID
}

// removeScripts removes the template scripts this write made (an abort).
func (w *Writer) removeScripts() {
	w.mu.Lock()
	made := w.scripts
	w.scripts = nil
	w.mu.Unlock()
	for _, c := range made {
		_ = w.g.removeOwn(c.name, c.id)
	}
}

// TemplateScript is process pid's template script, if its checkpoint kept
// one (nil, nil if not): the file, opened read-only beneath the image's
// gpucr/ (nothing followed), read through once and checked against the
// manifest's size and hash, then handed back at its start. The check finds
// damage; it does not make the bytes trusted (the image's owner can change
// the file after it): whoever runs a script runs it as that owner, who could
// send a worker the same records from a process of their own. An image of
// another user is refused as its chunks are (ReadOptions.Owner).
func (im *Image) TemplateScript(pid int) (*os.File, error) {
	var t *TemplateScript
	for _, p := range im.m.GetProcesses() {
		if int(p.GetPid()) == pid && p.GetTemplate() != nil {
			t = &TemplateScript{Size: p.GetTemplate().GetSize()}
			if len(p.GetTemplate().GetSha256()) != sha256.Size {
				return nil, corruptf("process %d's template script: hash of %d bytes", pid, len(p.GetTemplate().GetSha256()))
			}
			copy(t.SHA256[:], p.GetTemplate().GetSha256())
		}
	}
	if t == nil {
		return nil, nil
	}
	path := im.gdirs[0].join(t.name())
	src, err := im.gdirs[0].openFile(t.name(), unix.O_RDONLY|unix.O_CLOEXEC, im.opts.Owner)
	if err != nil {
		return nil, fmt.Errorf("process %d's template script: %w", pid, err)
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(src, int64(t.Size)+1))
	if err != nil {
		src.Close()
		return nil, fmt.Errorf("process %d's template script %s: %w", pid, path, err)
	}
	if uint64(n) != t.Size || string(h.Sum(nil)) != string(t.SHA256[:]) {
		src.Close()
		return nil, fmt.Errorf("%w: %s (process %d) holds %d bytes whose SHA-256 is not the one the manifest names (%d bytes)",
			ErrTemplateDamaged, path, pid, n, t.Size)
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		src.Close()
		return nil, fmt.Errorf("process %d's template script %s: %w", pid, path, err)
	}
	return src, nil
}
