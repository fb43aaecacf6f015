package checkpoint

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// /proc/net/tcp's addresses are read into network byte order.
func TestParseProcAddr(t *testing.T) {
	var u portUse
	readPortUse(strings.NewReader(procNetTCP), unix.AF_INET, 43593, &u)
	conns := u.timeWaits
	if len(conns) != 1 {
		t.Fatalf("TIME_WAIT connections on port 43593: %d, want 1 (%+v)", len(conns), conns)
	}
	c := conns[0]
	if got := c.local[:4]; string(got) != "\xc0\x00\x00\x02" || c.lport != 43593 || c.rport != 0xB2C4 {
		t.Errorf("local %v:%d remote port %d, want 192.0.0.2:43593 and %d", got, c.lport, c.rport, 0xB2C4)
	}
	v6, port, ok := parseProcAddr("0000000000000000FFFF00000100007F:1F90")
	if !ok || port != 8080 || string(v6[10:]) != "\xff\xff\x7f\x00\x00\x01" {
		t.Errorf("IPv6 ::ffff:127.0.0.1:8080 read as %v port %d (%v)", v6, port, ok)
	}
	for _, bad := range []string{"0100007F", "0100007:1F90", "0100007G:1F90", "0100007F:1F9000"} {
		if _, _, ok := parseProcAddr(bad); ok {
			t.Errorf("%q read as an address", bad)
		}
	}
}

// loopback is the loopback address of family, at port.
func loopback(family, port int) unix.Sockaddr {
	if family == unix.AF_INET6 {
		return &unix.SockaddrInet6{Port: port, Addr: [16]byte{15: 1}}
	}
	return &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}
}

// listenNoReuse is a TCP socket of family listening on the loopback without
// SO_REUSEADDR (port 0: any), and its port.
func listenNoReuse(t *testing.T, family int, port int) (int, int) {
	t.Helper()
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, loopback(family, port)); err != nil {
		unix.Close(fd)
		return -1, 0
	}
	if err := unix.Listen(fd, 4); err != nil {
		t.Fatal(err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	switch a := got.(type) {
	case *unix.SockaddrInet4:
		return fd, a.Port
	case *unix.SockaddrInet6:
		return fd, a.Port
	}
	t.Fatalf("getsockname: %T", got)
	return -1, 0
}

// A listener's accepted connection closed by the server first waits out
// TIME_WAIT on the listener's port, which a socket without SO_REUSEADDR
// cannot bind then; once endTimeWaits ended it, it can.
func TestEndTimeWaits(t *testing.T) {
	for _, family := range []int{unix.AF_INET, unix.AF_INET6} {
		lfd, port := listenNoReuse(t, family, 0)
		if lfd < 0 {
			t.Fatalf("family %d: no loopback listener", family)
		}
		cfd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Connect(cfd, loopback(family, port)); err != nil {
			t.Fatal(err)
		}
		afd, _, err := unix.Accept(lfd)
		if err != nil {
			t.Fatal(err)
		}
		// the server's side closes first and ends in TIME_WAIT once the
		// client's FIN came
		unix.Close(afd)
		unix.Close(lfd)
		buf := make([]byte, 1)
		unix.Read(cfd, buf) // the server's FIN
		unix.Close(cfd)
		var conns []tcpConn
		for i := 0; i < 100 && len(conns) == 0; i++ {
			if conns = hostPortUse(uint16(port)).timeWaits; len(conns) == 0 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if len(conns) == 0 {
			t.Fatalf("family %d: no TIME_WAIT connection on port %d: the test shows nothing", family, port)
		}
		if fd, _ := listenNoReuse(t, family, port); fd >= 0 {
			unix.Close(fd)
			t.Fatalf("family %d: port %d bound again beside its TIME_WAIT: the test shows nothing", family, port)
		}
		n, err := endTimeWaits(conns)
		if err != nil {
			t.Fatalf("family %d: %v", family, err)
		}
		if n != len(conns) || len(hostPortUse(uint16(port)).timeWaits) != 0 {
			t.Errorf("family %d: ended %d of %d; left %+v", family, n, len(conns), hostPortUse(uint16(port)).timeWaits)
		}
		fd, _ := listenNoReuse(t, family, port)
		if fd < 0 {
			t.Errorf("family %d: port %d still cannot be bound", family, port)
		} else {
			unix.Close(fd)
		}
	}
}
