package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
)

// A restored process's unix socket is bound at its old path again, and CRIU
// does not make the directory it was in: Python's multiprocessing keeps its
// listeners (a DataLoader's, torch.multiprocessing's) in /tmp/pymp-*, which it
// removes when the process ends, so the image of a job that ran on after its
// dump and then ended cleanly failed to restore ("unix: Can't bind ...: No
// such file or directory", measured with a DDP job). A restore makes such a
// directory again: one missing level, whose parent is there, owned as the
// socket was.

// socketDir is a directory a bound unix socket of the image lives in, and
// who owned the socket.
type socketDir struct {
	path     string
	uid, gid int
}

// missingSocketDirs lists the directories the bound unix sockets among the
// image's open files need that are missing, with a parent that is there.
func missingSocketDirs(files []*fdinfo.FileEntry) []socketDir {
	var out []socketDir
	for _, fe := range files {
		sk := fe.GetUsk()
		// CRIU keeps the name as the kernel gives it, its NUL included; an
		// abstract name starts with one
		name := strings.TrimRight(string(sk.GetName()), "\x00")
		if sk == nil || sk.GetDeleted() || !strings.HasPrefix(name, "/") || strings.IndexByte(name, 0) >= 0 {
			continue
		}
		d := filepath.Dir(filepath.Clean(name))
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if fi, err := os.Stat(filepath.Dir(d)); err != nil || !fi.IsDir() {
			continue
		}
		sd := socketDir{path: d, uid: int(sk.GetFilePerms().GetUid()), gid: int(sk.GetFilePerms().GetGid())}
		if !slices.ContainsFunc(out, func(o socketDir) bool { return o.path == d }) {
			out = append(out, sd)
		}
	}
	return out
}

// remakeSocketDirs makes the directories missingSocketDirs finds in the
// image in dir (0700, the socket's owner's), and says so.
func remakeSocketDirs(dir string, files []*fdinfo.FileEntry, ev *emitter) error {
	for _, d := range missingSocketDirs(files) {
		if err := os.Mkdir(d.path, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("restore from %s: the directory %s of a unix socket of the image is gone, and making it failed: %w",
				dir, d.path, err)
		}
		if err := os.Lchown(d.path, d.uid, d.gid); err != nil && os.Geteuid() == 0 {
			return fmt.Errorf("restore from %s: the directory %s of a unix socket: %w", dir, d.path, err)
		}
		ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("made %s again: a unix socket of the image was bound in it, and it "+
			"was removed since (a process that ended after its dump removes its own)", d.path)})
	}
	return nil
}
