package checkpoint

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
)

// Before a dump stops anything, gpucr looks at the tree through /proc for
// what CRIU would refuse without options a user should not need to know
// (autoopts.go decides): files open or mapped after they were unlinked
// while another name still links them (the POSIX semaphores of Python's
// multiprocessing), and TCP connections, with where their other end is.
// It reads only what the caller may read of /proc: the CLI runs as the
// user who checkpoints, and asks the helper nothing for it. A process the
// caller cannot look at shows nothing, and CRIU then says what it lacks.

// treeScan is what a look at a tree found.
type treeScan struct {
	// unlinked are files a process of the tree has open or mapped under a
	// name that was unlinked while the file keeps another (st_nlink > 0):
	// what CRIU's --link-remap dumps.
	unlinked []unlinkedFile
	// ghosts are files without any name left (st_nlink 0), whose
	// contents CRIU copies into the image whole (NCCL's shared host
	// buffers in /dev/shm, which it unlinks once every process mapped
	// them): --ghost-limit bounds their size.
	ghosts []ghostFile
	// conns are the TCP connections sockets of the tree hold (neither
	// listening nor closed), each with its peer where the tree holds that.
	conns []treeConn
}

// unlinkedFile is one file a process holds after its name was unlinked.
type unlinkedFile struct {
	pid  proc.Pid
	comm string
	path string // the name it had, as /proc gives it (" (deleted)" cut off)
}

// ghostFile is one file a process holds after its last name was unlinked.
type ghostFile struct {
	unlinkedFile
	bytes int64 // the blocks it takes (what CRIU weighs against --ghost-limit)
}

// treeConn is one TCP connection a process of the tree holds.
type treeConn struct {
	pid    proc.Pid
	comm   string
	state  int64
	conn   tcpConn
	netns  string
	inside bool // the other end is a socket of the tree, in the same netns
	// pending: the other end waits, not accepted yet, in the queue of a
	// listener of the tree (inside is then true too): a connection in
	// flight, which CRIU refuses and gpucr's dump takes again once the
	// tree has accepted it (dump.go)
	pending bool
	// job: the other end is another part of a job (inside is then true
	// too): chooseJobCRIUOptions
	job bool
}

// jobConn is the connection as a job's coordinator names it.
func (c treeConn) jobConn() JobConn { return c.conn.jobConn() }

// jobConn is the connection by its two endpoints as people write them.
func (c tcpConn) jobConn() JobConn {
	return JobConn{Local: endpointText(c.family, c.local, c.lport), Remote: endpointText(c.family, c.remote, c.rport)}
}

// TCP states of /proc/net/tcp that hold no connection: a listener, and a
// socket not (or no longer) connected.
const tcpCloseState = 7

// tcpSynRecvState is TCP_SYN_RECV: a connection the kernel is accepting.
const tcpSynRecvState = 3

// String names the connection for a message: "pid 12 (python3):
// 127.0.0.1:40100 -> 10.0.0.2:29500".
func (c treeConn) String() string {
	who := fmt.Sprintf("pid %d", c.pid)
	if c.comm != "" {
		who += " (" + c.comm + ")"
	}
	s := fmt.Sprintf("%s: %s -> %s", who, endpointText(c.conn.family, c.conn.local, c.conn.lport),
		endpointText(c.conn.family, c.conn.remote, c.conn.rport))
	if c.pending {
		s += " (not accepted yet by the tree's listener)"
	}
	return s
}

// endpointText is an address and port as people write them:
// "127.0.0.1:29500", "[::1]:29500".
func endpointText(family uint8, addr [16]byte, port uint16) string {
	var ip netip.Addr
	if family == unix.AF_INET {
		ip = netip.AddrFrom4([4]byte(addr[:4]))
	} else {
		ip = netip.AddrFrom16(addr).Unmap()
	}
	return netip.AddrPortFrom(ip, port).String()
}

// scanTree looks at the processes of tree.
func scanTree(tree []proc.Pid) treeScan {
	var s treeScan
	owner := map[uint64]proc.Pid{}   // socket inode -> the first process of the tree that holds it
	netnsOf := map[proc.Pid]string{} // pid -> its network namespace ("net:[4026531840]")
	nsPid := map[string]proc.Pid{}   // netns -> a process of the tree in it, to read its /proc/PID/net
	for _, p := range tree {
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", p))
		netnsOf[p] = ns
		if _, ok := nsPid[ns]; !ok {
			nsPid[ns] = p
		}
		linked, ghosts := unlinkedFiles(p)
		s.unlinked, s.ghosts = append(s.unlinked, linked...), append(s.ghosts, ghosts...)
		for _, ino := range socketInodes(p) {
			if _, ok := owner[ino]; !ok {
				owner[ino] = p
			}
		}
	}
	for ns, p := range nsPid {
		var conns []treeConn
		var listeners, queued []tcpConn
		for _, src := range []struct {
			name   string
			family uint8
		}{{"tcp", unix.AF_INET}, {"tcp6", unix.AF_INET6}} {
			f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", p, src.name))
			if err != nil {
				continue // gone, or a kernel without IPv6
			}
			c, l, q := ownedConns(f, src.family, owner, func(q proc.Pid) bool { return netnsOf[q] == ns })
			conns, listeners, queued = append(conns, c...), append(listeners, l...), append(queued, q...)
			f.Close()
		}
		for i := range conns {
			conns[i].netns = ns
			conns[i].inside = slices.ContainsFunc(conns, func(o treeConn) bool { return isPeer(conns[i].conn, o.conn) })
			if !conns[i].inside && slices.ContainsFunc(queued, func(q tcpConn) bool { return isPeer(conns[i].conn, q) }) &&
				slices.ContainsFunc(listeners, func(l tcpConn) bool { return listensFor(l, conns[i].conn) }) {
				conns[i].inside, conns[i].pending = true, true
			}
		}
		s.conns = append(s.conns, conns...)
	}
	for i := range s.conns {
		s.conns[i].comm = proc.Comm(s.conns[i].pid)
	}
	return s
}

