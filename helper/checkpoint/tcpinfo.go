package checkpoint

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// What the kernel knows of one TCP connection beyond /proc/net/tcp's
// queues: its tcp_info, by its endpoints (sock_diag, as `ss -i` asks).
// A job's drain reads it to tell a connection whose receiver's buffer is
// full from one still in flight (jobconn.go).

// connInfo is the part of a connection's tcp_info the drain reads.
type connInfo struct {
	unacked uint32 // segments sent and not acknowledged
	sndWnd  uint32 // the window the peer advertised, in bytes
}

// windowFull says whether the connection is quiet though its send queue
// is not empty: everything sent was acknowledged and the peer's window is
// closed, so the kernel sends nothing but window probes, which carry no
// data, until the peer reads.
func (i connInfo) windowFull() bool { return i.unacked == 0 && i.sndWnd == 0 }

// Offsets in struct tcp_info (linux/tcp.h), as x/sys/unix lays it out.
var (
	tcpInfoUnacked = int(unsafe.Offsetof(unix.TCPInfo{}.Unacked))
	tcpInfoSndWnd  = int(unsafe.Offsetof(unix.TCPInfo{}.Snd_wnd))
)

// inetDiagMsgSize is sizeof(struct inet_diag_msg): the head of each
// answer, before its attributes.
const inetDiagMsgSize = 72

// inetDiagInfo is INET_DIAG_INFO, the attribute that carries tcp_info.
const inetDiagInfo = 2

// tcpInfoOf asks the sock_diag socket fd for c's tcp_info (c established).
// A kernel whose tcp_info is too short to carry the peer's window
// (tcpi_snd_wnd, Linux 6.2 on) is an error: the window is then unknown.
func tcpInfoOf(fd int, c tcpConn) (connInfo, error) {
	req := destroyRequest(c, 1, 1<<tcpEstablishedState)
	ne := binary.NativeEndian
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	req[unix.NLMSG_HDRLEN+2] = 1 << (inetDiagInfo - 1) // idiag_ext
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return connInfo{}, fmt.Errorf("sock_diag: send: %w", err)
	}
	buf := make([]byte, 8192)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return connInfo{}, fmt.Errorf("sock_diag: receive: %w", err)
	}
	b := buf[:n]
	if len(b) < unix.NLMSG_HDRLEN {
		return connInfo{}, fmt.Errorf("sock_diag: an answer of %d bytes", n)
	}
	l, typ := int(ne.Uint32(b)), ne.Uint16(b[4:])
	if l < unix.NLMSG_HDRLEN || l > len(b) {
		return connInfo{}, fmt.Errorf("sock_diag: a message of %d bytes in an answer of %d", l, n)
	}
	if typ == unix.NLMSG_ERROR && l >= unix.NLMSG_HDRLEN+4 {
		return connInfo{}, fmt.Errorf("sock_diag: %w", unix.Errno(-int32(ne.Uint32(b[unix.NLMSG_HDRLEN:]))))
	}
	if typ != unix.SOCK_DIAG_BY_FAMILY || l < unix.NLMSG_HDRLEN+inetDiagMsgSize {
		return connInfo{}, fmt.Errorf("sock_diag: an answer of type %d, %d bytes", typ, l)
	}
	// the attributes: struct rtattr (length, type), then the data, each
	// aligned to 4 bytes
	for a := b[unix.NLMSG_HDRLEN+inetDiagMsgSize : l]; len(a) >= 4; {
		al, at := int(ne.Uint16(a)), ne.Uint16(a[2:])
		if al < 4 || al > len(a) {
			break
		}
		if at == inetDiagInfo {
			info := a[4:al]
			if len(info) < tcpInfoSndWnd+4 {
				return connInfo{}, fmt.Errorf("sock_diag: tcp_info of %d bytes has no peer's window (a kernel before 6.2)", len(info))
			}
			return connInfo{unacked: ne.Uint32(info[tcpInfoUnacked:]), sndWnd: ne.Uint32(info[tcpInfoSndWnd:])}, nil
		}
		a = a[min(len(a), (al+3)&^3):]
	}
	return connInfo{}, fmt.Errorf("sock_diag: no tcp_info in the answer")
}
