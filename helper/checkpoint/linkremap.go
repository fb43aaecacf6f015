package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	remap "github.com/checkpoint-restore/go-criu/v7/crit/images/remap-file-path"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// A process may hold open (or mapped) a file whose name it unlinked while
// another name still links the file: glibc's sem_open makes a semaphore
// under a temporary name, links it to its own and unlinks the temporary
// one, which the mapping keeps; multiprocessing (every DataLoader with
// workers, torch.multiprocessing) unlinks the other name only when the
// job ends. CRIU's --link-remap dumps such a file as a hard link it makes
// beside it, link_remap.N, which the image names (remap-fpath.img); a
// restore links the file's old name to it, opens it and removes the link.
// The image so depends on a file outside it, and CRIU removes that file
// itself: at once after a --leave-running dump (the processes run on, and
// it would be one more name of their file), and in the first restore. Such
// an image could not be restored after the job ended, nor twice ("Can't
// link dev/shm/link_remap.N -> dev/shm/sem.X: No such file or directory",
// measured with a DDP job). So a dump keeps a copy of each link in the
// image, taken at CRIU's post-dump notice (the images are written and
// flushed, the processes still stopped, the links still there), and a
// restore makes a link that is missing again from its copy.

// linkRemapIndex lists the copies in the image directory; each copy is a
// file of its own there, named linkRemapPrefix and CRIU's file id.
const (
	linkRemapIndex  = "gpucr-link-remaps.json"
	linkRemapPrefix = "gpucr-link-remap-"
)

// linkRemapName is the name CRIU gives its links: link_remap.ID. A restore
// makes no other file.
var linkRemapName = regexp.MustCompile(`^link_remap\.[0-9]+$`)

// linkRemapCopy is a copy of one link CRIU made at a dump.
type linkRemapCopy struct {
	Path string `json:"path"` // the link, absolute
	Mode uint32 `json:"mode"` // its permission bits
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	Size int64  `json:"size"`
	File string `json:"file"` // the copy, in the image directory
}

// decodeImage reads CRIU's image name in the directory open as dfd, whose
// entries are of entry's type; none if the image has no such file.
func decodeImage(dfd int, name string, entry proto.Message) ([]proto.Message, error) {
	f, err := openAt(dfd, name)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	defer f.Close()
	// CRIU's images count only as the restoring user's (as stageRestore
	// links them): whoever else may write DIR does not choose what a
	// restore makes.
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("%s: not a regular file of uid %d", name, os.Geteuid())
	}
	img, err := crit.New(f, nil, "", false, true).Decode(entry)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	out := make([]proto.Message, 0, len(img.Entries))
	for _, e := range img.Entries {
		out = append(out, e.Message)
	}
	return out, nil
}

// linkedRemaps are the ids (in files.img) of the links CRIU made for the
// images in the directory open as dfd; none where the image has its own
// mount namespace (a container's paths are its root's, not this host's).
func linkedRemaps(dfd int) (map[uint32]bool, error) {
	if m, _ := filepath.Glob(fmt.Sprintf("/proc/self/fd/%d/mountpoints-*.img", dfd)); len(m) > 0 {
		return nil, nil
	}
	remaps, err := decodeImage(dfd, "remap-fpath.img", &remap.RemapFilePathEntry{})
	if err != nil {
		return nil, err
	}
	linked := map[uint32]bool{}
	for _, m := range remaps {
		if r, ok := m.(*remap.RemapFilePathEntry); ok && r.GetRemapType() == remap.RemapType_LINKED {
			linked[r.GetRemapId()] = true
		}
	}
	return linked, nil
}

// linkRemapPaths are the links among the image's open files files whose
// ids linked names (absolute paths).
func linkRemapPaths(linked map[uint32]bool, files []*fdinfo.FileEntry) []string {
	var out []string
	for _, fe := range files {
		if fe.GetType() == fdinfo.FdTypes_REG && linked[fe.GetReg().GetId()] {
			out = append(out, "/"+strings.TrimPrefix(fe.GetReg().GetName(), "/"))
		}
	}
	return out
}

