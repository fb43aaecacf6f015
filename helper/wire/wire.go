// Package wire is the framing of the helper protocol (docs/helper-protocol.md):
// a 4-byte little-endian length N (1 <= N <= MaxFrame), then N bytes of one
// serialized helperpb.Request or helperpb.Response. File descriptors ride as
// SCM_RIGHTS on the sendmsg that carries the frame's first byte; receiving
// uses MSG_CMSG_CLOEXEC, sending MSG_NOSIGNAL. Both the helper daemon and the
// Go client library (CLI, tests) use it.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

const (
	// MaxFrame is the largest frame body accepted or sent.
	MaxFrame = 16 << 20
	// MaxFDs is the most file descriptors one frame may carry.
	MaxFDs = 200
	// Version is the protocol version this build speaks.
	Version = uint32(helperpb.Version_PROTOCOL_VERSION)
)

// ErrFrame marks a frame that breaks the framing rules (bad length, fds that
// came in the middle of a frame, too many fds, truncated control data). The
// connection cannot be trusted after it.
var ErrFrame = errors.New("bad frame")

// oobSpace fits the control message of MaxFDs descriptors (plus slack: the
// kernel may deliver more than the sender meant to, and a truncated control
// message must be detected, not guessed).
var oobSpace = unix.CmsgSpace(4 * (MaxFDs + 8))

// Conn frames one unix stream connection. Reads and writes may run
// concurrently with each other, but not two reads or two writes at once: the
// caller serializes each direction.
type Conn struct {
	c   *net.UnixConn
	rc  syscall.RawConn
	lim ReadLimits
}

// ReadLimits bound what reading one frame may cost the reader: how long a
// frame that has begun may take, how large it may be, and how much memory
// all frames being read at once may hold. The helper sets them on every
// connection; the zero value is the plain framing (MaxFrame, no deadline
// touched).
type ReadLimits struct {
	// MaxBody, if set, is the largest body accepted for the next frame
	// (at most MaxFrame; 0 or more than MaxFrame: MaxFrame). It is asked
	// once the frame's length has arrived; a longer frame is an ErrFrame.
	MaxBody func() int
	// FrameTimeout bounds a frame once its first byte has arrived: the
	// rest must follow within it, or the read fails with a timeout
	// (os.ErrDeadlineExceeded). 0: no bound, and the read deadline is left
	// to the caller.
	FrameTimeout time.Duration
	// IdleDeadline, with FrameTimeout, bounds the wait for a frame's first
	// byte, and a frame begun before it must end by it too. Zero: a
	// connection may stay idle between frames for ever.
	IdleDeadline time.Time
	// Reserve, if set, is asked for a body's n bytes before they are read
	// and may wait for them until deadline (zero: no deadline); release
	// gives them back once the frame is read and decoded.
	Reserve func(n int, deadline time.Time) (release func(), err error)
}

// SetReadLimits sets the limits of the next reads. Only the reading side
// calls it, between frames.
func (c *Conn) SetReadLimits(l ReadLimits) { c.lim = l }

// New wraps c.
func New(c *net.UnixConn) (*Conn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, rc: rc}, nil
}

// UnixConn returns the underlying connection (deadlines, Close).
func (c *Conn) UnixConn() *net.UnixConn { return c.c }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// PeerCred returns the peer's SO_PEERCRED (pid, uid, gid at connect time).
func (c *Conn) PeerCred() (*unix.Ucred, error) {
	var cred *unix.Ucred
	var credErr error
	err := c.rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred, nil
}

// PeerGroups returns the peer's supplementary groups at connect time
// (SO_PEERGROUPS, Linux 4.13 and newer); none where the kernel cannot tell.
func (c *Conn) PeerGroups() ([]uint32, error) {
	var groups []uint32
	var gerr error
	err := c.rc.Control(func(fd uintptr) {
		// The kernel says how much room it needs when there is too little.
		for n := 64; ; {
			buf := make([]uint32, n)
			size := uint32(4 * n)
			_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_PEERGROUPS,
				uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
			switch {
			case e == unix.ERANGE && int(size/4) > n:
				n = int(size / 4)
				continue
			case e == unix.ENOPROTOOPT:
			case e != 0:
				gerr = fmt.Errorf("SO_PEERGROUPS: %w", e)
			default:
				groups = buf[:size/4]
			}
			return
		}
	})
	if err != nil {
		return nil, err
	}
	return groups, gerr
}

func (c *Conn) recvmsg(p, oob []byte) (n, oobn, flags int, err error) {
	var opErr error
	err = c.rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, opErr = unix.Recvmsg(int(fd), p, oob, unix.MSG_CMSG_CLOEXEC)
		return opErr != unix.EAGAIN && opErr != unix.EINTR
	})
	if err == nil {
		err = opErr
	}
	return n, oobn, flags, err
}

