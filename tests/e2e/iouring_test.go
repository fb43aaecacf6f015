package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ringTree is a Python process that prints heartbeats, with a child that
// holds an io_uring instance (as torchrun's agent does, through libuv):
// io_uring_setup straight through the system call, number 425 on x86-64
// and arm64 alike; with "mapped", the child also maps its submission ring
// as libuv and liburing do. A child that cannot make one prints
// "no io_uring" and ends.
const ringTree = `import ctypes, os, subprocess, sys, time
if sys.argv[1] == "ring":
    libc = ctypes.CDLL(None, use_errno=True)
    params = (ctypes.c_char * 120)()
    fd = libc.syscall(425, 4, params)
    if fd < 0:
        print("no io_uring: errno %d" % ctypes.get_errno(), flush=True)
        sys.exit(0)
    if sys.argv[2] == "mapped":
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        if libc.mmap(None, 4096, 3, 0x8001, fd, 0) in (None, ctypes.c_void_p(-1).value):  # MAP_SHARED|MAP_POPULATE
            sys.exit("mmap of the ring: errno %d" % ctypes.get_errno())
    print("ring ready pid=%d" % os.getpid(), flush=True)
    time.sleep(3600)
child = subprocess.Popen([sys.executable, sys.argv[0], "ring", sys.argv[1]])
print("ready pid=%d child=%d" % (os.getpid(), child.pid), flush=True)
i = 0
while True:
    i += 1
    print("hb %d 0" % i, flush=True)
    time.sleep(0.02)
`

// TestCheckpointNamesTheProcessHoldingIOURing: a tree with an io_uring
// instance in one of its processes cannot be dumped (CRIU cannot dump
// io_uring). gpucr checkpoint fails with a hint that names that process,
// by pid and command line, not the tree's root, and says how to start a
// PyTorch job without one; the tree runs on, and no image is left. CRIU's
// own words differ: "Unknown shit 600 (anon_inode:[io_uring])" for a
// mapped ring, only "Can't retrieve FDs from socket" for a descriptor.
func TestCheckpointNamesTheProcessHoldingIOURing(t *testing.T) {
	needTool(t, "criu")
	py := needTool(t, "python3")
	for _, how := range []string{"mapped", "descriptor"} {
		t.Run(how, func(t *testing.T) { ioURingRefused(t, py, how) })
	}
}

func ioURingRefused(t *testing.T, py, how string) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	script := filepath.Join(dir, "ringtree.py")
	if err := os.WriteFile(script, []byte(ringTree), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startUnderArgv(t, dir, h, env, "ringtree", []string{py, script, how})
	a.waitFor(30*time.Second, "the child's io_uring", func(s string, _ []heartbeat) bool {
		return strings.Contains(s, "ring ready") || strings.Contains(s, "no io_uring")
	})
	if strings.Contains(a.output(), "no io_uring") {
		t.Skipf("this kernel makes no io_uring instance: %s", tail(a.output(), 3))
	}
	m := regexp.MustCompile(`ring ready pid=(\d+)`).FindStringSubmatch(a.output())
	child := m[1]
	a.waitIter(10, time.Minute)
	img := filepath.Join(dir, "img")
	out, err := cli(t, h, env, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	if err == nil {
		t.Fatalf("a tree holding io_uring was checkpointed:\n%s", tail(out, 10))
	}
	// The child by its pid and its command line, the interpreter by its
	// base name (the path of the temporary script may be cut short).
	named := regexp.MustCompile(`hint: process ` + child + ` \(python3?\S* /\S*ring\S* ring ` + how + `\) holds an io_uring instance`)
	if !named.MatchString(out) || !strings.Contains(out, "torch.multiprocessing") {
		t.Errorf("the failure does not name the process holding io_uring (%s):\n%s", named, tail(out, 12))
	}
	at := a.lastIter()
	a.waitIter(at+5, 30*time.Second) // the tree runs on
	if _, err := os.Stat(filepath.Join(img, "gpucr", "manifest.pb")); err == nil {
		t.Errorf("a failed checkpoint left a GPU image in %s", img)
	}
	if _, err := os.Stat("/proc/" + child); err != nil {
		t.Errorf("the child holding io_uring is gone after the failed checkpoint: %v", err)
	}
}
