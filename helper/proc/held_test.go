package proc

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A session leader's forked child holds the leader's pid as its session after
// the leader is gone, and as a zombie until it is reaped; only then is the
// pid released.
func TestHoldersZombieOfASession(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("cannot become a subreaper: %v", err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	// the leader prints its child's pid, then waits to be killed
	leader := exec.Command("sh", "-c", "sleep 1000 & echo $!; wait")
	leader.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := leader.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	n, _ := out.Read(buf)
	child, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		t.Fatalf("the leader's child: %q", buf[:n])
	}
	lpid := Pid(leader.Process.Pid)
	_ = leader.Process.Kill()
	_ = leader.Wait()
	// the leader is reaped; its child (ours now, as the subreaper) holds its pid as session
	h := Holders([]Pid{lpid})
	if len(h) != 1 || h[0].Pid != Pid(child) || h[0].State == 'Z' {
		t.Fatalf("holders of %d after the leader exited: %+v, want its running child %d", lpid, h, child)
	}
	_ = syscall.Kill(child, syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	h = WaitReleased(ctx, []Pid{lpid})
	if len(h) != 1 || h[0].State != 'Z' || h[0].PPid != Pid(os.Getpid()) {
		t.Fatalf("holders while the killed child is not reaped: %+v, want it as a zombie of this process", h)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(child, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if h := WaitReleased(ctx2, []Pid{lpid}); h != nil {
		t.Fatalf("holders after the zombie was reaped: %+v", h)
	}
}

// A thread's id is held while the thread runs, though /proc does not list
// it; its holder is its process.
func TestHoldersThread(t *testing.T) {
	// A goroutine that locks its thread may be given the main thread, whose
	// id is the pid: then it is let go, and another one tried.
	for try := 0; try < 50; try++ {
		tids := make(chan Pid)
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread() // the thread ends with the goroutine, so its id is released
			tids <- Pid(unix.Gettid())
			<-done
		}()
		tid := <-tids
		if tid == Pid(os.Getpid()) {
			close(done)
			continue
		}
		h := Holders([]Pid{tid})
		close(done)
		// the holder is this process, the id one of its threads: not a
		// process of its own
		if len(h) != 1 || h[0].Pid != Pid(os.Getpid()) || !slices.Equal(h[0].Threads, []Pid{tid}) {
			t.Fatalf("holders of thread id %d: %+v, want process %d with that thread", tid, h, os.Getpid())
		}
		return
	}
	t.Fatal("50 goroutines that locked their thread all ran on the main thread")
}
