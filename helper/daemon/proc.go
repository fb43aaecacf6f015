package daemon

// What the helper reads of other processes in /proc.

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procStatus is what the helper reads of /proc/PID/stat.
type procStatus struct {
	state byte   // field 3: R, S, D, Z, X...
	flags uint64 // field 9: the kernel's PF_* task flags
	start uint64 // field 22: start time in clock ticks after boot; tells a reused pid apart
}

func (p procStatus) alive() bool { return p.state != 'Z' && p.state != 'X' }

func procStat(pid int32) (procStatus, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStatus{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStatus{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:]) // field 3 onwards
	if len(f) < 20 || len(f[0]) != 1 {
		return procStatus{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStatus{}, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return procStatus{}, fmt.Errorf("/proc/%d/stat: flags: %w", pid, err)
	}
	return procStatus{state: f[0][0], flags: flags, start: start}, nil
}

// nsPid is pid's pid in its own (innermost) pid namespace, from
// /proc/PID/status; 0 if unknown.
func nsPid(pid int32) int32 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "NSpid:" {
			n, _ := strconv.Atoi(f[len(f)-1])
			return int32(n)
		}
	}
	return 0
}

// samePidNS reports whether pid lives in the helper's own pid namespace
// (then its pid there is the one the helper sees). Unknown counts as the
// same: the pid is all there is to go by.
func samePidNS(pid int32) bool {
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

// processRunsOn reports whether pid is the process that started at start
// ticks after boot (0: any) and will run on: not a zombie, not exiting, no
// SIGKILL pending (CRIU kills a dumped tree just before it exits, so a
// process it killed may still look alive for a moment).
func processRunsOn(pid int32, start uint64) bool {
	st, err := procStat(pid)
	if err != nil || !st.alive() || (start != 0 && st.start != start) || st.flags&pfExiting != 0 {
		return false
	}
	return !sigkillPending(pid)
}

// pfExiting is the kernel's PF_EXITING task flag (/proc/PID/stat field 9).
const pfExiting = 0x4

// sigkillPending: SIGKILL is queued for pid's thread or its whole process.
func sigkillPending(pid int32) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[0] == "SigPnd:" || f[0] == "ShdPnd:") {
			if m, err := strconv.ParseUint(f[1], 16, 64); err == nil && m&(1<<(9-1)) != 0 {
				return true
			}
		}
	}
	return false
}
