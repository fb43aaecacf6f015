package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
)

// The logs in testdata/criulog are excerpts of real CRIU 4.2.1 logs (-v4) of
// failed runs on a host where CRIU lacks CAP_SYS_RESOURCE: each starts with
// the harmless rlimit error that go-criu reports as the failure.
func TestCRIULogErrors(t *testing.T) {
	for _, tc := range []struct {
		log    string
		errors []string
		hint   string // a part of the one hint expected; "" for none
	}{
		{"ext-unix-sk.log", []string{"unix: External socket is used. Consider using --ext-unix-sk option."}, "--ext-unix-sk"},
		{"no-such-process.log", []string{"Unable to detach from 999999: No such process"}, ""},
		{"shell-job.log", []string{"The root process 21097 is not a session leader. Consider using --shell-job option"}, "--shell-job"},
		// The session's leader is outside the process's pid namespace (a
		// container): --shell-job does not help there.
		{"pidns-session.log", []string{"A session leader of 19473(1) is outside of its pid namespace"}, "start it with setsid"},
		{"tty.log", []string{"tty: Found slave peer index 0 without correspond master peer"}, "--shell-job"},
		{"restore-empty.log", []string{"Unexpected EOF on (empty-image)"}, ""},
		// A restored task's lines carry its pid.
		{"restore-tty.log", []string{"pid 6237: tty: Don't have tty to inherit session from, aborting",
			"pid 6237: Unable to open fd=0 id=0x11"}, "takes the terminal"},
		{"restore-pid-busy.log", []string{"Can't fork for 21148: File exists"}, "pid 21148 is taken"},
		// The disk filled up: the log itself ends in the middle of a line.
		{"enospc.log", []string{"page-xfer: Unable to spice data: No space left on device",
			"bfd: Error flushing image: No space left on device"}, "is full"},
		// The plugin refused in PAUSE_DEVICES: CRIU logs no word of it (the
		// plugin's own messages say why).
		{"plugin-failure.log", []string{"Unable to detach from 26555: No such process"}, ""},
		// torchrun's agent: PyTorch's TCPStore on libuv, which uses
		// io_uring (the errors CRIU reported on the GPU machine).
		{"io-uring.log", []string{"Unknown shit 600 (anon_inode:[io_uring])",
			"Can't open 1579's mapfile link 7fc517cb0000: No such device or address",
			"Collect mappings (pid: 1579) failed with -1"}, "UV_USE_IO_URING=0"},
		// A job started with torch.multiprocessing: an unlinked semaphore
		// mapped (the errors CRIU reported on the GPU machine).
		{"link-remap.log", []string{"Can't create link remap for /dev/shm/sem.qTWoCU. Use link-remap option.",
			"Collect mappings (pid: 1610) failed with -1"}, "--link-remap"},
		// --tcp-established on a host without iptables (the GPU machine).
		{"no-iptables.log", []string{"exited, status=127", "Iptables configuration failed",
			"tcp: Failed to lock TCP connection 21b2e", "Dump files (pid: 4140) failed with -1"}, "network-lock skip"},
	} {
		t.Run(tc.log, func(t *testing.T) {
			got, err := criuLogFile(filepath.Join("testdata", "criulog", tc.log), maxCRIUErrors)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.errors) {
				t.Errorf("errors %q, want %q", got, tc.errors)
			}
			hints := criuHintsFor(got, !strings.HasPrefix(tc.log, "restore"))
			switch {
			case tc.hint == "" && len(hints) > 0:
				t.Errorf("unexpected hints %q", hints)
			case tc.hint != "" && (len(hints) != 1 || !strings.Contains(hints[0], tc.hint)):
				t.Errorf("hints %q, want one containing %q", hints, tc.hint)
			}
		})
	}
}

