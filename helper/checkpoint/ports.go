package checkpoint

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"golang.org/x/sys/unix"
)

// A restored process listens on its TCP ports again: CRIU binds each
// listening socket to its old port. A socket bound without SO_REUSEADDR (a
// job's store, NCCL's bootstrap) cannot be bound while another socket of
// the host has that port, a connection the job closed and that waits out
// its TIME_WAIT (60 s on Linux) included: CRIU then fails with "Can't bind
// inet socket: Address already in use" (measured with a DDP job restored
// right after it ended). So a restore first waits for such ports to be
// free while only closing connections hold them (ending those in
// TIME_WAIT, the image's own: timewait.go), and refuses at once, naming
// the port, when something holds it that will not go by itself.

// tcpListenState is TCP_LISTEN, as CRIU's images and /proc/net/tcp give it.
const tcpListenState = 10

// portsFreeWait bounds the wait for closing connections (TIME_WAIT is 60 s).
const portsFreeWait = 65 * time.Second

// listenPort is a TCP port a process of the image listens on.
type listenPort struct {
	port      uint16
	reuseAddr bool
}

// imageListenPorts lists the TCP ports the image's processes (in dir, their
// open files) listen on in the restore's network namespace (none when the
// image brings its own: a container's).
func imageListenPorts(dir string, files []*fdinfo.FileEntry) []listenPort {
	if m, _ := filepath.Glob(filepath.Join(dir, "netns-*.img")); len(m) > 0 {
		return nil
	}
	var out []listenPort
	for _, fe := range files {
		sk := fe.GetIsk()
		if sk == nil {
			continue
		}
		if sk.GetProto() != unix.IPPROTO_TCP || sk.GetState() != tcpListenState || sk.GetSrcPort() == 0 {
			continue
		}
		lp := listenPort{port: uint16(sk.GetSrcPort()), reuseAddr: sk.GetOpts().GetReuseaddr()}
		if !slices.Contains(out, lp) {
			out = append(out, lp)
		}
	}
	return out
}

// imageFiles are the open files of the image's processes (CRIU's files.img;
// none if the image has none).
func imageFiles(dir string) ([]*fdinfo.FileEntry, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	defer d.Close()
	files, err := filesIn(int(d.Fd()))
	if err != nil {
		return nil, fmt.Errorf("image directory %s: %w", dir, err)
	}
	return files, nil
}

// filesIn are the open files of the images in the directory open as dfd.
func filesIn(dfd int) ([]*fdinfo.FileEntry, error) {
	msgs, err := decodeImage(dfd, "files.img", &fdinfo.FileEntry{})
	if err != nil {
		return nil, err
	}
	var out []*fdinfo.FileEntry
	for _, m := range msgs {
		if fe, ok := m.(*fdinfo.FileEntry); ok {
			out = append(out, fe)
		}
	}
	return out, nil
}

// portUse is what holds one TCP port on this host.
type portUse struct {
	listening bool // a socket listens on it: it does not go by itself
	open      int  // connections using it as their local port, not closing
	closing   int  // connections that closed and wait out TIME_WAIT and the like
	// timeWaits are those of the closing connections in TIME_WAIT, which
	// a restore may end (timewait.go).
	timeWaits []tcpConn
}

// closingStates are the TCP states of a connection that was closed and
// goes by itself: FIN_WAIT1, FIN_WAIT2, TIME_WAIT, CLOSE, LAST_ACK,
// CLOSING.
var closingStates = []int64{4, 5, 6, 7, 9, 11}

