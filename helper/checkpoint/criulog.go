package checkpoint

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpucr/gpucr/helper/proc"
)

// What a failed CRIU run's log says. The RPC's error carries only the first
// "Error" line of CRIU's log, which on hosts where CRIU lacks
// CAP_SYS_RESOURCE is always the harmless rlimit line; the real cause is one
// of the last error lines before CRIU's "Dumping FAILED." (or the log's end:
// a restore of an empty directory stops without it).

// maxCRIUErrors is how many of the last error lines a failure shows.
const maxCRIUErrors = 6

// criuLogLine is "(00.038346) Error (criu/util.c:1534): message": CRIU's
// timestamped lines; a restored task's lines have its pid after the time
// ("(00.027916)   6237: Error (criu/tty.c:1010): ..."). Lines without a
// timestamp (the parasite's "pie: ..." output, a line cut short by a full
// disk) carry no level and are skipped.
var criuLogLine = regexp.MustCompile(`^\(\s*\d+\.\d+\)\s+(?:(\d+): )?(Error|Warn) +\(([^)]*)\): (.*)$`)

// criuFailedLine is the message that ends a failed run's log.
var criuFailedLine = regexp.MustCompile(`^(Dumping|Restoring|Pre-dumping|Lazy-pages|Checking) FAILED`)

// criuNoise are messages CRIU logs in every run here, failed or not, and
// that say nothing about a failure.
var criuNoise = []*regexp.Regexp{
	// CRIU raises its open-file limit; without CAP_SYS_RESOURCE it cannot,
	// and goes on.
	regexp.MustCompile(`^rlimit: Can't setup RLIMIT_NOFILE`),
	// A task stopped in a system call; routine (a sleeping process).
	regexp.MustCompile(`^Will restore \d+ with interrupted system call`),
}

func criuNoiseLine(msg string) bool {
	for _, re := range criuNoise {
		if re.MatchString(msg) {
			return true
		}
	}
	return false
}

// criuDetachFailed is CRIU's word after a plugin refused a dump: it could
// not detach from a task. For a process that runs on it is not so, and
// only hides the plugin's reason.
var criuDetachFailed = regexp.MustCompile(`^Unable to detach from (\d+): No such process$`)

// withoutDetachNoise drops those lines for processes that exist.
func withoutDetachNoise(lines []string) []string {
	var out []string
	for _, l := range lines {
		if m := criuDetachFailed.FindStringSubmatch(l); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil && proc.Exists(proc.Pid(n)) {
				continue
			}
		}
		out = append(out, l)
	}
	return out
}

