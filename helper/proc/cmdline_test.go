package proc

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestCommandLine(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := Pid(cmd.Process.Pid)
	// The kernel fills the new image's arguments in a moment after exec
	// has closed the pipe Start waits on (until then: the command name).
	deadline := time.Now().Add(5 * time.Second)
	for CommandLine(pid) == "sleep" && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := CommandLine(pid); got != "sleep 30" {
		t.Errorf("CommandLine(sleep 30) = %q", got)
	}
	self := CommandLine(Pid(os.Getpid()))
	if !strings.HasPrefix(self, os.Args[0]) {
		t.Errorf("own command line %q does not begin with %q", self, os.Args[0])
	}
	if got := CommandLine(Pid(1<<22 + 1)); got != "" {
		t.Errorf("a pid beyond pid_max: %q, want empty", got)
	}
}
