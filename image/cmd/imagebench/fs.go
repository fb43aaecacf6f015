package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// filesystemOf describes the filesystem dir lives on, as "TYPE (SOURCE on
// MOUNTPOINT)": the mount in /proc/self/mountinfo with the longest mount point
// that contains dir. Throughput means little without it: tmpfs measures memory
// bandwidth, a disk measures the disk.
func filesystemOf(dir string) string {
	abs, err := filepath.Abs(dir)
	if err == nil {
		if p, err := filepath.EvalSymlinks(abs); err == nil {
			abs = p
		}
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	best, desc := -1, "unknown"
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 2 {
			continue
		}
		mp := unescapeMount(a[4])
		if !within(abs, mp) || len(mp) <= best {
			continue
		}
		best = len(mp)
		desc = fmt.Sprintf("%s (%s on %s)", b[0], unescapeMount(b[1]), mp)
	}
	return desc
}

func within(path, mountPoint string) bool {
	if mountPoint == "/" {
		return true
	}
	return path == mountPoint || strings.HasPrefix(path, mountPoint+"/")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				out.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		out.WriteByte(s[i])
	}
	return out.String()
}
