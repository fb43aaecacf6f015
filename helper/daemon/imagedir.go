package daemon

// The helper writes and reads image directories for its callers, as root.
// So that it never does for a caller what the caller could not do itself:
//
//   - The caller opens the image directory and passes the descriptor with
//     its Checkpoint (PrepareRestore) request: the kernel checked, as the
//     caller and in the caller's mount namespace, that it can reach it, and
//     the helper works only beneath that descriptor (package image opens
//     nothing by path there, follows no symlink and waits on no FIFO). A
//     caller other than root must pass it; root may still name a path.
//   - Everything the helper writes goes into DIR/gpucr, which belongs to
//     the caller: for a caller other than root it must exist already (the
//     CLI makes it, as the caller, so the kernel checked that the caller may
//     write DIR), and the helper creates nothing directly in DIR. What it
//     creates there is given to the caller (0700/0600); what it finds there,
//     and every parent image an incremental image uses, must be the
//     caller's already (image.Options.Owner). Root's images are root's.
//   - A deferred-commit image (a CRIU dump of several processes) belongs to
//     the connection that opened it: only that connection adds to it,
//     commits it or drops it.

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/fscred"
	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// takesFD says whether req may carry a descriptor: the image directory of
// a Checkpoint, PrepareRestore, LoadResident or UnloadResident, the fd an
// ImportPeer imports, the sealed memfd of an AnalyzeModule's image.
func takesFD(req *helperpb.Request) bool {
	switch req.Body.(type) {
	case *helperpb.Request_Checkpoint, *helperpb.Request_PrepareRestore, *helperpb.Request_LoadResident,
		*helperpb.Request_UnloadResident, *helperpb.Request_ImportPeer, *helperpb.Request_AnalyzeModule:
		return true
	}
	return false
}

// takeFD takes the descriptor that came with the request being served (nil
// if none); the caller closes it.
func (c *conn) takeFD() *os.File {
	if len(c.fds) == 0 {
		return nil
	}
	f := os.NewFile(uintptr(c.fds[0]), "the request's descriptor")
	c.fds = nil
	return f
}

// checkpointDir is the image directory a Checkpoint writes into, open: the
// caller's descriptor, or (root only) the path, made 0700 if missing. Else
// the answer refusing the request.
func checkpointDir(c *conn, id uint64, req *helperpb.Checkpoint) (*os.File, *helperpb.Response) {
	if f := c.takeFD(); f != nil {
		fi, err := f.Stat()
		if err == nil && !fi.IsDir() {
			err = errors.New("not a directory")
		}
		if err != nil {
			f.Close()
			return nil, errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "image directory %s (the descriptor passed): %v", req.ImageDir, err)
		}
		// A directory the caller may read but not search (r without x): what
		// is in it is not theirs to learn, so the helper does not look
		// either.
		if c.cred.Uid != 0 {
			cred, err := c.fsCred()
			if err == nil {
				err = fscred.Do(cred, func() error {
					var st unix.Stat_t
					return unix.Fstatat(int(f.Fd()), ".", &st, 0)
				})
			}
			if err != nil {
				f.Close()
				return nil, errResp(id, helperpb.ErrorCode_ERROR_PERMISSION, "image directory %s: %v", req.ImageDir, err)
			}
		}
		return f, nil
	}
	if c.cred.Uid != 0 {
		c.log.Warn("checkpoint refused: no image directory descriptor", zap.String("image", req.ImageDir))
		return nil, errResp(id, helperpb.ErrorCode_ERROR_PERMISSION,
			"uid %d: the image directory %s must come with the request as a descriptor the caller opened (a gpucr CLI older than the helper?)",
			c.cred.Uid, req.ImageDir)
	}
	if err := os.MkdirAll(req.ImageDir, 0o700); err != nil {
		return nil, errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "image directory: %v", err)
	}
	fd, err := unix.Open(req.ImageDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "image directory %s: %v", req.ImageDir, err)
	}
	return os.NewFile(uintptr(fd), req.ImageDir), nil
}

// fsCred is the caller's file-system identity, for lookups made as the
// caller (package fscred): its groups are those it had when it connected,
// read once.
func (c *conn) fsCred() (fscred.Cred, error) {
	if c.fscred == nil {
		groups, err := c.PeerGroups()
		if err != nil {
			return fscred.Cred{}, fmt.Errorf("the caller's groups: %w", err)
		}
		c.fscred = &fscred.Cred{UID: c.cred.Uid, GID: c.cred.Gid, Groups: groups}
	}
	return *c.fscred, nil
}

// imageErrCode is the error code of a failure to open an image for a caller.
func imageErrCode(err error) helperpb.ErrorCode {
	switch {
	case errors.Is(err, image.ErrOwner):
		return helperpb.ErrorCode_ERROR_PERMISSION
	case errors.Is(err, image.ErrBusy):
		return helperpb.ErrorCode_ERROR_STATE
	}
	return helperpb.ErrorCode_ERROR_BAD_REQUEST
}

// deferKey names a deferred-commit image: the connection writing it and
// the image_dir its requests name.
type deferKey struct {
	c   *conn
	dir string
}

// deferImage is an image writer kept open for a dump of several
// processes, and the directory it writes into.
type deferImage struct {
	w   *image.Writer
	dev uint64
	ino uint64
}

