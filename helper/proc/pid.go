package proc

import "strconv"

// Pid is a process id, as the kernel counts them (pid_t): the one type the
// helper, the CLI and package checkpoint use for a pid. The protocol
// carries pids as int64 and the image as int; they are converted at those
// edges only.
type Pid int32

func (p Pid) String() string { return strconv.Itoa(int(p)) }
