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
	// Threads are ids asked about that are threads of this process (its
	// pid is not among them unless asked about too).
	Threads []Pid
}

// Holders lists the processes, zombies included, that keep any of pids in
// use: one whose pid, process group or session is one of them, or whose
// thread has one of them as its id (Threads). The kernel gives a held pid
// to no new process, so a restore of a dumped tree, which must get its pids
// back, fails ("Can't fork for PID: File exists") while a holder is left; a
// dumped tree's forked children linger as zombies holding the root's pid as
// their session until whoever inherited them reaps them.
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
	// Threads are not listed in /proc, but /proc/TID answers for them: each
	// is told as a thread of its process, not as a process of its own.
	for _, p := range pids {
		if slices.ContainsFunc(out, func(h Holder) bool { return h.Pid == p || slices.Contains(h.Threads, p) }) {
			continue
		}
		if _, err := ReadStat(p); err != nil {
			continue
		}
		leader, err := ThreadGroup(p)
		if err != nil || leader == p {
			leader = p // a process /proc did not list a moment ago
		}
		i := slices.IndexFunc(out, func(h Holder) bool { return h.Pid == leader })
		if i < 0 {
			st, err := ReadStat(leader)
			if err != nil {
				continue // gone meanwhile
			}
			out = append(out, Holder{Pid: leader, State: st.State, PPid: st.PPid})
			i = len(out) - 1
		}
		if leader != p {
			out[i].Threads = append(out[i].Threads, p)
		}
	}
	return out
}

// Comm is pid's command name (/proc/PID/comm), "" if unknown.
func Comm(pid Pid) string {
	b, err := os.ReadFile("/proc/" + pid.String() + "/comm")
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
