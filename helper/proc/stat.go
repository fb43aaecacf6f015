// Package proc is what the helper knows of other processes: what /proc says
// of a pid (stat.go), and a process held by a pidfd (process.go), which names
// that one process for as long as it is held and never another one that
// reuses its pid.
package proc

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Stat is what the helper reads of /proc/PID/stat.
type Stat struct {
	State   byte   // field 3: R, S, D, Z, X...
	PPid    Pid    // field 4
	PGrp    Pid    // field 5: process group
	Session Pid    // field 6
	Flags   uint64 // field 9: the kernel's PF_* task flags
	Start   uint64 // field 22: start time in clock ticks after boot; tells a reused pid apart
}

// Alive says the process has not exited (it is no zombie, not dead).
func (s Stat) Alive() bool { return s.State != 'Z' && s.State != 'X' }

// ReadStat reads /proc/PID/stat.
func ReadStat(pid Pid) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	return parseStat(pid, b)
}

// parseStat parses the text of /proc/PID/stat. The command name (field 2)
// may hold blanks and parentheses: the fields after it start after its last
// ')'.
func parseStat(pid Pid, b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:])) // field 3 onwards
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var st Stat
	st.State = f[0][0]
	num := func(field int, bits int) (uint64, error) {
		v, err := strconv.ParseUint(f[field-3], 10, bits)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: field %d: %w", pid, field, err)
		}
		return v, nil
	}
	ppid, err := num(4, 31)
	if err != nil {
		return Stat{}, err
	}
	pgrp, err := num(5, 31)
	if err != nil {
		return Stat{}, err
	}
	sid, err := num(6, 31)
	if err != nil {
		return Stat{}, err
	}
	if st.Flags, err = num(9, 64); err != nil {
		return Stat{}, err
	}
	if st.Start, err = num(22, 64); err != nil {
		return Stat{}, err
	}
	st.PPid, st.PGrp, st.Session = Pid(ppid), Pid(pgrp), Pid(sid)
	return st, nil
}

// statusField is the value of the line "name:" of /proc/PID/status, split
// into its blank-separated words; nil if there is none.
func statusField(pid Pid, name string) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == name+":" {
			return f[1:], nil
		}
	}
	return nil, nil
}

// NsPid is pid's pid in its own (innermost) pid namespace; 0 if unknown.
func NsPid(pid Pid) Pid {
	f, _ := statusField(pid, "NSpid")
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.ParseInt(f[len(f)-1], 10, 32)
	return Pid(n)
}

// NsSession is pid's session id in its own (innermost) pid namespace, as
// getsid(0) inside it returns it: 0 when the session's leader lives outside
// that namespace. ok is false when /proc does not say (no such process, or a
// kernel without the NSsid line).
func NsSession(pid Pid) (sid Pid, ok bool) {
	f, err := statusField(pid, "NSsid")
	if err != nil || len(f) == 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(f[len(f)-1], 10, 32)
	if err != nil {
		return 0, false
	}
	return Pid(n), true
}

// ThreadGroup is the process a task id belongs to (/proc/TID/status's
// Tgid): tid itself for a process, its process's pid for a thread.
func ThreadGroup(tid Pid) (Pid, error) {
	f, err := statusField(tid, "Tgid")
	if err != nil {
		return 0, err
	}
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/%d/status: no Tgid line", tid)
	}
	n, err := strconv.ParseInt(f[0], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/status: Tgid: %w", tid, err)
	}
	return Pid(n), nil
}

// EffectiveUID is the effective uid of pid (the second of /proc/PID/status's
// Uid: line).
func EffectiveUID(pid Pid) (uint32, error) {
	f, err := statusField(pid, "Uid")
	if err != nil {
		return 0, err
	}
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/status: no Uid line", pid)
	}
	v, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/status: Uid: %w", pid, err)
	}
	return uint32(v), nil
}

// SamePidNS reports whether pid lives in this process's own pid namespace
// (then its pid there is the one this process sees). Unknown counts as the
// same: the pid is all there is to go by.
func SamePidNS(pid Pid) bool {
	mine, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return true
	}
	its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return true
	}
	return mine == its
}

