package daemon

// A helper that dies during a checkpoint must never cost a healthy process
// its GPU memory. A checkpoint copies the memory into the image while the
// process still holds it (a helper that dies then leaves the process running
// on it: it resumes by itself when its control connection closes while it is
// quiesced), stores the process's part of the image (image.SealProcess), and
// only then has the process give the memory up. From then on:
//
//   - Before the drop, the helper records the process in a state file
//     (<socket dir>/detached/PID.json: pid, start time, image directory and
//     the id of the image its checkpoint writes), removed once the process
//     has its memory back. A helper that starts finds those of live
//     processes and adopts them: it loads the process's buffers from the
//     image its checkpoint committed, or, where the image was not committed
//     yet (a dump commits once the whole tree is dumped), from the process's
//     part of it, and wakes the process, which comes back as after a
//     restore. Only a process whose checkpoint left neither (its image
//     removed, say) is told, through its wake file ("lost: why"), that its
//     GPU state is gone: the interposer prints that and aborts it instead of
//     letting it compute without its memory. (A dropped process whose control
//     connection closes waits for the wake file Drop named, as a detached one
//     does.)
//   - The helper touches <socket dir>/helper.alive every second; a detached
//     interposer that sees it stale (or missing) for GPUCR_ORPHAN_TIMEOUT_S
//     (default 60 s of its own running time) gives up the same way: without
//     a helper its driver state cannot be restored.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image"
)

// aliveInterval is how often the helper touches helper.alive.
const aliveInterval = time.Second

// detachState is a detached process's state file.
type detachState struct {
	Pid       proc.Pid `json:"pid"`
	StartTime uint64   `json:"start_time"` // /proc/PID/stat field 22: tells a reused pid apart
	NsPid     proc.Pid `json:"ns_pid,omitempty"`
	// UID is the process's (the client's) uid: a process of another uid
	// is not it. Its adopted memory counts against that uid's limit.
	UID uint32 `json:"uid"`
	// ImageOwner is the uid the image belongs to (the checkpoint's
	// requester): root's, or the process's own uid.
	ImageOwner uint32 `json:"image_owner"`
	ImageDir   string `json:"image_dir"`
	ImageID    []byte `json:"image_id"` // the image its dump writes; an older one in ImageDir is not it
}

// maxStateFile bounds a state file read back (they are a few hundred bytes).
const maxStateFile = 64 << 10

// detachStates are the state files of processes that gave their memory up
// to an image: detached/PID.json beside the socket, root's alone (an ownDir,
// 0700; the files 0600).
type detachStates struct{ d ownDir }

func newDetachStates(sockDir string) *detachStates {
	return &detachStates{d: ownDir{sockDir: sockDir, name: "detached", mode: 0o700}}
}

func stateName(pid proc.Pid) string { return pid.String() + ".json" }

// record records that cl's process is about to give its memory up to the
// image id in dir, which owner (the checkpoint's requester) owns.
func (ds *detachStates) record(cl *client, owner uint32, dir string, id []byte) error {
	cl.mu.Lock()
	p, uid := cl.proc, cl.uid
	cl.mu.Unlock()
	if err := p.Check(); err != nil {
		return err
	}
	pid := p.Pid()
	return ds.save(detachState{Pid: pid, StartTime: p.Start(), NsPid: proc.NsPid(pid), UID: uid, ImageOwner: owner,
		ImageDir: resolvedDir(dir), ImageID: id})
}

func (ds *detachStates) save(st detachState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return ds.d.write(stateName(st.Pid), b, 0o600)
}

// drop forgets pid's state file.
func (ds *detachStates) drop(pid proc.Pid) { ds.d.remove(stateName(pid)) }

// files lists the state files there are, by name; load reads one, forget
// removes one.
func (ds *detachStates) files() []string { return ds.d.names(".json") }

func (ds *detachStates) load(name string) (detachState, error) {
	var st detachState
	b, err := ds.d.read(name, maxStateFile)
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	return st, err
}

func (ds *detachStates) forget(name string) { ds.d.remove(name) }

// close lets the directory go (the helper stops).
func (ds *detachStates) close() { ds.d.close() }

// keepAlive touches path (helper.alive) until stop is closed, then removes
// it. The socket's directory it is in is the helper's own (ownSocketDir).
func keepAlive(p string, stop <-chan struct{}) {
	touch := func() {
		now := time.Now()
		if err := os.Chtimes(p, now, now); err != nil {
			_ = os.WriteFile(p, nil, 0o644)
		}
	}
	touch()
	t := time.NewTicker(aliveInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			_ = os.Remove(p)
			return
		case <-t.C:
			touch()
		}
	}
}

