// Package mountinfo tells which mount a path lives on, from
// /proc/self/mountinfo: where an image directory is decides how fast images
// are written (a tmpfs measures memory bandwidth, huge pages or not; a disk
// measures the disk), so gpucr check and the image benchmark report it.
package mountinfo

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	Point   string   // where it is mounted
	FSType  string   // tmpfs, ext4, ...
	Source  string   // what is mounted
	Options []string // the super block's (tmpfs: size=, huge=)
}

// Option is the value of the super block option name ("" if absent).
func (m Mount) Option(name string) string {
	for _, o := range m.Options {
		if k, v, _ := strings.Cut(o, "="); k == name {
			return v
		}
	}
	return ""
}

func (m Mount) String() string { return fmt.Sprintf("%s (%s on %s)", m.FSType, m.Source, m.Point) }

// Of is the mount path (which exists; symlinks are resolved) is on: the one
// with the longest mount point above it, among the mounts of its device if
// any of them is (bind mounts, overmounts), else among all.
func Of(path string) (Mount, error) {
	real, err := filepath.Abs(path)
	if err != nil {
		return Mount{}, err
	}
	if real, err = filepath.EvalSymlinks(real); err != nil {
		return Mount{}, err
	}
	var st unix.Stat_t
	if err := unix.Stat(real, &st); err != nil {
		return Mount{}, fmt.Errorf("stat %s: %w", real, err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return Mount{}, err
	}
	var best, bestAny Mount
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		m := Mount{Point: unescape(f[4]), FSType: g[0], Source: unescape(g[1]), Options: strings.Split(g[2], ",")}
		if !within(real, m.Point) {
			continue
		}
		if len(m.Point) >= len(bestAny.Point) {
			bestAny = m
		}
		if f[2] == dev && len(m.Point) >= len(best.Point) {
			best, found = m, true
		}
	}
	if found {
		return best, nil
	}
	if bestAny.Point == "" {
		return Mount{}, fmt.Errorf("%s: on no mount of /proc/self/mountinfo", real)
	}
	return bestAny, nil
}

func within(path, point string) bool {
	if point == "/" {
		return true
	}
	return path == point || strings.HasPrefix(path, point+"/")
}

// unescape undoes mountinfo's octal escapes (\040 for a blank).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
