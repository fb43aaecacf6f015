package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
)

// repairOffTree takes every TCP socket of the held tree out of repair mode
// and says how many it took. CRIU puts a tree's established connections in
// repair mode to dump them (--tcp-established) and takes them out only
// when the tree runs on at once: a --leave-stopped dump that succeeded
// (cr_dump_finish's network_unlock() runs on an error or with
// final_state TASK_ALIVE only) leaves them in it, as a migration to
// another host wants. A source continued after such a dump (a migration
// whose transfer or restore failed, a job's part aborted or committed
// --leave-running) would get EPERM from every recv() on them
// (tcp_recvmsg() refuses a socket in repair mode). So before it runs again
// each socket is copied out of the stopped process (pidfd_getfd, by the
// held pidfd) and, where TCP_REPAIR reads 1, set to 0.
func repairOffTree(held []*proc.Process) (int, error) {
	var errs []error
	done := map[string]bool{} // socket inodes: one socket may be in many processes
	n := 0
	for _, p := range held {
		dir := fmt.Sprintf("/proc/%d/fd", p.Pid())
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue // gone: nothing to continue
		}
		for _, e := range ents {
			l, err := os.Readlink(dir + "/" + e.Name())
			if err != nil || !strings.HasPrefix(l, "socket:[") || done[l] {
				continue
			}
			fd, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			took, err := repairOffFd(p, fd)
			if err != nil {
				errs = append(errs, fmt.Errorf("pid %d fd %d: %w", p.Pid(), fd, err))
				continue
			}
			done[l] = true
			if took {
				n++
			}
		}
	}
	return n, errors.Join(errs...)
}

// repairOffFd turns TCP repair mode off on descriptor fd of p, if it is a
// TCP socket in repair mode; took says whether it was.
func repairOffFd(p *proc.Process, fd int) (took bool, err error) {
	sk, err := p.Fd(fd)
	if err != nil {
		if errors.Is(err, unix.EBADF) {
			return false, nil // closed meanwhile (a process not stopped)
		}
		return false, err
	}
	defer unix.Close(sk)
	on, err := unix.GetsockoptInt(sk, unix.SOL_TCP, unix.TCP_REPAIR)
	if err != nil || on == 0 {
		return false, nil // not TCP (EOPNOTSUPP, ENOPROTOOPT), or not in repair mode
	}
	if err := unix.SetsockoptInt(sk, unix.SOL_TCP, unix.TCP_REPAIR, 0); err != nil {
		return false, fmt.Errorf("TCP_REPAIR off: %w", err)
	}
	return true, nil
}
