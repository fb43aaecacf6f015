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
}

var criuHints = []criuHint{
	{regexp.MustCompile(`Consider using --shell-job|without correspond master peer`), func([]string) string {
		return "the process was started from a terminal, or is not the leader of its own session: " +
			"start it with setsid and stdin from /dev/null, or checkpoint and restore it with --shell-job"
	}},
	{regexp.MustCompile(`A session leader of \d+\(\d+\) is outside of its pid namespace`), func([]string) string {
		return "the process is not the leader of its own session, and that session's leader is outside the process's pid namespace " +
			"(as in a container): start it with setsid, so that it leads a session of its own"
	}},
	{regexp.MustCompile(`Don't have tty to inherit session from`), func([]string) string {
		return "the process had a terminal; restored with --shell-job it takes the terminal gpucr runs on, and gpucr runs on none"
	}},
	{regexp.MustCompile(`External socket is used`), func([]string) string {
		return "a unix socket of the process is connected to a process outside the checkpointed tree " +
			"(gpucr does not pass CRIU's --ext-unix-sk): checkpoint the tree that holds both ends"
	}},
	{regexp.MustCompile(`Can't fork for (\d+): File exists`), func(m []string) string {
		return fmt.Sprintf("pid %s is taken by another process (the checkpointed process, still running or not yet reaped?): "+
			"a restored process gets its old pid back", m[1])
	}},
	{regexp.MustCompile(`File (.+) has bad size (\d+) \(expect (\d+)\)`), func(m []string) string {
		// CRIU names the file relative to the root
		if !strings.HasPrefix(m[1], "/") {
			m[1] = "/" + m[1]
		}
		return fmt.Sprintf("the process had %s open, and it is %s bytes long now, not %s as at the checkpoint "+
			"(the process ran on after a --leave-running checkpoint and wrote to it, or something else did): CRIU restores an open file "+
			"only as it was. Restore an image whose files have not changed since (a checkpoint without --leave-running), "+
			"or put the file back as it was; a file the process opens to append to (>> in a shell) is restored whatever its size", m[1], m[2], m[3])
	}},
	{regexp.MustCompile(`Can't create link remap for (\S+?)\.? Use link-remap option`), func(m []string) string {
		return fmt.Sprintf("a process has %s open or mapped after it was unlinked (a POSIX semaphore of Python's "+
			"multiprocessing, in PyTorch's DataLoader or torch.multiprocessing, say): checkpoint with --link-remap", m[1])
	}},
	{regexp.MustCompile(`Can't bind inet socket .*Address already in use`), func([]string) string {
		return "a restored process listens on a TCP port that something of this host holds now (another process, or " +
			"connections that still wait out their TIME_WAIT after gpucr's wait of a minute): stop what holds it, or restore " +
			"where the port is free"
	}},
	{regexp.MustCompile(`Iptables configuration failed|Nftables configuration failed`), func([]string) string {
		return "CRIU locks the network of a process with open TCP connections (--tcp-established) with iptables " +
			"(or nftables), and it is not installed or failed: install it, or, where both ends of every connection are in " +
			"the checkpointed tree (a job's ranks and their store on one host), pass --criu-opt 'network-lock skip' to the " +
			"checkpoint and to the restore"
	}},
	{regexp.MustCompile(`anon_inode:\[io_uring\]`), func([]string) string {
		return "a process holds an io_uring instance, which CRIU cannot checkpoint. PyTorch's TCPStore (torchrun's " +
			"rendezvous store, torch.distributed's default store) runs on libuv, which uses io_uring on Linux: start the job " +
			"with UV_USE_IO_URING=0 (libuv then does without) or USE_LIBUV=0 (the store does without libuv)"
	}},
	{regexp.MustCompile(`(?i)no space left on device`), func([]string) string {
		return "the image directory's file system is full"
	}},
	{regexp.MustCompile(`Read-only file system`), func([]string) string {
		return "the image directory's file system is read-only"
	}},
	{regexp.MustCompile(`Unable to interrupt task: (\d+) \(No such process\)`), func(m []string) string {
		return fmt.Sprintf("process %s exited before CRIU could stop it", m[1])
	}},
}

// criuHintsFor returns the hints for a failure's messages, each once.
func criuHintsFor(msgs []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, h := range criuHints {
		for _, msg := range msgs {
			if m := h.re.FindStringSubmatch(msg); m != nil {
				if s := h.hint(m); !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
				break
			}
		}
	}
	return out
}