// criuLogErrors reads a CRIU log and returns the last (up to max) error
// messages before the FAILED line, noise and repeats removed, oldest first. Without any,
// the warnings there instead (a dump of a vanished pid says why only in one).
func criuLogErrors(r io.Reader, max int) ([]string, error) {
	var errs, warns []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := criuLogLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		msg := strings.TrimSpace(m[4])
		if criuFailedLine.MatchString(msg) {
			break
		}
		if criuNoiseLine(msg) {
			continue
		}
		if m[1] != "" {
			msg = "pid " + m[1] + ": " + msg
		}
		// Each message once: a full disk fails every image file alike.
		if m[2] == "Error" && !slices.Contains(errs, msg) {
			errs = append(errs, msg)
		} else if m[2] == "Warn" && !slices.Contains(warns, msg) {
			warns = append(warns, msg)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(errs) == 0 {
		errs = warns
	}
	if len(errs) > max {
		errs = errs[len(errs)-max:]
	}
	return errs, nil
}

// criuLogFile is criuLogErrors of the log at path (in the image directory,
// where others may write: a symlink there is not followed, and anything
// but a regular file, a FIFO say, is refused without waiting on it).
func criuLogFile(path string, max int) ([]string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return criuLogErrors(f, max)
}

// criuStderr are the lines CRIU printed on its stderr, without the
// "criu: " its messages there begin with (a failure shows each as
// "criu: ..." already), and at most maxCRIUErrors of them.
func criuStderr(lines []string) []string {
	var out []string
	for _, l := range lines {
		out = append(out, strings.TrimPrefix(l, "criu: "))
	}
	if len(out) > maxCRIUErrors {
		out = out[:maxCRIUErrors]
	}
	return out
}

// criuOptionComplaint is getopt's complaint about an option of CRIU's
// configuration file, which CRIU prints on its stderr before it opens its
// log: "unrecognized option '--bogus'", "option '--ghost-limit' requires an
// argument", "option '--shell-job' doesn't allow an argument".
var criuOptionComplaint = regexp.MustCompile(`^(unrecognized option|option) '-*([^'=]+)[^']*'(.*)$`)

// criuOptionHints explains CRIU's complaints about its options, each
// naming the --criu-opt that gave the option (extra: CriuOpts.Extra), if
// one did.
func criuOptionHints(said []string, extra []string) []string {
	var out []string
	for _, l := range said {
		m := criuOptionComplaint.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		name, rest := m[2], strings.TrimSpace(m[3])
		given := ""
		for _, e := range extra {
			if f := strings.Fields(strings.TrimLeft(strings.TrimSpace(e), "-")); len(f) > 0 && f[0] == name {
				given = fmt.Sprintf(" (--criu-opt %q)", e)
			}
		}
		var h string
		switch {
		case m[1] == "unrecognized option":
			h = fmt.Sprintf("CRIU has no option %q%s: `criu --help` lists its options; --criu-opt takes one as CRIU's "+
				"configuration file writes it, without dashes (--criu-opt 'ghost-limit 10M')", name, given)
		case strings.Contains(rest, "requires an argument"):
			h = fmt.Sprintf("CRIU's option %q needs a value%s: --criu-opt '%s VALUE'", name, given, name)
		default:
			h = fmt.Sprintf("CRIU refused its option %q%s: %s", name, given, rest)
		}
		out = append(out, h+"; CRIU stopped before it touched the process")
	}
	return out
}

// criuPluginLoaded says whether a CRIU log (-v4) shows that CRIU loaded the
// plugin named name: CRIU 4.2 logs `Plugin "gpucr" (version 512 hooks 13)`
// when it has loaded a plugin and registered its hooks.
func criuPluginLoaded(log, name string) bool {
	return strings.Contains(log, fmt.Sprintf("Plugin %q (version", name))
}

// criuHint explains a CRIU error message gpucr's users meet, in terms of
// gpucr's flags: what a pattern matches, and what to say.
type criuHint struct {
	re   *regexp.Regexp
	hint func(m []string) string
	// namesTask: the hint begins "a process", which criuHintsFor replaces
	// with the process whose step failed (criuTaskFailed), named by its
	// command line, where the messages say which: in a job of many
	// processes, the one to start differently.
	namesTask bool
	// holds, if set, also gives the hint where the process whose step
	// failed has a descriptor or mapping of this name (/proc/PID/fd,
	// /proc/PID/maps): CRIU's own words can be generic, as for an io_uring
	// descriptor, which the kernel does not let its parasite send ("Can't
	// retrieve FDs from socket").
	holds string
}

// criuTaskFailed is CRIU's line for a step of one task that failed
// ("Collect mappings (pid: 1579) failed with -1").
var criuTaskFailed = regexp.MustCompile(`\(pid: (\d+)\) failed`)

// maxHintCommand bounds a command line quoted in a hint.
const maxHintCommand = 160

var criuHints = []criuHint{
	{re: regexp.MustCompile(`Consider using --shell-job|without correspond master peer`), hint: func([]string) string {
		return "the process was started from a terminal, or is not the leader of its own session: " +
			"start it with setsid and stdin from /dev/null, or checkpoint and restore it with --shell-job"
	}},
	{re: regexp.MustCompile(`A session leader of \d+\(\d+\) is outside of its pid namespace`), hint: func([]string) string {
		return "the process is not the leader of its own session, and that session's leader is outside the process's pid namespace " +
			"(as in a container): start it with setsid, so that it leads a session of its own"
	}},
	{re: regexp.MustCompile(`Don't have tty to inherit session from`), hint: func([]string) string {
		return "the process had a terminal; restored with --shell-job it takes the terminal gpucr runs on, and gpucr runs on none"
	}},
	{re: regexp.MustCompile(`External socket is used`), hint: func([]string) string {
		return "a unix socket of the process is connected to a process outside the checkpointed tree " +
			"(gpucr does not pass CRIU's --ext-unix-sk): checkpoint the tree that holds both ends"
	}},
	{re: criuForkTaken, hint: func(m []string) string { return forkTakenHint(m[1]) }},
	{re: regexp.MustCompile(`File (.+) has bad size (\d+) \(expect (\d+)\)`), hint: func(m []string) string {
		// CRIU names the file relative to the root
		if !strings.HasPrefix(m[1], "/") {
			m[1] = "/" + m[1]
		}
		return fmt.Sprintf("the process had %s open, and it is %s bytes long now, not %s as at the checkpoint "+
			"(the process ran on after a --leave-running checkpoint and wrote to it, or something else did): CRIU restores an open file "+
			"only as it was. Restore an image whose files have not changed since (a checkpoint without --leave-running), "+
			"or put the file back as it was; a file the process opens to append to (>> in a shell) is restored whatever its size", m[1], m[2], m[3])
	}},
	{re: regexp.MustCompile(`Can't dump ghost file (\S+) of (\d+) size`), hint: func(m []string) string {
		if !strings.HasPrefix(m[1], "/") {
			m[1] = "/" + m[1]
		}
		n, _ := strconv.ParseInt(m[2], 10, 64)
		return fmt.Sprintf("a process has %s open or mapped after its last name was unlinked, and CRIU copies such a file "+
			"into the image only up to its ghost limit; this one takes %s: pass --criu-opt 'ghost-limit %dM'", m[1], mib(n), wholeMiB(n))
	}, namesTask: true},
	{re: regexp.MustCompile(`Can't create link remap for (\S+?)\.? Use link-remap option`), hint: func(m []string) string {
		return fmt.Sprintf("a process has %s open or mapped after it was unlinked (a POSIX semaphore of Python's "+
			"multiprocessing, in PyTorch's DataLoader or torch.multiprocessing, say): checkpoint with --link-remap", m[1])
	}, namesTask: true},
	{re: regexp.MustCompile(`Can't bind inet socket .*Address already in use`), hint: func([]string) string {
		return "a restored process listens on a TCP port that something of this host holds now (another process, or " +
			"connections in TIME_WAIT that gpucr did not end and that outlasted its wait of a minute): stop what holds it, or restore " +
			"where the port is free"
	}},
	{re: regexp.MustCompile(`Iptables configuration failed|Nftables configuration failed`), hint: func([]string) string {
		return "CRIU locks the network of a process with open TCP connections (--tcp-established) with iptables " +
			"(or nftables), and it is not installed or failed: install it, or, where both ends of every connection are in " +
			"the checkpointed tree (a job's ranks and their store on one host), pass --network-lock skip to the " +
			"checkpoint (gpucr does so by itself when it finds every connection inside the tree; the restore repeats it)"
	}},
	{re: regexp.MustCompile(`anon_inode:\[io_uring\]`), hint: func([]string) string {
		// Measured with PyTorch 2.11: torchrun's agent held one whatever
		// USE_LIBUV, UV_USE_IO_URING or --rdzv-conf use_libuv=0 said; ranks
		// started by torch.multiprocessing, rank 0 hosting the store, with
		// USE_LIBUV=0 UV_USE_IO_URING=0 held none.
		return "a process holds an io_uring instance, which CRIU cannot checkpoint. torchrun's agent holds one " +
			"(PyTorch 2.11, whatever USE_LIBUV or UV_USE_IO_URING say): start the job with `gpucr torchrun` (torchrun's " +
			"options, the script unchanged), or start the ranks with torch.multiprocessing " +
			"instead, rank 0 hosting the store (init_process_group with env://), and USE_LIBUV=0 UV_USE_IO_URING=0 " +
			"set, so that PyTorch's TCPStore does without libuv and io_uring"
	}, namesTask: true, holds: "anon_inode:[io_uring]"},
	{re: regexp.MustCompile(`(?i)no space left on device`), hint: func([]string) string {
		return "the image directory's file system is full"
	}},
	{re: regexp.MustCompile(`Read-only file system`), hint: func([]string) string {
		return "the image directory's file system is read-only"
	}},
	{re: regexp.MustCompile(`another checkpoint of pid (\d+) is running`), hint: func(m []string) string {
		return fmt.Sprintf("pid %s was being checkpointed already (another gpucr checkpoint, or a criu dump or container runtime "+
			"with gpucr's plugin): this checkpoint left it to that one; run it again once that one has ended", m[1])
	}},
	{re: regexp.MustCompile(`Unable to interrupt task: (\d+) \(No such process\)`), hint: func(m []string) string {
		return fmt.Sprintf("process %s exited before CRIU could stop it", m[1])
	}},
}

// criuForkTaken: CRIU could not give a restored task, or a session or
// group leader it makes for them, its pid.
var criuForkTaken = regexp.MustCompile(`Can't fork for (\d+): File exists`)

// forkTakenHint is the hint for a pid of the image that is taken.
func forkTakenHint(pid string) string {
	return fmt.Sprintf("pid %s is taken by another process (the checkpointed process, still running or not yet reaped?): "+
		"a restored process gets its old pid back", pid)
}

// restoreForkHints puts right the hint of a restore's "Can't fork for N"
// where N is no process or thread of the image (imagePids): it is the
// session or process group the image's processes belonged to, whose leader
// was outside the image (the shell of a process dumped with --shell-job),
// and which CRIU makes a process to lead again unless restoring with
// --shell-job. Whether N is taken is beside the point then.
func restoreForkHints(hints, msgs []string, imagePids []proc.Pid, shellJob bool) []string {
	if shellJob || len(imagePids) == 0 {
		return hints
	}
	for _, msg := range msgs {
		m := criuForkTaken.FindStringSubmatch(msg)
		if m == nil {
			continue
		}
		if n, err := strconv.Atoi(m[1]); err != nil || slices.Contains(imagePids, proc.Pid(n)) {
			continue
		}
		generic := forkTakenHint(m[1])
		hints = slices.DeleteFunc(hints, func(h string) bool { return h == generic })
		hints = append(hints, fmt.Sprintf("pid %s is no process of the image: it is the session (or process group) its processes "+
			"belonged to, led by a process outside the image (the shell it was started from); without --shell-job CRIU makes "+
			"a process with pid %s to lead them again, and cannot. The image was dumped with --shell-job: restore it with "+
			"--shell-job too", m[1], m[1]))
	}
	return hints
}

// criuHintsFor returns the hints for a failure's messages, each once. For
// a dump (live), the pids CRIU names are the tree's processes, which a
// failed dump leaves running: a hint may name one, and look at what it
// holds. A restore's pids are of processes that are gone, or of others
// that have them now: none is looked at.
func criuHintsFor(msgs []string, live bool) []string {
	var out []string
	seen := map[string]bool{}
	task, taskOK := failedTask(msgs)
	taskOK = taskOK && live
	add := func(h criuHint, m []string) {
		s := h.hint(m)
		if h.namesTask && taskOK {
			s = namingTask(s, task)
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, h := range criuHints {
		matched := false
		for _, msg := range msgs {
			if m := h.re.FindStringSubmatch(msg); m != nil {
				add(h, m)
				matched = true
				break
			}
		}
		if !matched && h.holds != "" && taskOK && taskHolds(task, h.holds) {
			add(h, nil)
		}
	}
	return out
}

// failedTask is the process whose step CRIU says failed
// ("Dump files (pid: 4140) failed with -1"), as CRIU saw it: a process of
// the tree gpucr checkpointed, which a failed dump leaves running.
func failedTask(msgs []string) (proc.Pid, bool) {
	for _, msg := range msgs {
		if m := criuTaskFailed.FindStringSubmatch(msg); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil && n > 0 {
				return proc.Pid(n), true
			}
		}
	}
	return 0, false
}

// namingTask puts pid in place of a hint's leading "a process": "process
// 1579 (python3 /usr/bin/torchrun ...)", or "process 1579" where it is gone.
func namingTask(hint string, pid proc.Pid) string {
	const lead = "a process "
	if !strings.HasPrefix(hint, lead) {
		return hint
	}
	who := "process " + pid.String()
	if cmd := proc.CommandLine(pid); cmd != "" {
		who += " (" + shortCommand(cmd, maxHintCommand) + ")"
	}
	return who + " " + strings.TrimPrefix(hint, lead)
}

// shortCommand is a command line with its program by its base name
// ("python3 /usr/local/bin/torchrun ..."), cut to max bytes with "...": the
// arguments, not the interpreter's path, say which process it is.
func shortCommand(cmd string, max int) string {
	prog, args, _ := strings.Cut(cmd, " ")
	if i := strings.LastIndexByte(prog, '/'); i >= 0 && i < len(prog)-1 {
		prog = prog[i+1:]
	}
	s := strings.TrimSpace(prog + " " + args)
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max-3], "") + "..."
	}
	return s
}

// taskHolds says whether pid has a descriptor open on, or a mapping of,
// name (an anonymous inode's, "anon_inode:[io_uring]"); false where /proc
// does not say (the process is gone, or not the caller's to look at).
func taskHolds(pid proc.Pid, name string) bool {
	return len(proc.FilesOf(pid, func(f string) bool { return f == name })) > 0
}
