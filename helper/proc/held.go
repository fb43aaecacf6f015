package proc

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Holder is a process that keeps a pid in use.
type Holder struct {
	Pid   Pid
	State byte // 'Z': a zombie its parent has not reaped
	PPid  Pid  // who would reap it
}

// Holders lists the processes, zombies included, that keep any of pids in
// use: one whose pid, process group or session is one of them, or a thread
// whose id is one of them (then Pid is that thread's id). The kernel
// gives a held pid to no new process, so a restore of a dumped tree, which
// must get its pids back, fails ("Can't fork for PID: File exists") while a
// holder is left; a dumped tree's forked children linger as zombies holding
// the root's pid as their session until whoever inherited them reaps them.
func Holders(pids []Pid) []Holder {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []Holder
	for _, e := range ents {
		n, err := strconv.ParseInt(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		pid := Pid(n)
		st, err := ReadStat(pid)
		if err != nil {
			continue // gone meanwhile
		}
		if slices.Contains(pids, pid) || slices.Contains(pids, st.PGrp) || slices.Contains(pids, st.Session) {
			out = append(out, Holder{Pid: pid, State: st.State, PPid: st.PPid})
		}
	}
	// threads are not listed in /proc, but /proc/TID answers for them
	for _, p := range pids {
		if slices.ContainsFunc(out, func(h Holder) bool { return h.Pid == p }) {
			continue
		}
		if st, err := ReadStat(p); err == nil {
			out = append(out, Holder{Pid: p, State: st.State, PPid: st.PPid})
		}
	}
	return out
}

// Comm is pid's command name (/proc/PID/comm), "" if unknown.
func Comm(pid Pid) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// releasePoll is how often WaitReleased looks again.
const releasePoll = 10 * time.Millisecond

// WaitReleased waits until no process holds any of pids (Holders) or ctx
// ends, and returns the holders left then (none: all released).
func WaitReleased(ctx context.Context, pids []Pid) []Holder {
	t := time.NewTicker(releasePoll)
	defer t.Stop()
	for {
		h := Holders(pids)
		if len(h) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return h
		case <-t.C:
		}
	}
}