// saveLinkRemaps copies each link CRIU made for the dump whose images are
// in stage into stage, with the index, for publish to move into DIR with
// the images.
func saveLinkRemaps(stage *os.File) error {
	sfd := int(stage.Fd())
	linked, err := linkedRemaps(sfd)
	if err != nil || len(linked) == 0 {
		return linkRemapsErr(err)
	}
	files, err := filesIn(sfd)
	if err != nil {
		return linkRemapsErr(err)
	}
	paths := linkRemapPaths(linked, files)
	var copies []linkRemapCopy
	for i, p := range paths {
		c, err := copyLinkRemap(sfd, p, fmt.Sprintf("%s%d", linkRemapPrefix, i))
		if err != nil {
			return fmt.Errorf("keeping CRIU's link %s in the image: %w", p, err)
		}
		copies = append(copies, c)
	}
	b, err := json.MarshalIndent(copies, "", "  ")
	if err != nil {
		return err
	}
	return writeNew(sfd, linkRemapIndex, b)
}

// linkRemapsErr says that err came reading which links CRIU made (nil: nil).
func linkRemapsErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("the links CRIU made for open files that were unlinked (--link-remap): %w", err)
}

// copyLinkRemap copies the file at path into the directory open as dfd, as
// name (0600).
func copyLinkRemap(dfd int, path, name string) (linkRemapCopy, error) {
	in, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return linkRemapCopy{}, err
	}
	defer in.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &st); err != nil {
		return linkRemapCopy{}, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return linkRemapCopy{}, fmt.Errorf("not a regular file")
	}
	out, err := createNew(dfd, name)
	if err != nil {
		return linkRemapCopy{}, err
	}
	defer out.Close()
	n, err := io.Copy(out, in)
	if err != nil {
		return linkRemapCopy{}, err
	}
	return linkRemapCopy{Path: path, Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid, Size: n, File: name}, out.Sync()
}

// createNew creates name, a new file (0600), in the directory open as dfd.
func createNew(dfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// writeNew writes b as a new file name (0600) in the directory open as dfd.
func writeNew(dfd int, name string, b []byte) error {
	f, err := createNew(dfd, name)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return err
	}
	return f.Sync()
}

// remakeLinkRemaps makes each link the image's restore needs that is gone
// from its copy in dir (a link still there, CRIU uses; one whose content
// is not the copy's is refused: it is another image's, or was written
// since). files are the image's open files (imageFiles). Only the copies
// belonging to the restoring user are used.
func remakeLinkRemaps(dir string, files []*fdinfo.FileEntry, ev *emitter) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("image directory %s: %w", dir, err)
	}
	defer d.Close()
	dfd := int(d.Fd())
	uid := uint32(os.Geteuid())
	linked, err := linkedRemaps(dfd)
	if err != nil {
		return fmt.Errorf("image directory %s: %w", dir, err)
	}
	needed := linkRemapPaths(linked, files)
	if len(needed) == 0 {
		return nil
	}
	copies := map[string]linkRemapCopy{}
	if regularOf(dfd, linkRemapIndex, uid) {
		b, err := readAt(dfd, linkRemapIndex)
		if err != nil {
			return fmt.Errorf("image directory %s: %w", dir, err)
		}
		var list []linkRemapCopy
		if err := json.Unmarshal(b, &list); err != nil {
			return fmt.Errorf("image directory %s: %s: %w", dir, linkRemapIndex, err)
		}
		for _, c := range list {
			copies[c.Path] = c
		}
	}
	for _, p := range needed {
		if !linkRemapName.MatchString(filepath.Base(p)) || filepath.Clean(p) != p {
			return fmt.Errorf("image directory %s: remap-fpath.img names %q, not a link CRIU makes", dir, p)
		}
		c, have := copies[p]
		if have && (strings.Contains(c.File, "/") || !strings.HasPrefix(c.File, linkRemapPrefix) || !regularOf(dfd, c.File, uid)) {
			return fmt.Errorf("image directory %s: %s names %q, not a copy of this image", dir, linkRemapIndex, c.File)
		}
		var st unix.Stat_t
		err := unix.Lstat(p, &st)
		switch {
		case err == nil && have:
			if same, serr := sameContent(p, dfd, c.File); serr != nil || !same {
				return fmt.Errorf("restore from %s refused: %s, the link CRIU made at the dump for a file the processes had "+
					"unlinked, is not the image's (another image's link of that name, or written since): remove it, and "+
					"the restore makes it again from the image's copy", dir, p)
			}
		case err == nil:
			// an image from before the copies: CRIU uses the link as it is
		case errors.Is(err, unix.ENOENT) && have:
			if err := makeLinkRemap(dfd, c); err != nil {
				return fmt.Errorf("restore from %s: making %s again from the image's copy: %w", dir, p, err)
			}
			ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("made %s again from the image (CRIU's link to a file the processes had unlinked)", p)})
		case errors.Is(err, unix.ENOENT):
			return fmt.Errorf("restore from %s refused: %s, the link CRIU made at the dump for a file the processes had "+
				"unlinked (--link-remap), is gone, and the image holds no copy of it (dumped by an older gpucr)", dir, p)
		default:
			return fmt.Errorf("restore from %s: %s: %w", dir, p, err)
		}
	}
	return nil
}