// readFull reads exactly len(p) bytes. Descriptors are accepted only while
// takeFDs is set (the first byte of a frame); any others are closed and the
// read fails with ErrFrame. began, if set, runs once the first bytes came.
func (c *Conn) readFull(p []byte, takeFDs bool, fds *[]int, began func()) error {
	oob := make([]byte, oobSpace)
	got := 0
	for got < len(p) {
		n, oobn, flags, err := c.recvmsg(p[got:], oob)
		if err != nil {
			return err
		}
		var newFDs []int
		if oobn > 0 {
			newFDs = parseFDs(oob[:oobn])
		}
		bad := ""
		switch {
		case flags&unix.MSG_CTRUNC != 0:
			bad = "control data truncated (too many file descriptors)"
		case len(newFDs) > 0 && !(takeFDs && got == 0):
			bad = "file descriptors in the middle of a frame"
		case len(*fds)+len(newFDs) > MaxFDs:
			bad = fmt.Sprintf("more than %d file descriptors", MaxFDs)
		}
		if bad != "" {
			closeFDs(newFDs)
			return fmt.Errorf("%w: %s", ErrFrame, bad)
		}
		*fds = append(*fds, newFDs...)
		if n == 0 {
			if got == 0 && takeFDs {
				return io.EOF
			}
			return io.ErrUnexpectedEOF
		}
		if got == 0 && began != nil {
			began()
		}
		got += n
	}
	return nil
}

func parseFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		r, err := unix.ParseUnixRights(&msgs[i])
		if err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// CloseFDs closes every descriptor in fds.
func CloseFDs(fds []int) { closeFDs(fds) }

// ReadFrame reads one frame: its body and the descriptors that came with its
// first byte (the caller owns them). io.EOF: the peer closed between frames.
// Errors wrapping ErrFrame: the peer broke the framing (or the limits).
func (c *Conn) ReadFrame() ([]byte, []int, error) {
	body, fds, release, err := c.readFrame()
	if err != nil {
		return nil, nil, err
	}
	release()
	return body, fds, nil
}

// readFrame is ReadFrame under the connection's ReadLimits; the caller calls
// release once it is done with the body.
func (c *Conn) readFrame() (body []byte, fds []int, release func(), err error) {
	lim := c.lim
	var deadline time.Time // of this frame, once it has begun
	var began func()
	if lim.FrameTimeout > 0 {
		if err := c.c.SetReadDeadline(lim.IdleDeadline); err != nil {
			return nil, nil, nil, err
		}
		began = func() {
			deadline = time.Now().Add(lim.FrameTimeout)
			if !lim.IdleDeadline.IsZero() && lim.IdleDeadline.Before(deadline) {
				deadline = lim.IdleDeadline
			}
			_ = c.c.SetReadDeadline(deadline)
		}
	}
	var hdr [4]byte
	if err := c.readFull(hdr[:], true, &fds, began); err != nil {
		closeFDs(fds)
		return nil, nil, nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	limit := MaxFrame
	if lim.MaxBody != nil {
		if m := lim.MaxBody(); m > 0 && m < limit {
			limit = m
		}
	}
	if n == 0 || n > uint32(limit) {
		closeFDs(fds)
		return nil, nil, nil, fmt.Errorf("%w: length %d (allowed 1..%d)", ErrFrame, n, limit)
	}
	release = func() {}
	if lim.Reserve != nil {
		if release, err = lim.Reserve(int(n), deadline); err != nil {
			closeFDs(fds)
			return nil, nil, nil, err
		}
	}
	body = make([]byte, n)
	if err := c.readFull(body, false, &fds, nil); err != nil {
		release()
		closeFDs(fds)
		return nil, nil, nil, err
	}
	return body, fds, release, nil
}

// WriteFrame sends body as one frame with fds attached to its first byte. The
// descriptors stay the caller's (the kernel duplicates them into the message).
func (c *Conn) WriteFrame(body []byte, fds []int) error {
	if len(body) == 0 || len(body) > MaxFrame {
		return fmt.Errorf("%w: refusing to send a frame of %d bytes", ErrFrame, len(body))
	}
	if len(fds) > MaxFDs {
		return fmt.Errorf("%w: refusing to send %d file descriptors (at most %d)", ErrFrame, len(fds), MaxFDs)
	}
	buf := make([]byte, 4+len(body))
	binary.LittleEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for len(buf) > 0 {
		var n int
		var opErr error
		err := c.rc.Write(func(fd uintptr) bool {
			n, opErr = unix.SendmsgN(int(fd), buf, oob, nil, unix.MSG_NOSIGNAL)
			return opErr != unix.EAGAIN && opErr != unix.EINTR
		})
		if err == nil {
			err = opErr
		}
		if err != nil {
			return err
		}
		buf = buf[n:]
		oob = nil
	}
	return nil
}

// ReadRequest reads and decodes one Request frame.
func (c *Conn) ReadRequest() (*helperpb.Request, []int, error) {
	body, fds, release, err := c.readFrame()
	if err != nil {
		return nil, nil, err
	}
	var m helperpb.Request
	err = proto.Unmarshal(body, &m)
	release()
	if err != nil {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("%w: request does not decode: %v", ErrFrame, err)
	}
	return &m, fds, nil
}

// ReadResponse reads and decodes one Response frame.
func (c *Conn) ReadResponse() (*helperpb.Response, []int, error) {
	body, fds, release, err := c.readFrame()
	if err != nil {
		return nil, nil, err
	}
	var m helperpb.Response
	err = proto.Unmarshal(body, &m)
	release()
	if err != nil {
		closeFDs(fds)
		return nil, nil, fmt.Errorf("%w: response does not decode: %v", ErrFrame, err)
	}
	return &m, fds, nil
}

// Write encodes m (a Request or Response) and sends it with fds.
func (c *Conn) Write(m proto.Message, fds []int) error {
	body, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return c.WriteFrame(body, fds)
}
