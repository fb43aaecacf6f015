package checkpoint

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
)

// repairOffTree takes every TCP socket of the held tree out of repair mode. CRIU puts a tree's established connections in
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
func repairOffTree(held []*proc.Process) error {
	var errs []error
	done := map[uint64]bool{} // socket inodes: one socket may be in many processes
	for _, p := range held {
		for fd, ino := range socketFds(p.Pid()) {
			if done[ino] {
				continue
			}
			if err := repairOffFd(p, fd); err != nil {
				errs = append(errs, fmt.Errorf("pid %d fd %d: %w", p.Pid(), fd, err))
				continue
			}
			done[ino] = true
		}
	}
	return errors.Join(errs...)
}

// repairOffFd turns TCP repair mode off on descriptor fd of p, if it is a
// TCP socket in repair mode.
func repairOffFd(p *proc.Process, fd int) error {
	sk, err := p.Fd(fd)
	if err != nil {
		if errors.Is(err, unix.EBADF) {
			return nil // closed meanwhile (a process not stopped)
		}
		return err
	}
	defer unix.Close(sk)
	on, err := unix.GetsockoptInt(sk, unix.SOL_TCP, unix.TCP_REPAIR)
	if err != nil || on == 0 {
		return nil // not TCP (EOPNOTSUPP, ENOPROTOOPT), or not in repair mode
	}
	if err := unix.SetsockoptInt(sk, unix.SOL_TCP, unix.TCP_REPAIR, 0); err != nil {
		return fmt.Errorf("TCP_REPAIR off: %w", err)
	}
	return nil
}