// adoptOrphans runs when the helper starts: every process a dead helper
// detached gets its GPU memory back from its committed image, or is told
// that it is lost.
func (s *Server) adoptOrphans() {
	for _, f := range s.states.files() {
		st, err := s.states.load(f)
		if err != nil || st.Pid <= 0 {
			s.log.Warn("unreadable detach state file removed", zap.String("file", f), zap.Error(err))
			s.states.forget(f)
			continue
		}
		log := s.log.With(pidField("pid", st.Pid), zap.String("image", st.ImageDir))
		p, err := proc.OpenStarted(st.Pid, st.StartTime)
		if err != nil {
			s.states.forget(f) // that process is gone
			continue
		}
		if p.UID() != st.UID || (st.ImageOwner != 0 && st.ImageOwner != st.UID) {
			// Not the process that detached (or a state file no
			// checkpoint writes): it is left alone, and told nothing.
			log.Warn("a detach state file does not match the process with its pid; removed, the process left alone",
				zap.Uint32("process_uid", p.UID()), zap.Uint32("recorded_uid", st.UID), zap.Uint32("image_owner", st.ImageOwner))
			p.Close()
			s.states.forget(f)
			continue
		}
		err = s.adopt(st, p)
		switch {
		case errors.Is(err, image.ErrOwner):
			// An image of another user than the one recorded: no
			// checkpoint of this process wrote it, so this process is
			// not the one that detached. It is left alone.
			log.Warn("a detach state file names an image of another owner; removed, the process left alone", zap.Error(err))
		case err != nil:
			log.Error("a process detached by a helper that died has lost its GPU state", zap.Error(err))
			msg := fmt.Sprintf("lost: the gpucr helper that held this process's GPU memory died during a checkpoint, and %v\n", err)
			if werr := s.wakes.create(st.Pid, msg); werr != nil {
				log.Error("cannot tell the process", zap.Error(werr))
			}
		default:
			log.Info("adopted a process a dead helper held the GPU memory of: loaded from its image")
		}
		s.states.forget(f)
	}
}

// adoptionImage is the image st's process gave its memory up to: the one its
// checkpoint committed, else (a dump that had not committed the whole image
// yet) the process's part of it, sealed before the process gave its memory
// up. An image of another checkpoint (an older one in the same directory) is
// never taken for it. fromPart says it is the part.
func adoptionImage(st detachState) (_ *image.Image, fromPart bool, _ error) {
	own := &image.Owner{UID: int(st.ImageOwner)}
	im, err := image.OpenWith(st.ImageDir, image.ReadOptions{Owner: own})
	if err == nil && !bytes.Equal(im.Manifest().GetImageId(), st.ImageID) {
		_ = im.Close()
		im, err = nil, fmt.Errorf("the image there is another one")
	}
	if err != nil {
		part, perr := image.OpenProcessPart(st.ImageDir, int(st.Pid), own)
		if perr == nil && !bytes.Equal(part.Manifest().GetImageId(), st.ImageID) {
			_ = part.Close()
			perr = fmt.Errorf("it is another checkpoint's")
		}
		if perr != nil {
			return nil, false, fmt.Errorf("its checkpoint left neither a committed GPU image in %s (%w) nor its part of one (%w)",
				st.ImageDir, err, perr)
		}
		im, fromPart = part, true
	}
	if err := im.CheckRestorable(); err != nil {
		_ = im.Close()
		return nil, false, fmt.Errorf("its GPU image cannot be used: %w", err)
	}
	return im, fromPart, nil
}

// adopt loads the buffers of p (the process st records) from the image its
// dump committed into new memory and wakes it; it then comes back as a
// restored process does. The memory counts against the process's uid's
// limit, and is refused past it.
func (s *Server) adopt(st detachState, p *proc.Process) error {
	handed := false // p is the client's once parkRestored has it
	defer func() {
		if !handed {
			p.Close()
		}
	}()
	im, fromPart, err := adoptionImage(st)
	if err != nil {
		return err
	}
	release, err := s.gpus.reserve(st.UID, imageBytes(im, int(st.Pid)), "its GPU memory")
	if err != nil {
		_ = im.Close()
		return err
	}
	plan, e := s.planRestore(im, st.ImageDir, int(st.Pid), st.UID, samePlace(s.cfg.Devices, im, int(st.Pid)))
	if e != nil {
		release()
		_ = im.Close()
		return errors.New(e.Message)
	}
	s.reg.trackPlan(plan)
	release()
	defer s.dropUnrestored([]*restorePlan{plan})
	s.runLoad(plan)
	cl := plan.clients[0]
	if plan.load.err != nil {
		return fmt.Errorf("loading its GPU image failed: %w", plan.load.err)
	}
	handed = true
	stale, err := s.reg.parkRestored(cl, p)
	if stale != nil {
		s.reap(stale, "its pid names another process now")
	}
	if err != nil {
		s.mem.release(cl)
		return err
	}
	if err := cl.arm(func() { s.giveBack(cl, true, nil, nil) }); err != nil {
		return err
	}
	if err := s.wakes.create(st.Pid, ""); err != nil {
		return err
	}
	if fromPart {
		// Its memory is loaded (the process gets it on waking): nobody
		// waits for the part any more, and the unfinished image, whose
		// commit never comes, is one `gpucr image gc` may remove.
		if err := image.RemoveProcessPart(st.ImageDir, int(st.Pid), st.ImageID, &image.Owner{UID: int(st.ImageOwner)}); err != nil {
			s.log.Warn("the part of the unfinished image the process was adopted from could not be removed", pidField("pid", st.Pid),
				zap.String("image", st.ImageDir), zap.Error(err))
		}
	}
	return nil
}
