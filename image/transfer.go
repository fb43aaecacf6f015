package image

// Moving an image directory to another machine (gpucr migrate): Send writes
// it as a tar stream, Receive makes it again at the other end, and
// RemoveReceived takes back what Receive made when the migration fails.
// Both ends run as root for a job that belongs to someone else, who may
// write the directory being sent (their own -D) and the one being received
// into (their own --target-dir), and may swap a file for a symlink or a
// directory for a symlink at any moment. So:
//
//   - the sender moves files, not names: every entry is opened beneath the
//     descriptor of its directory without following a link, and its tar
//     header is made from fstat of what was opened. Only directories and
//     regular files of the sending user (Owner) go: a restore reads only
//     the restoring user's files, so anything else in the directory is
//     someone else's and only a way to have root read it;
//   - the receiver fills only a directory it made itself (0700, its own,
//     so nobody else can add, rename or swap anything in it; or an empty
//     one of its own that nobody else may write, a mount point say),
//     creates every entry beneath descriptors it holds (mkdirat,
//     O_CREAT|O_EXCL|O_NOFOLLOW), takes no owner, mode or time from the
//     stream (files 0600, directories 0700 of the receiving user) and
//     refuses an archive holding anything else than directories and
//     regular files (a link, a device, a FIFO, a sparse file), a name that
//     is absolute or holds "..", or a file twice;
//   - the directory is known afterwards by its identity (device and inode,
//     DirID): a later part of the same image goes into it, and
//     RemoveReceived removes it, only if the path still leads to that very
//     directory; nothing under it is followed.

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// transferBuffer is how much the sender reads from a file, and the
// receiver from the stream, at a time: the tar path over ssh was measured
// at 1.0-1.3 GB/s with 1 MiB records, and half that with tar's default
// 10 KiB ones.
const transferBuffer = 1 << 20

// SendOptions says what of a directory Send sends.
type SendOptions struct {
	// Only, if set, says which entries go (rel is slash-separated,
	// relative to the directory); a directory it refuses is skipped whole.
	Only func(rel string) bool
	// Owner, if set, is the only user whose files and directories go; the
	// others' are not sent (NotSent says which). Send as root for a
	// directory others may write: give root.
	Owner *Owner
}

// SendResult is what Send sent.
type SendResult struct {
	Bytes int64 // the files' content
	Files int
	// NotSent lists the entries left out other than those Only refused:
	// someone else's ("x: belongs to uid 1000"), or neither a directory
	// nor a regular file ("y: symlink"). Their content, if a directory, is
	// not looked at.
	NotSent []string
}

// Send writes the directory dir as a tar stream to w: its directories and
// regular files (as SendOptions says), each opened beneath its directory
// without following a symlink, with a header made from what was opened
// (mode 0700 or 0600, no owner), in name order. A file that shrinks while
// it is sent fails the transfer; one that grows is sent as long as it was.
func Send(w io.Writer, dir string, o SendOptions) (SendResult, error) {
	d, err := openDirPath(dir)
	if err != nil {
		return SendResult{}, fmt.Errorf("sending %s: %w", dir, err)
	}
	defer d.close()
	s := &sender{tw: tar.NewWriter(w), buf: make([]byte, transferBuffer), o: o}
	if err := s.dir(d, ""); err != nil {
		return s.res, fmt.Errorf("sending %s: %w", dir, err)
	}
	if err := s.tw.Close(); err != nil {
		return s.res, fmt.Errorf("sending %s: %w", dir, err)
	}
	return s.res, nil
}

type sender struct {
	tw  *tar.Writer
	buf []byte
	o   SendOptions
	res SendResult
}

func (s *sender) notSent(rel, why string) {
	s.res.NotSent = append(s.res.NotSent, rel+": "+why)
}

// dir sends what d holds, its names prefixed with prefix.
func (s *sender) dir(d *fsDir, prefix string) error {
	names, err := d.f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", d.path, err)
	}
	slices.Sort(names)
	for _, name := range names {
		rel := prefix + name
		if s.o.Only != nil && !s.o.Only(rel) {
			continue
		}
		if err := s.entry(d, name, rel); err != nil {
			return err
		}
	}
	return nil
}

