package cli

import "github.com/gpucr/gpucr/helper/proc"

// Processes from /proc, as the CLI counts them (ints), through package proc.

// processTree is pid and all its descendants (children recursively), the
// tree CRIU dumps for pid.
func processTree(pid int) []int {
	var out []int
	for _, p := range proc.Tree(int32(pid)) {
		out = append(out, int(p))
	}
	return out
}

// processExists says whether pid is a process (a zombie is not).
func processExists(pid int) bool { return proc.Exists(int32(pid)) }