// makeLinkRemap writes c's copy (in the directory open as dfd) at c.Path,
// a new file with c's mode and owner.
func makeLinkRemap(dfd int, c linkRemapCopy) error {
	in, err := openAt(dfd, c.File)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(c.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, in)
	if err == nil && n != c.Size {
		err = fmt.Errorf("the copy has %d bytes, the link had %d", n, c.Size)
	}
	if err == nil {
		err = out.Chown(int(c.UID), int(c.GID))
	}
	if err == nil {
		err = out.Chmod(os.FileMode(c.Mode & 0o777))
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(c.Path)
	}
	return err
}

// openAt opens name in the directory open as dfd for reading, not following
// a symlink.
func openAt(dfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// readAt reads name in the directory open as dfd, not following a symlink.
func readAt(dfd int, name string) ([]byte, error) {
	f, err := openAt(dfd, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// sameContent says whether the file at path and name, in the directory
// open as dfd, hold the same bytes.
func sameContent(path string, dfd int, name string) (bool, error) {
	fa, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := openAt(dfd, name)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea != nil || eb != nil {
			for _, e := range []error{ea, eb} {
				if e != nil && !errors.Is(e, io.EOF) && !errors.Is(e, io.ErrUnexpectedEOF) {
					return false, e
				}
			}
			return ea != nil && eb != nil, nil
		}
	}
}

// removeLinkRemaps removes the links CRIU made for the dump in dir (the
// image keeps its copies), as CRIU does itself when the tree runs on after
// a dump. A --leave-stopped dump that succeeded keeps them for the restore; a source continued instead (a migration that
// failed after its dump, a job's part aborted after its dump or committed
// --leave-running) would leave them behind, one more name of each file,
// and the next dump of the tree would fail on them ("Can't link remap to
// /dev/shm/sem.X: File exists", measured).
func removeLinkRemaps(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	linked, err := linkedRemaps(int(d.Fd()))
	if err != nil || len(linked) == 0 {
		return err
	}
	files, err := filesIn(int(d.Fd()))
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range linkRemapPaths(linked, files) {
		if !linkRemapName.MatchString(filepath.Base(p)) {
			continue
		}
		// its directory without following a link on the way: the name
		// removed is CRIU's, where CRIU made it
		pd, err := unix.Openat2(unix.AT_FDCWD, filepath.Dir(p), &unix.OpenHow{
			Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", filepath.Dir(p), err))
			continue
		}
		err = unix.Unlinkat(pd, filepath.Base(p), 0)
		unix.Close(pd)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