// Without error lines before the end, the warnings there say why.
func TestCRIULogWarningsWhenNoErrors(t *testing.T) {
	log := "(00.031083) Warn  (compel/src/lib/infect.c:132): Unable to interrupt task: 4242 (No such process)\n" +
		"(00.038346) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
		"(00.038352) Warn  (compel/arch/x86/src/lib/infect.c:419): Will restore 4242 with interrupted system call\n" +
		"(00.031136) Error (criu/cr-dump.c:1975): Dumping FAILED.\n" +
		"(00.031140) Error (criu/cr-dump.c:1999): after the end\n"
	got, err := criuLogErrors(strings.NewReader(log), maxCRIUErrors)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"Unable to interrupt task: 4242 (No such process)"}; !slices.Equal(got, want) {
		t.Fatalf("errors %q, want %q", got, want)
	}
	if h := criuHintsFor(got, true); len(h) != 1 || !strings.Contains(h[0], "4242 exited") {
		t.Errorf("hints %q", h)
	}
}

// Only the last max errors are kept, oldest first.
func TestCRIULogErrorsKeepsTheLast(t *testing.T) {
	var b strings.Builder
	for i := range 10 {
		b.WriteString("(00.000001) Error (criu/x.c:1): e" + string(rune('0'+i)) + "\n")
	}
	got, err := criuLogErrors(strings.NewReader(b.String()), 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"e7", "e8", "e9"}; !slices.Equal(got, want) {
		t.Fatalf("errors %q, want %q", got, want)
	}
}

func TestCRIUPluginLoaded(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "criulog", "plugin-loaded.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !criuPluginLoaded(string(b), "gpucr") {
		t.Errorf("the plugin's load is not recognised in\n%s", b)
	}
	b, err = os.ReadFile(filepath.Join("testdata", "criulog", "shell-job.log"))
	if err != nil {
		t.Fatal(err)
	}
	if criuPluginLoaded(string(b), "gpucr") {
		t.Errorf("a log without the plugin's load is taken for one")
	}
}

// CRIU's log is read from the image directory, where others may write: a
// FIFO there is refused at once, a symlink is not followed.
func TestCRIULogFileRefusesFIFOAndSymlink(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "dump.log")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := criuLogFile(fifo, 5); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a FIFO read as CRIU's log")
		}
	case <-time.After(5 * time.Second):
		if f, err := os.OpenFile(fifo, os.O_RDWR, 0); err == nil {
			f.Close()
		}
		t.Fatal("reading a FIFO as CRIU's log hung")
	}
	target := filepath.Join(dir, "other.log")
	if err := os.WriteFile(target, []byte("(00.1) Error (criu/x.c:1): secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "restore.log")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if lines, err := criuLogFile(link, 5); err == nil {
		t.Errorf("a symlink followed to CRIU's log: %q", lines)
	}
}

// A hint about what one process of the tree holds names that process, by
// the pid of CRIU's failed step and its command line; others stay general.
func TestCRIUHintNamesTheFailedProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := strconv.Itoa(cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if b, _ := os.ReadFile("/proc/" + pid + "/cmdline"); len(b) > len("sleep\x00") {
			break // exec has filled in the arguments
		}
	}
	own := strconv.Itoa(os.Getpid())
	closeRing := ownIOURing(t)
	defer closeRing()
	ioUring := func(pid string) []string {
		return []string{"Unknown shit 600 (anon_inode:[io_uring])",
			"Can't open " + pid + "'s mapfile link 7fc517cb0000: No such device or address",
			"Collect mappings (pid: " + pid + ") failed with -1"}
	}
	for _, tc := range []struct {
		name string
		msgs []string
		want string // the hint's beginning; "" for none
		// restore: the messages are a restore's, whose pids are not the
		// tree's (a pid CRIU names may be another process's by now)
		restore bool
	}{
		{"running", ioUring(pid), "process " + pid + " (sleep 30) holds an io_uring instance", false},
		{"gone", ioUring("4194305"), "process 4194305 holds an io_uring instance", false}, // beyond any pid_max
		{"unlinked file", []string{"Can't create link remap for /dev/shm/sem.qTWoCU. Use link-remap option.",
			"Collect mappings (pid: " + pid + ") failed with -1"}, "process " + pid + " (sleep 30) has /dev/shm/sem.qTWoCU open", false},
		{"no failed step", ioUring(pid)[:1], "a process holds an io_uring instance", false},
		// CRIU's words for a descriptor its parasite could not send: only
		// what the process holds says why.
		{"generic words", []string{"Can't retrieve FDs from socket", "Dump files (pid: " + own + ") failed with -1"},
			"process " + own + " (" + filepath.Base(os.Args[0]), false},
		{"generic words, nothing held", []string{"Can't retrieve FDs from socket", "Dump files (pid: " + pid + ") failed with -1"}, "", false},
		{"a restore's pid", []string{"Can't retrieve FDs from socket", "Restore files (pid: " + own + ") failed with -1"}, "", true},
		{"a restore's pid in a hint", []string{"Can't create link remap for /dev/shm/sem.qTWoCU. Use link-remap option.",
			"Collect mappings (pid: " + pid + ") failed with -1"}, "a process has /dev/shm/sem.qTWoCU open", true},
		// A hint about the host, not a process, is not given a name.
		{"host", []string{"Iptables configuration failed", "Dump files (pid: " + pid + ") failed with -1"},
			"CRIU locks the network", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hints := criuHintsFor(tc.msgs, !tc.restore)
			if tc.want == "" {
				if len(hints) > 0 {
					t.Errorf("unexpected hints %q", hints)
				}
				return
			}
			if len(hints) != 1 || !strings.HasPrefix(hints[0], tc.want) {
				t.Errorf("hints %q, want one beginning %q", hints, tc.want)
			}
		})
	}
}