// Children lists pid's children: the union of /proc/PID/task/TID/children
// over its threads (a child belongs to the thread that forked it); on a
// kernel without those files (CONFIG_PROC_CHILDREN), the processes whose
// parent is pid.
func Children(pid Pid) ([]Pid, error) {
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		return nil, fmt.Errorf("no process %d", pid)
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		return nil, err
	}
	if len(tasks) == 0 {
		return childrenByParent(pid)
	}
	var out []Pid
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread has exited
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.ParseInt(f, 10, 32); err == nil && !slices.Contains(out, Pid(c)) {
				out = append(out, Pid(c))
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// childrenByParent scans /proc for the processes whose parent is pid.
func childrenByParent(pid Pid) ([]Pid, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Pid
	for _, e := range ents {
		p, err := strconv.ParseInt(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		if st, err := ReadStat(Pid(p)); err == nil && st.PPid == pid {
			out = append(out, Pid(p))
		}
	}
	slices.Sort(out)
	return out, nil
}

// Tree is pid and all its descendants (children recursively): the tree CRIU
// dumps for pid.
func Tree(pid Pid) []Pid {
	tree := []Pid{pid}
	for i := 0; i < len(tree); i++ {
		kids, err := Children(tree[i])
		if err != nil {
			continue // exited meanwhile
		}
		for _, k := range kids {
			if !slices.Contains(tree, k) {
				tree = append(tree, k)
			}
		}
	}
	return tree
}

// Exists says whether pid is a process (a zombie is not).
func Exists(pid Pid) bool {
	st, err := ReadStat(pid)
	return err == nil && st.Alive()
}

// pfExiting is the kernel's PF_EXITING task flag (/proc/PID/stat field 9).
const pfExiting = 0x4

// RunsOn reports whether pid is the process that started at start ticks
// after boot (0: any) and will run on: not a zombie, not exiting, no
// SIGKILL pending (CRIU kills a dumped tree just before it exits, so a
// process it killed may still look alive for a moment).
func RunsOn(pid Pid, start uint64) bool {
	st, err := ReadStat(pid)
	if err != nil || !st.Alive() || (start != 0 && st.Start != start) || st.Flags&pfExiting != 0 {
		return false
	}
	return !SigkillPending(pid)
}

// SigkillPending says SIGKILL is queued for pid's thread or its whole
// process.
func SigkillPending(pid Pid) bool {
	for _, name := range []string{"SigPnd", "ShdPnd"} {
		f, _ := statusField(pid, name)
		if len(f) != 1 {
			continue
		}
		if m, err := strconv.ParseUint(f[0], 16, 64); err == nil && m&(1<<(9-1)) != 0 {
			return true
		}
	}
	return false
}

// deviceFilePrefixes are the files of a GPU driver that CRIU cannot dump:
// the NVIDIA driver's device nodes, and the simulated driver's stand-in for
// them (tests/sim/sim_devfile.c: a perf event, which CRIU refuses alike).
var deviceFilePrefixes = []string{"/dev/nvidia", "anon_inode:[perf_event]"}

// DeviceFiles lists the GPU driver's files pid has open or mapped (each
// once): a process that holds one uses the GPU, and CRIU cannot dump it
// unless its GPU state is checkpointed first.
func DeviceFiles(pid Pid) []string {
	return FilesOf(pid, func(name string) bool {
		return slices.ContainsFunc(deviceFilePrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
	})
}

// FilesOf lists the files pid has open or mapped, by the names /proc gives
// them (a path, "anon_inode:[io_uring]"), each once, those keep accepts;
// none where /proc does not say (the process is gone, or not the caller's
// to look at).
func FilesOf(pid Pid, keep func(name string) bool) []string {
	var out []string
	add := func(name string) {
		if keep(name) && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil {
			add(l)
		}
	}
	if maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); err == nil {
		for _, line := range strings.Split(string(maps), "\n") {
			if f := strings.Fields(line); len(f) >= 6 {
				add(strings.Join(f[5:], " "))
			}
		}
	}
	return out
}

// OwnFDs lists this process's open file descriptors.
func OwnFDs() []int {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []int
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, fd)
		}
	}
	return out
}
