package checkpoint

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpucr/gpucr/helper/proc"
)

// A training job needs CRIU options its user should not have to know: a
// PyTorch DDP job (torch.multiprocessing, DataLoader workers) holds
// Python's multiprocessing semaphores, files of /dev/shm it unlinked
// (--link-remap), and its ranks talk to each other and to their store over
// TCP on the host (--tcp-established), which CRIU locks with iptables,
// which a GPU machine often lacks. So a dump looks at the tree first
// (treeinspect.go) and turns on what the tree needs where that is safe,
// saying which and why (DumpResult.AutoOptions); the dump record
// (dumprecord.go) keeps them for the restore. What the user named
// explicitly is never overridden, and a connection to a peer outside the
// tree is refused before anything stops: whether that peer copes is
// something only the user knows.

// AutoOption is a CRIU option a checkpoint turned on by itself, and why.
type AutoOption struct {
	Option string `json:"option"` // as CRIU's command line names it: "--link-remap"
	Why    string `json:"why"`
}

// maxNamed bounds the files or connections a message names.
const maxNamed = 4

// criuGhostLimit is CRIU's own --ghost-limit: the largest file without a
// name left whose contents a dump copies.
const criuGhostLimit = 1 << 20

// maxAutoGhost is the largest such file a checkpoint copies without being
// told to: NCCL's shared buffers are tens of MiB a process; a file of
// gigabytes that a process keeps after unlinking it is more likely scratch
// space the user would rather not carry in every image.
const maxAutoGhost = 1 << 30

// chooseCRIUOptions returns c with the options the tree (root and its
// descendants, tree) needs turned on, and says which; or an error that
// refuses the checkpoint before anything is stopped.
func chooseCRIUOptions(root proc.Pid, tree []proc.Pid, c CRIU) (CRIU, []AutoOption, error) {
	return chooseJobCRIUOptions(root, tree, c, nil)
}

// chooseJobCRIUOptions is chooseCRIUOptions for a part of a job: a
// connection among jobConns (its peer is another part of the job, which
// the job's checkpoint stops at the same cut: jobdump.go) counts as one
// inside the tree.
func chooseJobCRIUOptions(root proc.Pid, tree []proc.Pid, c CRIU, jobConns []JobConn) (CRIU, []AutoOption, error) {
	s := scanTree(tree)
	jobbed := 0
	for i := range s.conns {
		if !s.conns[i].inside && slices.Contains(jobConns, s.conns[i].jobConn()) {
			s.conns[i].inside, s.conns[i].job = true, true
			jobbed++
		}
	}
	var auto []AutoOption
	if len(s.unlinked) > 0 && !c.LinkRemap && !extraHas(c.Extra, "link-remap") {
		// CRIU dumps such a file as a link it makes beside it; gpucr keeps
		// a copy of that link in the image (linkremap.go), so the image
		// restores after the job ended, and more than once.
		names := make([]string, 0, len(s.unlinked))
		for _, u := range s.unlinked {
			names = append(names, fmt.Sprintf("pid %d (%s) has %s", u.pid, u.comm, u.path))
		}
		c.LinkRemap = true
		auto = append(auto, AutoOption{Option: "--link-remap",
			Why: "files open or mapped after their name was unlinked, still linked under another (POSIX semaphores of Python's multiprocessing): " + namedList(names)})
	}
	if a, err := chooseGhostLimit(root, s.ghosts, &c); err != nil {
		return c, nil, err
	} else if a != nil {
		auto = append(auto, *a)
	}
	if len(s.conns) == 0 {
		return c, auto, nil
	}
	var inside, outside []string
	for _, tc := range s.conns {
		if tc.inside {
			inside = append(inside, tc.String())
		} else {
			outside = append(outside, tc.String())
		}
	}
	established := c.TCPEstablished || extraHas(c.Extra, "tcp-established")
	closed := c.TCPClose || extraHas(c.Extra, "tcp-close")
	if !established && !closed {
		if len(outside) > 0 {
			return c, nil, fmt.Errorf("checkpoint of %d refused before anything was stopped: its tree has TCP connections to peers outside it: %s. "+
				"A dump stops only the tree, and the peer's side of the connection would go on without it: pass --tcp-close if the application "+
				"reconnects (the restore brings the connection back closed), --tcp-established to dump it anyway (the peer must be stopped or "+
				"restored with it, and CRIU locks the network with iptables, or what --network-lock names), or checkpoint a tree that holds the peer too",
				root, namedList(outside))
		}
		c.TCPEstablished, established = true, true
		why := "TCP connections with both ends in the tree: " + namedList(inside)
		if jobbed > 0 {
			why = "TCP connections with both ends in the tree or in another part of the job, checkpointed at the same cut: " + namedList(inside)
		}
		auto = append(auto, AutoOption{Option: "--tcp-established", Why: why})
	}
	if established && !closed && len(outside) == 0 && c.NetworkLock == "" && !extraHas(c.Extra, "network-lock") {
		// CRIU locks the network while it dumps and restores connections,
		// so that no packet reaches a socket that is being dumped, or that
		// is not there yet: the peer would answer with a reset and end the
		// connection. It does that with iptables or nftables, which a GPU
		// machine may lack. Where both ends of every connection are in the
		// tree, nothing is left to send to them: CRIU freezes the whole tree
		// at once, before it touches a socket, and a restore takes the
		// sockets out of repair mode only at its end, once both ends exist
		// again; so no lock is needed.
		// A job's connection to another part is kept quiet by the job's own
		// protocol instead (docs/job-checkpoint.md): every part is frozen,
		// and the send queues of both ends are empty, before any part is
		// dumped; every part's sockets exist before any leaves repair mode.
		c.NetworkLock = "skip"
		why := "every TCP connection has both ends in the tree, which CRIU stops and restores as a whole: nothing outside sends to them, so no iptables lock is needed"
		if jobbed > 0 {
			why = "every TCP connection has both ends in the tree or in another part of the job: the job's barriers (all parts frozen, nothing in flight, before any dump) stand in for the lock"
		}
		auto = append(auto, AutoOption{Option: "--network-lock skip", Why: why})
	}
	return c, auto, nil
}

