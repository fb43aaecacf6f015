package proc

import (
	"os"
	"strings"
)

// CommandLine is pid's command line (/proc/PID/cmdline, its arguments
// joined by spaces); its command name (Comm) where the command line is
// empty (a kernel thread, a zombie); "" if the process is unknown.
func CommandLine(pid Pid) string {
	b, err := os.ReadFile("/proc/" + pid.String() + "/cmdline")
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " "))
	if s == "" {
		return Comm(pid)
	}
	return s
}