// entry sends the entry name of d (rel in the stream).
func (s *sender) entry(d *fsDir, name, rel string) error {
	// A first look, to leave alone what is not to be opened at all (a
	// FIFO, a device, someone else's file); what goes is decided by the
	// fstat of what was opened.
	st, err := d.lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed meanwhile
	}
	if err != nil {
		return err
	}
	mode := statMode(st.Mode)
	if !mode.IsDir() && !mode.IsRegular() {
		s.notSent(rel, fileKind(mode))
		return nil
	}
	if s.o.Owner != nil && int(st.Uid) != s.o.Owner.UID {
		s.notSent(rel, fmt.Sprintf("belongs to uid %d", st.Uid))
		return nil
	}
	if mode.IsDir() {
		sub, err := d.openDir(name, s.o.Owner)
		if err != nil {
			return s.changed(rel, err)
		}
		defer sub.close()
		h := &tar.Header{Typeflag: tar.TypeDir, Name: rel, Mode: dirMode, ModTime: modTime(sub.f)}
		if err := s.tw.WriteHeader(h); err != nil {
			return fmt.Errorf("send %s: %w", sub.path, err)
		}
		return s.dir(sub, rel+"/")
	}
	f, err := d.openFile(name, unix.O_RDONLY, s.o.Owner)
	if err != nil {
		return s.changed(rel, err)
	}
	defer f.Close()
	fi, err := f.Stat() // what was opened, not what the name was
	if err != nil {
		return fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	size := fi.Size()
	h := &tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: fileMode, Size: size, ModTime: fi.ModTime()}
	if err := s.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("send %s: %w", f.Name(), err)
	}
	// A LimitedReader, not the file itself: io.CopyBuffer would hand an
	// *os.File's own WriteTo the copy, which uses 32 KiB at a time.
	n, err := io.CopyBuffer(s.tw, &io.LimitedReader{R: f, N: size}, s.buf)
	s.res.Bytes += n
	if err != nil {
		return fmt.Errorf("send %s: %w", f.Name(), err)
	}
	if n < size {
		return fmt.Errorf("send %s: it shrank to %d bytes while it was sent (it had %d)", f.Name(), n, size)
	}
	s.res.Files++
	return nil
}

// changed turns the failed open of an entry the first look accepted into
// a reason it is not sent, where the entry changed in between (a symlink,
// another kind of file, another owner, gone): the tree is someone else's
// to change, and what they put there is not sent. Other errors fail.
func (s *sender) changed(rel string, err error) error {
	var fte *FileTypeError
	var oe *OwnerError
	switch {
	case errors.As(err, &fte):
		s.notSent(rel, fte.Is+" (swapped in while it was sent)")
	case errors.As(err, &oe):
		s.notSent(rel, fmt.Sprintf("belongs to uid %d (swapped in while it was sent)", oe.UID))
	case errors.Is(err, fs.ErrNotExist):
	default:
		return err
	}
	return nil
}

// modTime is f's modification time (the zero time if unknown).
func modTime(f *os.File) time.Time {
	if fi, err := f.Stat(); err == nil {
		return fi.ModTime()
	}
	return time.Time{}
}

// DirID identifies the directory Receive made: its device and inode.
type DirID struct {
	Dev, Ino uint64
}

func (id DirID) String() string { return fmt.Sprintf("%d:%d", id.Dev, id.Ino) }

// ParseDirID reads a DirID as String writes it ("DEV:INO").
func ParseDirID(s string) (DirID, error) {
	a, b, ok := strings.Cut(s, ":")
	dev, err1 := strconv.ParseUint(a, 10, 64)
	ino, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || ino == 0 {
		return DirID{}, fmt.Errorf("directory identity %q: want DEV:INO", s)
	}
	return DirID{dev, ino}, nil
}

func idOfStat(st *unix.Stat_t) DirID { return DirID{uint64(st.Dev), st.Ino} }

// NotEmptyError: the directory a migration is to receive into already
// holds something, which it neither mixes with nor replaces.
type NotEmptyError struct{ Path string }

func (e *NotEmptyError) Error() string {
	return e.Path + " is not empty: an image is received only into a new or empty directory"
}

// Receiver fills one directory it made with what tar streams hold.
type Receiver struct {
	root *fsDir
	id   DirID
	made bool
	uid  int
	// parent is the directory the last entry went into (rel, open), kept
	// for the next: a stream from Send lists a directory's files together.
	parentRel string
	parent    *fsDir
}

// ID is the identity of the receiving directory.
func (r *Receiver) ID() DirID { return r.id }

// Made says whether the receiver made the directory (false: it used an
// empty one of its own that nobody else may write, a mount point say).
func (r *Receiver) Made() bool { return r.made }

// Path is the receiving directory's path, for messages.
func (r *Receiver) Path() string { return r.root.path }

