package torchrun

import (
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strings"
	"syscall"
)

// ThisHost is the machine gpucr torchrun runs on.
func ThisHost() Host {
	return Host{Getenv: os.Getenv, CPUs: runtime.NumCPU, GPUs: VisibleGPUs, FreePort: FreePort, Python: "python3"}
}

var nvidiaDevice = regexp.MustCompile(`^nvidia[0-9]+$`)

// VisibleGPUs counts the GPUs a rank may use: those CUDA_VISIBLE_DEVICES
// names if it is set, else the /dev/nvidiaN devices. Neither CUDA nor NVML
// is asked: both open /dev/nvidiactl and leave the driver's mappings in the
// launcher, which CRIU dumps with the ranks and would then refuse.
func VisibleGPUs() (int, error) {
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		return countVisible(v), nil
	}
	entries, err := os.ReadDir("/dev")
	if err != nil {
		return 0, fmt.Errorf("list /dev: %w", err)
	}
	n := 0
	for _, e := range entries {
		if nvidiaDevice.MatchString(e.Name()) {
			n++
		}
	}
	return n, nil
}

// countVisible counts the devices of a CUDA_VISIBLE_DEVICES value: CUDA
// takes the entries up to the first invalid one (-1, say), and an empty
// value hides every GPU.
func countVisible(v string) int {
	n := 0
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		if e == "" || strings.HasPrefix(e, "-") {
			break
		}
		n++
	}
	return n
}

// FreePort is a TCP port no one listens on now: the kernel's choice for a
// socket bound to port 0 on every address, closed again. It uses the
// system calls themselves: Go's net package would start its poller (an
// epoll instance and an eventfd) in the launcher for good.
func FreePort() (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{}); err != nil {
		return 0, fmt.Errorf("bind to port 0: %w", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return 0, fmt.Errorf("getsockname: %w", err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		return 0, fmt.Errorf("getsockname: not an IPv4 address (%T)", sa)
	}
	return in.Port, nil
}
