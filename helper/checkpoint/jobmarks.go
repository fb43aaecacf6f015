package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Parts that name one image directory (-D) on hosts that share its file
// system would write one directory together: each part's dump checks that
// the directory is new or empty, but both may check before either wrote,
// and the image is then a mix no restore takes. So before anything stops,
// when two parts name the same path, each agent leaves a mark of its part
// (.gpucr-job-ID-PART) where its dump would write: in the directory if it
// is there already (it may be a mount of each host's own under a parent
// they share), else beside it, in the parent the dump would make it in.
// Once every part has, each looks for the others' marks there: one found
// is a file system the two hosts share, and the job is refused with the
// way out (a directory a part). Every mark goes again at once, before any
// dump looks at the directory.

// markPrefix is the start of every mark of job id's parts.
func markPrefix(id string) string { return ".gpucr-job-" + id + "-" }

// markDir leaves this part's mark beside its image directory.
func (a *jobAgent) markDir(m jobMsg) error {
	if !filepath.IsAbs(m.Dir) || m.Token == "" || strings.ContainsAny(m.Token, "/.") || m.Part < 0 {
		return a.fail(errors.New("mark-dir without an absolute directory, a token and a part"))
	}
	where := filepath.Clean(m.Dir)
	d, err := unix.Open(where, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		// not there yet: the dump makes it in its parent
		where = filepath.Dir(where)
		d, err = unix.Open(where, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			// no parent either: nothing to share, and the dump makes none
			return a.out.send(jobMsg{Event: evMarked})
		}
	}
	if err != nil {
		return a.fail(fmt.Errorf("%s: %w", where, err))
	}
	defer unix.Close(d)
	name := markPrefix(m.Token) + strconv.Itoa(m.Part)
	fd, err := unix.Openat(d, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return a.fail(fmt.Errorf("a mark in %s: %w", where, err))
	}
	unix.Close(fd)
	a.mark = filepath.Join(where, name)
	return a.out.send(jobMsg{Event: evMarked})
}

// findMarks says which other parts left their marks where this part left
// its own, and removes its own.
func (a *jobAgent) findMarks() error {
	var shared []int
	if a.mark != "" {
		dir, own := filepath.Split(a.mark)
		prefix := own[:strings.LastIndex(own, "-")+1]
		ents, err := os.ReadDir(dir)
		if err != nil {
			return a.fail(fmt.Errorf("the marks beside %s: %w", dir, err))
		}
		for _, e := range ents {
			if n := e.Name(); n != own && strings.HasPrefix(n, prefix) {
				if k, err := strconv.Atoi(strings.TrimPrefix(n, prefix)); err == nil && !slices.Contains(shared, k) {
					shared = append(shared, k)
				}
			}
		}
		a.removeMark()
	}
	return a.out.send(jobMsg{Event: evMarks, Shared: shared})
}

// removeMark removes this part's mark, if it left one.
func (a *jobAgent) removeMark() {
	if a.mark != "" {
		_ = os.Remove(a.mark)
		a.mark = ""
	}
}