// Close lets the directory go (it stays).
func (r *Receiver) Close() {
	if r.parent != nil && r.parent != r.root {
		r.parent.close()
	}
	r.root.close()
}

// splitTarget splits the path of a receiving directory into its parent
// (the caller's path: symlinks there are followed, as for any path a
// program is given) and its last name (never followed).
func splitTarget(path string) (parent, name string, err error) {
	clean := filepath.Clean(path)
	parent, name = filepath.Split(clean)
	if name == "" || name == "." || name == ".." || clean == "/" {
		return "", "", fmt.Errorf("%q cannot be a received image's directory: it needs a name of its own", path)
	}
	if parent == "" {
		parent = "."
	}
	return parent, name, nil
}

// NewReceiver makes the directory path to receive an image into: a new
// directory, 0700, of this process's user. A directory already there must
// be empty (else *NotEmptyError) and not a symlink (not followed); one of
// this user's that nobody else may write is used as it is (a mount point
// cannot be replaced), any other is removed and made again, so that the
// directory the image goes into is one nobody else can write.
func NewReceiver(path string) (*Receiver, error) {
	parentPath, name, err := splitTarget(path)
	if err != nil {
		return nil, err
	}
	pd, err := openDirPath(parentPath)
	if err != nil {
		return nil, fmt.Errorf("the directory of %s: %w", path, err)
	}
	defer pd.close()
	uid := os.Geteuid()
	made := true
	switch st, err := pd.lstat(name); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		mode := statMode(st.Mode)
		if !mode.IsDir() {
			return nil, &FileTypeError{Path: pd.join(name), Is: fileKind(mode), Want: "directory"}
		}
		if err := emptyDir(pd, name); err != nil {
			return nil, err
		}
		if int(st.Uid) == uid && st.Mode&0o022 == 0 {
			made = false
			break
		}
		// Someone else's, or writable by others: it goes, and this
		// process makes its own (rmdir removes only an empty directory,
		// and neither follows nor crosses a mount).
		if err := unix.Unlinkat(pd.fd(), name, unix.AT_REMOVEDIR); err != nil {
			switch err {
			case unix.ENOTEMPTY, unix.EEXIST:
				return nil, &NotEmptyError{Path: pd.join(name)}
			case unix.EBUSY:
				return nil, fmt.Errorf("%s is a mount point of uid %d, mode %04o: an image is received only into a directory of its own (uid %d) that nobody else may write; make it so, or name a directory inside it",
					pd.join(name), st.Uid, st.Mode&0o7777, uid)
			}
			return nil, &fs.PathError{Op: "replace the empty directory", Path: pd.join(name), Err: err}
		}
	}
	if made {
		if err := unix.Mkdirat(pd.fd(), name, dirMode); err != nil {
			if err == unix.EEXIST {
				return nil, fmt.Errorf("%s appeared while it was made: someone else writes its directory", pd.join(name))
			}
			return nil, &fs.PathError{Op: "mkdir", Path: pd.join(name), Err: err}
		}
	}
	d, err := pd.openDir(name, nil)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.fd(), &st); err != nil {
		d.close()
		return nil, fmt.Errorf("stat %s: %w", d.path, err)
	}
	// Between the mkdir and the open, whoever may write the parent may
	// have put another directory in its place: only this user's own empty
	// one is used (nobody else can make a directory of its), that nobody
	// else may write.
	if int(st.Uid) != uid || st.Mode&0o022 != 0 || (made && st.Mode&0o077 != 0) {
		d.close()
		return nil, fmt.Errorf("%s was replaced while it was made (uid %d, mode %04o)", d.path, st.Uid, st.Mode&0o7777)
	}
	if err := isEmpty(d); err != nil {
		d.close()
		return nil, err
	}
	return &Receiver{root: d, id: idOfStat(&st), made: made, uid: uid}, nil
}

// OpenReceiver opens the directory path that NewReceiver made (id), for a
// later part of the image: the path must lead to that very directory (its
// last name not a symlink), still this user's alone.
func OpenReceiver(path string, id DirID) (*Receiver, error) {
	d, err := openReceived(path, id)
	if err != nil {
		return nil, err
	}
	return &Receiver{root: d, id: id, made: true, uid: os.Geteuid()}, nil
}

