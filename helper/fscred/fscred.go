// Package fscred runs file-system lookups with another user's permissions.
//
// The helper runs as root and opens some paths for the users who ask it (the
// parent image a checkpoint names, and that image's own ancestors). Opened
// as root, any path resolves, and the helper's answer (not found, not a
// directory, belongs to uid N) would tell a user what lies in directories
// they cannot read. Do runs the lookups on an OS thread of their own whose
// file-system uid and gid and supplementary groups are the user's: the
// kernel then checks every step as it would for that user (root's
// capabilities over files are gone on such a thread), and what the user
// could not reach fails with their permission error.
package fscred

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Cred is a user's file-system identity.
type Cred struct {
	UID, GID uint32
	Groups   []uint32 // supplementary groups
}

// Do runs f with c's file-system permissions and returns its error. f must
// do its file-system work itself, on the calling goroutine: goroutines it
// starts run with this process's own permissions.
func Do(c Cred, f func() error) error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, and the
		// user's identity with it; no other goroutine ever runs on it.
		runtime.LockOSThread()
		if err := become(c); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	return <-done
}

// become gives the calling thread c's file-system identity. The raw system
// calls act on this thread alone (the C library's wrappers, and Go's
// syscall package, would change every thread of the process).
func become(c Cred) error {
	groups := make([]int, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = int(g)
	}
	if err := unix.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	// setfsgid/setfsuid answer the previous id, and fail silently: the
	// second call tells whether the first one took.
	_, _ = unix.SetfsgidRetGid(int(c.GID))
	if got, _ := unix.SetfsgidRetGid(int(c.GID)); got != int(c.GID) {
		return fmt.Errorf("setfsgid %d did not take", c.GID)
	}
	_, _ = unix.SetfsuidRetUid(int(c.UID))
	if got, _ := unix.SetfsuidRetUid(int(c.UID)); got != int(c.UID) {
		return fmt.Errorf("setfsuid %d did not take", c.UID)
	}
	return nil
}