// chooseGhostLimit raises c's ghost limit to the largest of ghosts (files
// without a name left, which CRIU copies whole into the image), where one
// is over CRIU's own limit and the user named none; one over maxAutoGhost
// refuses the checkpoint before anything stops.
func chooseGhostLimit(root proc.Pid, ghosts []ghostFile, c *CRIU) (*AutoOption, error) {
	var big []ghostFile
	var largest int64
	for _, g := range ghosts {
		if g.bytes > criuGhostLimit {
			big = append(big, g)
			largest = max(largest, g.bytes)
		}
	}
	if len(big) == 0 || c.GhostLimit > 0 || extraHas(c.Extra, "ghost-limit") {
		return nil, nil
	}
	names := make([]string, 0, len(big))
	for _, g := range big {
		names = append(names, fmt.Sprintf("pid %d (%s) has %s, %s", g.pid, g.comm, g.path, mib(g.bytes)))
	}
	if largest > maxAutoGhost {
		return nil, fmt.Errorf("checkpoint of %d refused before anything was stopped: its tree holds files whose last name was unlinked, "+
			"which CRIU copies whole into the image, and one is larger than the %s gpucr copies unasked: %s. Pass "+
			"--criu-opt 'ghost-limit %dM' to copy them, or let the process close or unmap them before the checkpoint",
			root, mib(maxAutoGhost), namedList(names), wholeMiB(largest))
	}
	c.GhostLimit = uint32(wholeMiB(largest) << 20)
	return &AutoOption{Option: fmt.Sprintf("--ghost-limit %dM", c.GhostLimit>>20),
		Why: "files open or mapped after their last name was unlinked (NCCL's shared buffers in /dev/shm, say), " +
			"which CRIU copies into the image, larger than its own limit of 1 MiB: " + namedList(names)}, nil
}

// mib is a size for a message: "32.6 MiB".
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// wholeMiB is b in MiB, rounded up: a limit that holds b.
func wholeMiB(b int64) int64 { return (b + (1 << 20) - 1) >> 20 }

// namedList joins names for a message, at most maxNamed of them.
func namedList(names []string) string {
	if len(names) <= maxNamed {
		return strings.Join(names, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(names[:maxNamed], "; "), len(names)-maxNamed)
}

// extraHas says whether the --criu-opt lines extra name CRIU's option
// name ("network-lock skip" names network-lock).
func extraHas(extra []string, name string) bool {
	return slices.ContainsFunc(extra, func(l string) bool {
		f := strings.Fields(strings.TrimLeft(l, "-"))
		return len(f) > 0 && (f[0] == name || strings.HasPrefix(f[0], name+"="))
	})
}
