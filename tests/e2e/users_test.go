package e2e

// A second, unprivileged user for the tests that check what one user can do
// to another's processes and files through the helper, the CLI and images.

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// otherUserName is created by the tests (useradd) where it is missing.
const otherUserName = "gpucr-e2e-other"

type otherUser struct {
	Name     string
	UID, GID uint32
}

var (
	otherOnce sync.Once
	other     otherUser
	otherErr  error
)

// secondUser returns the tests' unprivileged user, creating it (no home, no
// login shell) on first use. Without root, or without useradd outside CI,
// the test is skipped; in CI it fails.
func secondUser(t testing.TB) otherUser {
	t.Helper()
	otherOnce.Do(func() {
		if os.Geteuid() != 0 {
			otherErr = errNotRoot
			return
		}
		if _, err := user.Lookup(otherUserName); err != nil {
			if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
				otherUserName).CombinedOutput(); err != nil {
				otherErr = &exec.Error{Name: "useradd: " + string(out), Err: err}
				return
			}
		}
		u, err := user.Lookup(otherUserName)
		if err != nil {
			otherErr = err
			return
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		other = otherUser{Name: u.Username, UID: uint32(uid), GID: uint32(gid)}
	})
	if otherErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("a second user for the tests: %v", otherErr)
		}
		t.Skipf("no second user for the tests: %v", otherErr)
	}
	return other
}

type notRoot struct{}

func (notRoot) Error() string { return "the tests do not run as root" }

var errNotRoot error = notRoot{}

// asUser makes cmd run as u (no supplementary groups).
func asUser(cmd *exec.Cmd, u otherUser) *exec.Cmd {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
	return cmd
}