// openReceived opens the directory id at path, refusing any other.
func openReceived(path string, id DirID) (*fsDir, error) {
	parentPath, name, err := splitTarget(path)
	if err != nil {
		return nil, err
	}
	pd, err := openDirPath(parentPath)
	if err != nil {
		return nil, fmt.Errorf("the directory of %s: %w", path, err)
	}
	defer pd.close()
	d, err := pd.openDir(name, nil)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.fd(), &st); err != nil {
		d.close()
		return nil, fmt.Errorf("stat %s: %w", d.path, err)
	}
	if got := idOfStat(&st); got != id || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		d.close()
		return nil, fmt.Errorf("%s is not the directory the image was received into (%s; found %s, uid %d, mode %04o): left as it is",
			d.path, id, got, st.Uid, st.Mode&0o7777)
	}
	return d, nil
}

// emptyDir refuses the directory name of pd unless it is empty.
func emptyDir(pd *fsDir, name string) error {
	d, err := pd.openDir(name, nil)
	if err != nil {
		return err
	}
	defer d.close()
	return isEmpty(d)
}

// isEmpty refuses d unless it is empty.
func isEmpty(d *fsDir) error {
	names, err := d.f.Readdirnames(1)
	if len(names) > 0 {
		return &NotEmptyError{Path: d.path}
	}
	if err != nil && err != io.EOF {
		return fmt.Errorf("read directory %s: %w", d.path, err)
	}
	return nil
}

// receiveBuffer is the stream's read buffer and the files' copy buffer of
// one Receive, kept for the next.
type receiveBuffer struct {
	in   *bufio.Reader
	copy []byte
}

var receiveBuffers = sync.Pool{New: func() any {
	return &receiveBuffer{in: bufio.NewReaderSize(nil, transferBuffer), copy: make([]byte, transferBuffer)}
}}

// ReceiveResult is what one stream made.
type ReceiveResult struct {
	Files int   `json:"files"`
	Dirs  int   `json:"dirs"`
	Bytes int64 `json:"bytes"`
}

// Receive makes the directories and files of the tar stream in the
// receiving directory. A directory may come again (a later part's
// directories are there already), a file only once; every entry's
// directory must have come before it.
func (r *Receiver) Receive(stream io.Reader) (ReceiveResult, error) {
	var res ReceiveResult
	bufs := receiveBuffers.Get().(*receiveBuffer)
	defer receiveBuffers.Put(bufs)
	bufs.in.Reset(stream)
	defer bufs.in.Reset(nil)
	tr := tar.NewReader(bufs.in)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return res, nil
		}
		if err != nil {
			return res, fmt.Errorf("receiving into %s: the archive, after %d entries: %w", r.root.path, res.Files+res.Dirs, err)
		}
		rel, err := entryName(h)
		if err == nil {
			err = r.entry(h, rel, tr, bufs.copy, &res)
		}
		if err != nil {
			return res, fmt.Errorf("receiving into %s: %w", r.root.path, err)
		}
	}
}

// EntryError is an entry of a received archive that is refused.
type EntryError struct {
	Name string // as the archive has it
	Why  string
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("archive entry %q refused: %s", e.Name, e.Why)
}

// entryName checks the name of a received entry and returns it clean:
// relative, slash-separated, no "." or ".." or empty component (a
// directory's may end in "/"), no NUL; only a directory or a regular file
// (not a sparse one).
func entryName(h *tar.Header) (string, error) {
	switch h.Typeflag {
	case tar.TypeDir, tar.TypeReg:
	default:
		return "", &EntryError{Name: h.Name, Why: "it is a " + typeName(h.Typeflag) + ": only directories and regular files are received"}
	}
	// A sparse file's holes come out of the reader as zeros that the
	// stream does not hold: a few bytes could fill the disk.
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return "", &EntryError{Name: h.Name, Why: "it is a sparse file: only directories and regular files are received"}
		}
	}
	name := h.Name
	if h.Typeflag == tar.TypeDir {
		name = strings.TrimSuffix(name, "/")
	}
	switch {
	case name == "":
		return "", &EntryError{Name: h.Name, Why: "an empty name"}
	case strings.HasPrefix(name, "/"):
		return "", &EntryError{Name: h.Name, Why: "an absolute name"}
	case strings.ContainsRune(name, 0):
		return "", &EntryError{Name: h.Name, Why: "a NUL in the name"}
	}
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "..":
			return "", &EntryError{Name: h.Name, Why: `".." in the name`}
		case "", ".":
			return "", &EntryError{Name: h.Name, Why: "an empty or \".\" component in the name"}
		}
	}
	return name, nil
}

