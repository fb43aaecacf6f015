package checkpoint

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A connection in TIME_WAIT belongs to no process: the kernel keeps it for
// 60 s after both sides closed, to absorb late segments of that connection.
// When its local port is one the image's processes listen on (the
// connections their listener accepted before the dump), it is a remnant of
// the very processes being restored, and it alone keeps CRIU from binding
// the listener again. The kernel can end such a connection on request
// (sock_diag's SOCK_DESTROY, what `ss -K` sends; it needs CAP_NET_ADMIN and
// a kernel with CONFIG_INET_DIAG_DESTROY), so a restore need not wait out
// the minute.

// tcpTimeWaitState is TCP_TIME_WAIT in /proc/net/tcp.
const tcpTimeWaitState = 6

// tcpConn is one TCP connection of this host, as /proc/net/tcp lists it.
type tcpConn struct {
	family        uint8    // unix.AF_INET or unix.AF_INET6
	local, remote [16]byte // addresses in network byte order (IPv4: the first 4 bytes)
	lport, rport  uint16
	localText     string // for messages: /proc/net/tcp's address:port
	remoteText    string
}

// parseConn reads a connection of family from /proc/net/tcp's local and
// remote address columns.
func parseConn(family uint8, local, remote string) (tcpConn, bool) {
	c := tcpConn{family: family, localText: local, remoteText: remote}
	var ok1, ok2 bool
	c.local, c.lport, ok1 = parseProcAddr(local)
	c.remote, c.rport, ok2 = parseProcAddr(remote)
	return c, ok1 && ok2
}

// parseProcAddr reads /proc/net/tcp's "ADDR:PORT": ADDR is the address's
// 32-bit words (1 for IPv4, 4 for IPv6) each printed as a number in host
// byte order, PORT a number.
func parseProcAddr(s string) (addr [16]byte, port uint16, ok bool) {
	a, p, found := strings.Cut(s, ":")
	if !found || (len(a) != 8 && len(a) != 32) {
		return addr, 0, false
	}
	pv, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return addr, 0, false
	}
	raw, err := hex.DecodeString(a)
	if err != nil {
		return addr, 0, false
	}
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(addr[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	return addr, uint16(pv), true
}

// inetDiagReqV2Size is sizeof(struct inet_diag_req_v2) of linux/inet_diag.h.
const inetDiagReqV2Size = 56

// inetDiagNoCookie is INET_DIAG_NOCOOKIE: match the socket by its addresses.
const inetDiagNoCookie = ^uint32(0)

// destroyRequest is the netlink message that asks the kernel to end c, if
// it is in one of states (a bit mask of /proc/net/tcp's states):
// an nlmsghdr, then struct inet_diag_req_v2 (family, protocol, ext, pad,
// states, then the socket id: source and destination ports big-endian,
// the two addresses, the interface, the cookie).
func destroyRequest(c tcpConn, seq uint32, states uint32) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+inetDiagReqV2Size)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DESTROY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	ne.PutUint32(b[8:], seq)
	r := b[unix.NLMSG_HDRLEN:]
	r[0] = c.family
	r[1] = unix.IPPROTO_TCP
	ne.PutUint32(r[4:], states)
	binary.BigEndian.PutUint16(r[8:], c.lport)
	binary.BigEndian.PutUint16(r[10:], c.rport)
	copy(r[12:28], c.local[:])
	copy(r[28:44], c.remote[:])
	ne.PutUint32(r[48:], inetDiagNoCookie)
	ne.PutUint32(r[52:], inetDiagNoCookie)
	return b
}

// endTimeWaits ends the TIME_WAIT connections conns, and returns how many
// it ended (one already gone counts). Its error says why the kernel would
// not (no CAP_NET_ADMIN, a kernel without socket destruction).
func endTimeWaits(conns []tcpConn) (int, error) {
	if len(conns) == 0 {
		return 0, nil
	}
	fd, err := sockDiagSocket()
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	ended := 0
	for i, c := range conns {
		if err := sockDiagCall(fd, destroyRequest(c, uint32(i+1), 1<<tcpTimeWaitState)); err != nil && !errors.Is(err, unix.ENOENT) {
			return ended, fmt.Errorf("ending TCP connection %s -> %s: %w", c.localText, c.remoteText, err)
		}
		ended++
	}
	return ended, nil
}

// sockDiagSocket opens a netlink socket to the kernel's sock_diag, in the
// caller's network namespace.
func sockDiagSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return -1, fmt.Errorf("sock_diag netlink socket: %w", err)
	}
	return fd, nil
}

// sockDiagCall sends req on the sock_diag socket fd and reads the kernel's
// acknowledgement: nil, or the errno it answered.
func sockDiagCall(fd int, req []byte) error {
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	// the answer: nlmsghdr (length, type, ...) and, for NLMSG_ERROR, the
	// negated errno (0: done)
	b := buf[:n]
	ne := binary.NativeEndian
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(ne.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			break
		}
		if ne.Uint16(b[4:]) == unix.NLMSG_ERROR && l >= unix.NLMSG_HDRLEN+4 {
			if code := int32(ne.Uint32(b[unix.NLMSG_HDRLEN:])); code != 0 {
				return unix.Errno(-code)
			}
			return nil
		}
		b = b[min(len(b), (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
	}
	return fmt.Errorf("answer: no acknowledgement in %d bytes", n)
}
