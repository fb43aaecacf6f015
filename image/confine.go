package image

// Confining what root does to the images of the user a path belongs to: a
// user's path may be a symlink to another user's image, or an image whose
// manifest names another user's as its parent.

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// pathOwner is whose images a path named to root stands for: the owner of
// the path itself (a symlink's own owner, not its target's). For a process
// other than root, its own uid.
func pathOwner(path string) (int, error) {
	if uid := os.Geteuid(); uid != 0 {
		return uid, nil
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("%s: no owner known", path)
	}
	return int(st.Uid), nil
}

// maxLinks bounds the symlinks ownedPath follows, as the kernel does.
const maxLinks = 40

// ownedPath resolves path (made absolute, symlinks followed) as the kernel
// would, but follows a symlink only if it belongs to uid or to root: a path
// that another user's symlink redirects changes owner on the way, and is
// refused with ErrOwner. The result has no symlinks.
func ownedPath(path string, uid int) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	resolved := "/"
	rest := strings.Split(abs, "/")
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			resolved = filepath.Dir(resolved)
			continue
		}
		next := filepath.Join(resolved, c)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || (st.Uid != 0 && int(st.Uid) != uid) {
			owner := -1
			if ok {
				owner = int(st.Uid)
			}
			return "", &OwnerError{Path: next, UID: owner, Want: uid}
		}
		if links++; links > maxLinks {
			return "", &fs.PathError{Op: "resolve", Path: path, Err: syscall.ELOOP}
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			resolved = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return resolved, nil
}