// openImages are the deferred-commit images being written, by the
// connection that opened each and its image directory. It has its own
// lock: nothing else is read or written with it.
type openImages struct {
	mu    sync.Mutex
	byKey map[deferKey]*deferImage
}

func (o *openImages) get(key deferKey) *deferImage {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byKey[key]
}

func (o *openImages) put(key deferKey, d *deferImage) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byKey == nil {
		o.byKey = map[deferKey]*deferImage{}
	}
	o.byKey[key] = d
}

// take removes and returns the image of key (nil: none).
func (o *openImages) take(key deferKey) *deferImage {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := o.byKey[key]
	delete(o.byKey, key)
	return d
}

func dirID(f *os.File) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, 0, err
	}
	return uint64(st.Dev), st.Ino, nil
}

// imageWriter is the writer a Checkpoint of caller c puts its GPU data
// into, in the directory dir: the caller's image (image.Options.Owner). With
// defer_commit it is the one c keeps open for req.ImageDir, made by its
// first Checkpoint.
func (s *Server) imageWriter(c *conn, dir *os.File, req *helperpb.Checkpoint, origin image.Origin, opts image.Options) (*image.Writer, error) {
	opts.Owner = &image.Owner{UID: int(c.cred.Uid), GID: int(c.cred.Gid)}
	opts.SubDirMustExist = c.cred.Uid != 0
	// An incremental image links its parent chain's chunk files instead of
	// referring to them: any image of a series may be deleted (a user
	// keeping the last N checkpoints) and the others still restore.
	opts.SelfContained = true
	if c.cred.Uid != 0 {
		// The parent chain is found with the caller's permissions: what
		// the caller could not reach fails as it would for them, and the
		// answer tells nothing of what lies there.
		cred, err := c.fsCred()
		if err != nil {
			return nil, err
		}
		opts.Lookup = func(open func() error) error { return fscred.Do(cred, open) }
	}
	dev, ino, err := dirID(dir)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", req.ImageDir, err)
	}
	if !req.DeferCommit {
		opts.Salvage = s.salvage.take(dev, ino)
		return image.CreateAt(dir, origin, opts)
	}
	key := deferKey{c, req.ImageDir}
	d := s.open.get(key)
	if d != nil {
		if d.dev != dev || d.ino != ino {
			return nil, fmt.Errorf("%s: this dump writes its GPU image in %s, not in the directory passed now", req.ImageDir, d.w.Dir())
		}
		return d.w, nil
	}
	// Requests of one connection are served one at a time: nothing else
	// makes this key's writer meanwhile.
	opts.Salvage = s.salvage.take(dev, ino)
	w, err := image.CreateAt(dir, origin, opts)
	if err != nil {
		return nil, err
	}
	s.open.put(key, &deferImage{w: w, dev: dev, ino: ino})
	return w, nil
}

// commitImage runs a CommitImage request of connection c: only the images
// c's own Checkpoints opened.
func (s *Server) commitImage(c *conn, id uint64, req *helperpb.CommitImage) *helperpb.Response {
	key := deferKey{c, req.ImageDir}
	d := s.open.take(key)
	if d == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_NOT_FOUND, "no GPU image being written in %s by this connection", req.ImageDir)
	}
	w := d.w
	if req.Abort {
		defer s.endGroups(key, true)
		if err := s.bg.settle(w, true, s.salvage); err != nil {
			return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "drop the GPU image in %s: %v", w.Dir(), err)
		}
		s.log.Info("GPU image dropped (the dump failed)", zap.String("image", w.Dir()))
		return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
	}
	groups := s.groups.take(key)
	if msg := missingMembers(groups); msg != "" {
		_ = s.bg.settle(w, true, s.salvage)
		for _, g := range groups {
			s.endGroup(g, true, nil, nil)
		}
		s.log.Warn("GPU image dropped: a process sharing GPU memory was not checkpointed", zap.String("image", w.Dir()),
			zap.String("why", msg))
		return errResp(id, helperpb.ErrorCode_ERROR_STATE, "the GPU image in %s is not committed: %s", w.Dir(), msg)
	}
	defer func() {
		for _, g := range groups {
			s.endGroup(g, false, nil, nil)
		}
	}()
	if s.bg.has(w) {
		// Concurrent checkpoints still copy: the commit follows them, and
		// their transfers tell the outcome (the CLI waits for it there).
		s.commitLater(w)
		s.log.Info("GPU image to be committed once its background copies end", zap.String("image", w.Dir()))
		return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
	}
	if err := w.Commit(); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_DRIVER, "commit the GPU image in %s: %v", w.Dir(), err)
	}
	s.log.Info("GPU image committed", zap.String("image", w.Dir()), zap.Int("buffers", w.Stats().Buffers))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_Ok{Ok: &helperpb.Ok{}}}
}

// abortImages drops deferred images connection c left uncommitted.
func (s *Server) abortImages(c *conn, dirs map[string]bool) {
	for dir := range dirs {
		key := deferKey{c, dir}
		d := s.open.take(key)
		if d != nil {
			_ = s.bg.settle(d.w, true, s.salvage)
			s.log.Warn("GPU image left uncommitted by its dump is dropped", zap.String("image", d.w.Dir()))
		}
		s.endGroups(key, true)
	}
}