// isPeer says whether b is the other end of a: the same two endpoints,
// swapped.
func isPeer(a, b tcpConn) bool {
	return a.family == b.family && a.local == b.remote && a.remote == b.local && a.lport == b.rport && a.rport == b.lport
}

// listensFor says whether listener l (a listening socket's local end)
// takes connection c's remote end: the same port, and the same address or
// a listener on every address.
func listensFor(l, c tcpConn) bool {
	return l.family == c.family && l.lport == c.rport && (l.local == c.remote || l.local == [16]byte{})
}

// ownedConns reads /proc/net/tcp-formatted text r, of family, and returns
// the connections whose socket inode a process of the tree holds (owner)
// in the namespace the text is of (inNS), and the tree's listeners there.
// A listener and an unconnected socket (CLOSE) are no connection: CRIU
// dumps those without options. Neither is a connection in TIME_WAIT: no
// process holds it (inode 0), and a restore deals with it where it keeps a
// port (ports.go, timewait.go). The ends no process holds yet (inode 0,
// established or half so: accepted by the kernel, waiting in a listener's
// queue) come back apart, queued.
func ownedConns(r io.Reader, family uint8, owner map[uint64]proc.Pid, inNS func(proc.Pid) bool) (conns []treeConn, listeners, queued []tcpConn) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
		f := strings.Fields(sc.Text())
		if len(f) < 10 || !strings.Contains(f[1], ":") {
			continue // the header
		}
		st, err1 := strconv.ParseInt(f[3], 16, 16)
		ino, err2 := strconv.ParseUint(f[9], 10, 64)
		if err1 != nil || err2 != nil || st == tcpCloseState {
			continue
		}
		if ino == 0 {
			if st == tcpEstablishedState || st == tcpSynRecvState || st == tcpCloseWaitState {
				if c, ok := parseConn(family, f[1], f[2]); ok {
					queued = append(queued, c)
				}
			}
			continue
		}
		p, ok := owner[ino]
		if !ok || !inNS(p) {
			continue
		}
		c, ok := parseConn(family, f[1], f[2])
		if !ok {
			continue
		}
		if st == tcpListenState {
			listeners = append(listeners, c)
			continue
		}
		conns = append(conns, treeConn{pid: p, state: st, conn: c})
	}
	return conns, listeners, queued
}

// socketInodes lists the inodes of the sockets pid has open.
func socketInodes(pid proc.Pid) []uint64 {
	var out []uint64
	for _, ino := range socketFds(pid) {
		if !slices.Contains(out, ino) {
			out = append(out, ino)
		}
	}
	slices.Sort(out)
	return out
}

// socketFds maps each descriptor of pid that is a socket to the socket's
// inode.
func socketFds(pid proc.Pid) map[int]uint64 {
	out := map[int]uint64{}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || !strings.HasPrefix(l, "socket:[") || !strings.HasSuffix(l, "]") {
			continue
		}
		if ino, err := strconv.ParseUint(l[len("socket:["):len(l)-1], 10, 64); err == nil {
			out[fd] = ino
		}
	}
	return out
}

// deletedSuffix is what /proc appends to the name of a file that was
// unlinked.
const deletedSuffix = " (deleted)"

// unlinkedFiles lists the files pid has open (/proc/PID/fd) or mapped
// (/proc/PID/map_files) whose name was unlinked: stat through /proc
// reaches the file itself, and its st_nlink says whether a name is left.
// Those another name still links come back as linked (what --link-remap
// dumps), those without any name as ghosts (what CRIU copies whole).
// Shared memory that never had a name (memfd, SysV, shared anonymous maps)
// is neither: CRIU dumps it as memory. map_files needs CAP_SYS_ADMIN or
// CAP_CHECKPOINT_RESTORE: without, a mapping is not looked at, and CRIU's
// own message then names what it needs.
func unlinkedFiles(pid proc.Pid) (linked []unlinkedFile, ghosts []ghostFile) {
	comm := ""
	type fileID struct{ dev, ino uint64 }
	seen := map[fileID]bool{}
	for _, sub := range []string{"fd", "map_files"} {
		dir := fmt.Sprintf("/proc/%d/%s", pid, sub)
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			l, err := os.Readlink(p)
			if err != nil || !strings.HasPrefix(l, "/") || !strings.HasSuffix(l, deletedSuffix) || neverNamed(l) {
				continue
			}
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
				continue
			}
			id := fileID{uint64(st.Dev), st.Ino}
			if seen[id] {
				continue
			}
			seen[id] = true
			if comm == "" {
				comm = proc.Comm(pid)
			}
			u := unlinkedFile{pid: pid, comm: comm, path: strings.TrimSuffix(l, deletedSuffix)}
			if st.Nlink > 0 {
				linked = append(linked, u)
			} else {
				ghosts = append(ghosts, ghostFile{unlinkedFile: u, bytes: st.Blocks * 512})
			}
		}
	}
	return linked, ghosts
}

// neverNamed says whether /proc's name for a file is one of shared
// memory's that never had a name in a file system: a memfd, a SysV
// segment, a shared anonymous or huge-page map.
func neverNamed(l string) bool {
	for _, p := range []string{"/memfd:", "/SYSV", "/dev/zero ", "/anon_hugepage "} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}
