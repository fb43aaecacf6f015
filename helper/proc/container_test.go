package proc

import (
	"os"
	"strings"
	"testing"
)

func TestContainerOf(t *testing.T) {
	id := strings.Repeat("4f1c2b3a5d6e7f80", 4)
	for _, tc := range []struct {
		cgroup string
		ownNS  bool
		want   string
	}{
		{"0::/user.slice/user-0.slice/session-1.scope\n", false, ""},
		{"0::/system.slice/docker-" + id + ".scope\n", true, id[:12]},
		{"0::/machine.slice/libpod-" + id + ".scope/container\n", true, id[:12]},
		{"12:memory:/kubepods/besteffort/pod1/" + id + "\n0::/\n", true, id[:12]},
		{"0::/gpucr-e2e-plugin-42\n", true, "gpucr-e2e-plugin-42"},
		{"0::/system.slice/runc-mybox.scope\n", true, "mybox"},
		{"0::/gpucr-e2e-plugin-42\n", false, ""}, // a host process in some cgroup
		{"", true, ""},
	} {
		if got := containerOf(tc.cgroup, tc.ownNS); got != tc.want {
			t.Errorf("containerOf(%q, %v) = %q, want %q", tc.cgroup, tc.ownNS, got, tc.want)
		}
	}
	if c := Container(Pid(os.Getpid())); c != "" && c[:6] != "pidns:" && len(c) > 64 {
		t.Errorf("Container(self) = %q", c)
	}
}
