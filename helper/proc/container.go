package proc

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// containerID64 is the 64-hex-digit id that Docker, Podman, containerd and
// CRI-O put into a container's cgroup name.
var containerID64 = regexp.MustCompile(`[0-9a-f]{64}`)

// Container names the container pid runs in, "" if none is seen: the id in
// its cgroup path (12 digits of a 64-digit one, or runc's own name), or, in
// another pid namespace than this process with a cgroup path that names
// none, "pidns:INODE".
func Container(pid Pid) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	own := !SamePidNS(pid)
	id := containerOf(string(b), own)
	if id == "" && own {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil {
			id = strings.TrimSuffix(strings.TrimPrefix(ns, "pid:["), "]")
			id = "pidns:" + id
		}
	}
	return id
}

// containerOf reads a container's name from the text of /proc/PID/cgroup: a
// 64-digit id anywhere in it (its first 12 digits, as docker ps shows them);
// else, for a process in a pid namespace of its own, the last component of
// its cgroup path (the unified hierarchy's "0::PATH", else the first) without a runtime's decoration (runc-ID.scope: ID), as runc
// names the cgroup after the container by default.
func containerOf(cgroup string, ownPidNS bool) string {
	if id := containerID64.FindString(cgroup); id != "" {
		return id[:12]
	}
	var path string
	for _, line := range strings.Split(strings.TrimSpace(cgroup), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || f[2] == "/" {
			continue
		}
		if path == "" || f[0] == "0" {
			path = f[2]
		}
	}
	if !ownPidNS {
		return ""
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := len(parts) - 1; i >= 0; i-- {
		p := parts[i]
		switch p {
		case "", "container", "init.scope", "payload":
			continue
		}
		p = strings.TrimSuffix(p, ".scope")
		for _, pre := range []string{"runc-", "libpod-", "docker-", "crio-", "cri-containerd-"} {
			p = strings.TrimPrefix(p, pre)
		}
		return p
	}
	return ""
}