// typeName names a tar entry type for messages.
func typeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "FIFO"
	case tar.TypeCont:
		return "contiguous file"
	case tar.TypeGNUSparse:
		return "GNU sparse file"
	case tar.TypeGNULongName, tar.TypeGNULongLink, tar.TypeXHeader, tar.TypeXGlobalHeader:
		return "stray extended header"
	}
	return fmt.Sprintf("entry of type %q", t)
}

// entry makes the entry rel.
func (r *Receiver) entry(h *tar.Header, rel string, tr io.Reader, buf []byte, res *ReceiveResult) error {
	parentRel, base := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		parentRel, base = rel[:i], rel[i+1:]
	}
	pd, err := r.dirOf(parentRel, h.Name)
	if err != nil {
		return err
	}
	if h.Typeflag == tar.TypeDir {
		err := unix.Mkdirat(pd.fd(), base, dirMode)
		if err == unix.EEXIST {
			// There already: a directory of this user's (made by this
			// receiver, or by an earlier part), or refused.
			st, serr := pd.lstat(base)
			if serr != nil {
				return serr
			}
			if mode := statMode(st.Mode); !mode.IsDir() || int(st.Uid) != r.uid {
				return &EntryError{Name: h.Name, Why: fmt.Sprintf("%s is there already as a %s", rel, fileKind(mode))}
			}
			return nil
		}
		if err != nil {
			return &fs.PathError{Op: "mkdir", Path: pd.join(base), Err: err}
		}
		res.Dirs++
		return nil
	}
	f, err := pd.create(base, unix.O_WRONLY, nil)
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			return &EntryError{Name: h.Name, Why: rel + " is there already (a file comes once)"}
		}
		return err
	}
	// Not f itself as the destination: io.CopyBuffer would hand the copy
	// to its ReadFrom, which uses 32 KiB at a time.
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, tr, buf)
	res.Bytes += n
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	res.Files++
	return nil
}

// dirOf opens the received directory rel (the entry name's directory,
// for messages) beneath the root, through no symlink; it must be a
// directory of this user's.
func (r *Receiver) dirOf(rel, entry string) (*fsDir, error) {
	if rel == "" {
		return r.root, nil
	}
	if r.parent != nil && r.parentRel == rel {
		return r.parent, nil
	}
	d, err := r.root.openDir(rel, &Owner{UID: r.uid})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &EntryError{Name: entry, Why: "its directory " + rel + " is not in the archive before it"}
		}
		var fte *FileTypeError
		if errors.As(err, &fte) {
			return nil, &EntryError{Name: entry, Why: fmt.Sprintf("%s is a %s, not a directory", rel, fte.Is)}
		}
		return nil, err
	}
	if r.parent != nil && r.parent != r.root {
		r.parent.close()
	}
	r.parentRel, r.parent = rel, d
	return d, nil
}

// RemoveReceived removes what NewReceiver made at path (id) and the
// image received into it: the path must lead to that very directory, still
// this user's alone (else nothing is removed); everything beneath it is
// removed beneath descriptors, following no symlink and crossing no mount;
// then the directory itself, unless keepDir (one NewReceiver used as it
// was). A path that leads nowhere is nothing to remove.
func RemoveReceived(path string, id DirID, keepDir bool) error {
	d, err := openReceived(path, id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.close()
	if err := removeBeneath(d, id.Dev); err != nil {
		return err
	}
	if keepDir {
		return nil
	}
	parentPath, name, _ := splitTarget(path)
	pd, err := openDirPath(parentPath)
	if err != nil {
		return fmt.Errorf("the directory of %s: %w", path, err)
	}
	defer pd.close()
	// The name must still be the directory emptied: rmdir removes only an
	// empty directory, so what a race could remove instead is an empty one.
	st, err := pd.lstat(name)
	if err != nil {
		return err
	}
	if idOfStat(&st) != id {
		return fmt.Errorf("%s is not the directory the image was received into any more: left as it is", pd.join(name))
	}
	if err := unix.Unlinkat(pd.fd(), name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return &fs.PathError{Op: "remove", Path: pd.join(name), Err: err}
	}
	return nil
}

// removeBeneath removes everything d holds: files are unlinked, and
// directories (on device dev: a mount is not crossed) emptied through
// their own descriptors, then removed. Nobody else may write a received
// directory, so what was read is all there is. It is Remove's walk, its
// count of what was freed left unread.
func removeBeneath(d *fsDir, dev uint64) error {
	return removeTreeIn(d, dev, map[fileID]*linkCount{}, false)
}