// ownIOURing makes an io_uring instance in the test's own process (skipping
// the test where the kernel makes none) and returns its close.
func ownIOURing(t *testing.T) func() {
	t.Helper()
	var params [120]byte // struct io_uring_params
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		t.Skipf("this kernel makes no io_uring instance: %v", errno)
	}
	return func() { unix.Close(int(fd)) }
}

// taskHolds finds an io_uring descriptor (or mapping) where a process has
// one, and nowhere else.
func TestTaskHolds(t *testing.T) {
	const ring = "anon_inode:[io_uring]"
	self := proc.Pid(os.Getpid())
	if taskHolds(self, ring) {
		t.Fatal("the test process holds an io_uring before it made one")
	}
	closeRing := ownIOURing(t)
	if !taskHolds(self, ring) {
		t.Error("an io_uring descriptor of the test process is not found")
	}
	closeRing()
	if taskHolds(self, ring) {
		t.Error("a closed io_uring descriptor is still found")
	}
	if taskHolds(proc.Pid(1<<22+1), ring) {
		t.Error("a pid beyond any pid_max holds an io_uring")
	}
}

// A hint quotes a command line by its program's base name, cut short.
func TestShortCommand(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		max  int
		want string
	}{
		{"/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 2 train.py", 100, "python3 /usr/local/bin/torchrun --nproc-per-node 2 train.py"},
		{"sleep 30", 100, "sleep 30"},
		{"sleep 30", 8, "sleep 30"},
		{"sleep 30", 7, "slee..."},
		{"/bin/", 100, "/bin/"}, // no base name to take
	} {
		if got := shortCommand(tc.cmd, tc.max); got != tc.want {
			t.Errorf("shortCommand(%q, %d) = %q, want %q", tc.cmd, tc.max, got, tc.want)
		}
	}
}

// A dump CRIU refused for a connection in flight is one Dump takes again;
// other failures, and one the user stopped or that timed out, are not.
func TestInFlightFailure(t *testing.T) {
	inflight := &Failure{Summary: "criu dump of pid 1 failed", CRIU: []string{
		"inet: In-flight connection (l) for 5b41c9",
		"inet: In-flight connections can be ignored with the --skip-in-flight option.",
	}}
	if !inFlight(inflight) {
		t.Error("CRIU's in-flight refusal is not taken for one")
	}
	if !inFlight(fmt.Errorf("checkpoint: %w", inflight)) {
		t.Error("a wrapped in-flight refusal is not taken for one")
	}
	for name, err := range map[string]error{
		"other":     &Failure{CRIU: []string{"Can't dump ghost file"}},
		"cancelled": &Failure{CRIU: inflight.CRIU, Cancelled: true},
		"timed out": &Failure{CRIU: inflight.CRIU, TimedOut: true},
		"plain":     errors.New("In-flight connection"),
	} {
		if inFlight(err) {
			t.Errorf("%s: taken for an in-flight refusal", name)
		}
	}
}
