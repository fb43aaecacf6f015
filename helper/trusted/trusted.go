// Package trusted says whether a file root is about to run or load (CRIU,
// its plugin directory) or use as a private place (a temporary directory) can
// be changed by anyone but root. A path taken from the environment reaches
// root through `sudo -E` from a user, who may have pointed it at a file of
// their own; root then runs that user's code.
package trusted

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrUntrusted: someone other than root may change the file, or a directory
// above it.
var ErrUntrusted = errors.New("not trusted: someone other than root may change it")

// Error names the path and who may change it.
type Error struct {
	Path string // the file or directory at fault
	Why  string
}

func (e *Error) Error() string { return fmt.Sprintf("%s %s", e.Path, e.Why) }
func (e *Error) Unwrap() error { return ErrUntrusted }

// Path resolves p (symlinks, to an absolute path) and checks that the file
// or directory it names, and every directory above it, belongs to root and
// can be written by nobody else. A directory others may write (/tmp) is
// accepted only with the sticky bit, which keeps them from renaming or
// removing root's entries in it. The resolved path is returned: use that,
// not p, since a symlink on p's way may be changed by whoever owns it.
func Path(p string) (string, error) { return resolve(p, false) }

// TempDir is Path for a directory to make private entries in (a temporary
// directory): it may itself be one that others write, if it is sticky
// (/tmp), since nobody else can then rename or remove what root makes there.
func TempDir(p string) (string, error) { return resolve(p, true) }

// resolve makes p absolute, resolves its symlinks and checks the result.
func resolve(p string, stickyLast bool) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	if err := check(real, stickyLast); err != nil {
		return "", err
	}
	return real, nil
}

// check checks real (absolute, no symlinks) and every directory above it;
// with stickyLast, real may be a sticky directory others write.
func check(real string, stickyLast bool) error {
	parts := strings.Split(strings.TrimPrefix(real, "/"), "/")
	cur := "/"
	for i := -1; i < len(parts); i++ {
		if i >= 0 {
			if parts[i] == "" {
				continue
			}
			cur = filepath.Join(cur, parts[i])
		}
		fi, err := os.Lstat(cur)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return &Error{Path: cur, Why: "has no owner this system tells"}
		}
		last := i == len(parts)-1
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return &Error{Path: cur, Why: "changed into a symlink while it was checked"}
		case st.Uid != 0:
			return &Error{Path: cur, Why: fmt.Sprintf("belongs to uid %d, not to root", st.Uid)}
		case fi.Mode().Perm()&0o022 != 0 && ((last && !stickyLast) || !fi.IsDir() || fi.Mode()&fs.ModeSticky == 0):
			return &Error{Path: cur, Why: fmt.Sprintf("can be written by others than root (mode %v)", fi.Mode().Perm())}
		}
	}
	return nil
}

// SystemPath is where root looks for programs when the PATH it was given
// cannot be trusted, as sudo's secure_path does.
var SystemPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// LookPath finds the program name in the directories of pathEnv (a PATH
// value), then in SystemPath, taking the first one that Path trusts. The
// untrusted ones it passed over are returned too, for a message.
func LookPath(name, pathEnv string) (found string, skipped []error, err error) {
	dirs := append(filepath.SplitList(pathEnv), SystemPath...)
	for _, d := range dirs {
		if d == "" || !filepath.IsAbs(d) {
			continue // relative entries name the caller's working directory
		}
		cand := filepath.Join(d, name)
		fi, err := os.Stat(cand)
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		real, err := Path(cand)
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		return real, skipped, nil
	}
	if len(skipped) > 0 {
		return "", skipped, fmt.Errorf("no %s that only root can change on PATH or in %s (passed over: %w)", name,
			strings.Join(SystemPath, ":"), errors.Join(skipped...))
	}
	return "", nil, fmt.Errorf("no %s on PATH or in %s", name, strings.Join(SystemPath, ":"))
}