// readPortUse adds what /proc/net/tcp-formatted text r, of family
// (unix.AF_INET or unix.AF_INET6), says of port.
func readPortUse(r io.Reader, family uint8, port uint16, u *portUse) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.Contains(f[1], ":") {
			continue // the header
		}
		local := f[1][strings.LastIndexByte(f[1], ':')+1:]
		p, err1 := strconv.ParseUint(local, 16, 16)
		st, err2 := strconv.ParseInt(f[3], 16, 16)
		if err1 != nil || err2 != nil || uint16(p) != port {
			continue
		}
		switch {
		case st == tcpListenState:
			u.listening = true
		case slices.Contains(closingStates, st):
			u.closing++
			if c, ok := parseConn(family, f[1], f[2]); ok && st == tcpTimeWaitState {
				u.timeWaits = append(u.timeWaits, c)
			}
		default:
			u.open++
		}
	}
}

// hostPortUse is what holds port in this network namespace.
func hostPortUse(port uint16) portUse {
	var u portUse
	for _, src := range []struct {
		name   string
		family uint8
	}{{"/proc/net/tcp", unix.AF_INET}, {"/proc/net/tcp6", unix.AF_INET6}} {
		if f, err := os.Open(src.name); err == nil {
			readPortUse(f, src.family, port, &u)
			f.Close()
		}
	}
	return u
}

// blocks says whether u keeps a listening socket from binding port again,
// and whether waiting helps.
func (u portUse) blocks(lp listenPort) (blocked, passes bool) {
	if u.listening {
		return true, false
	}
	if lp.reuseAddr || u.open+u.closing == 0 {
		return false, true
	}
	return true, u.open == 0
}

// restorePortsFree makes the TCP ports the image's processes listen on free
// to bind again: it ends the connections in TIME_WAIT that hold one (the
// image's own closed connections: timewait.go) unless waitClosed, and waits
// (at most portsFreeWait) for what closes by itself; it refuses a restore
// whose port something holds that will not go by itself. files are the
// image's open files (imageFiles).
func restorePortsFree(ctx context.Context, dir string, files []*fdinfo.FileEntry, waitClosed bool, ev *emitter) error {
	ports := imageListenPorts(dir, files)
	if len(ports) == 0 {
		return nil
	}
	deadline := time.Now().Add(portsFreeWait)
	told := false
	var endErr error
	for {
		var waiting []string
		for _, lp := range ports {
			u := hostPortUse(lp.port)
			blocked, passes := u.blocks(lp)
			if !blocked {
				continue
			}
			if !passes {
				what := "a process of this host listens on it"
				if !u.listening {
					what = fmt.Sprintf("%d open connection(s) of this host use it", u.open)
				}
				return fmt.Errorf("restore from %s refused: a process of the image listens on TCP port %d, and %s: "+
					"stop what holds it, or restore where the port is free (another host, or a network namespace of its own)",
					dir, lp.port, what)
			}
			if !waitClosed && endErr == nil {
				n, err := endTimeWaits(u.timeWaits)
				if n > 0 {
					ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("ended %d closed connection(s) in TIME_WAIT on TCP port %d, "+
						"which a process of the image listens on (without SO_REUSEADDR)", n, lp.port)})
				}
				endErr = err
				if u = hostPortUse(lp.port); !holds(u, lp) {
					continue
				}
			}
			waiting = append(waiting, strconv.Itoa(int(lp.port)))
		}
		if len(waiting) == 0 {
			return nil
		}
		if !told {
			why := ""
			if endErr != nil {
				why = fmt.Sprintf(" (they could not be ended: %v)", endErr)
			}
			ev.emit(Event{Kind: Phase, Text: fmt.Sprintf("waiting for TCP port %s: the image's processes listen on it "+
				"(without SO_REUSEADDR), and connections closed on it wait out their TIME_WAIT (at most 60 s)%s",
				strings.Join(waiting, ", "), why)})
			told = true
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("restore from %s refused: TCP port %s, which a process of the image listens on, is still held by "+
				"closing connections after %v", dir, strings.Join(waiting, ", "), portsFreeWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// holds says whether u keeps a listening socket lp from binding.
func holds(u portUse, lp listenPort) bool {
	b, _ := u.blocks(lp)
	return b
}
