package wire

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair is a connected pair of unix stream sockets, wrapped.
func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	wrap := func(fd int) *Conn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		nc, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(nc.(*net.UnixConn))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return wrap(fds[0]), wrap(fds[1])
}

func header(n int) []byte {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, uint32(n))
	return b
}

func TestMaxBody(t *testing.T) {
	r, w := pair(t)
	r.SetReadLimits(ReadLimits{MaxBody: func() int { return 50 }})
	if err := w.WriteFrame(make([]byte, 50), nil); err != nil {
		t.Fatal(err)
	}
	if b, _, err := r.ReadFrame(); err != nil || len(b) != 50 {
		t.Fatalf("a frame of the largest size: %d bytes, %v", len(b), err)
	}
	if err := w.WriteFrame(make([]byte, 51), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.ReadFrame(); !errors.Is(err, ErrFrame) {
		t.Fatalf("a frame one byte too long: %v", err)
	}
}

// A frame that has begun must end within FrameTimeout; between frames a
// connection may stay idle as long as it likes.
func TestFrameTimeout(t *testing.T) {
	r, w := pair(t)
	const timeout = 200 * time.Millisecond
	r.SetReadLimits(ReadLimits{FrameTimeout: timeout})
	got := make(chan error, 1)
	go func() { _, _, err := r.ReadFrame(); got <- err }()
	select {
	case err := <-got:
		t.Fatalf("an idle connection's read ended: %v", err)
	case <-time.After(3 * timeout):
	}
	if err := w.WriteFrame([]byte("hello"), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("a frame after a long idle time: %v", err)
	}
	// A header and part of a body, then nothing.
	if _, err := w.UnixConn().Write(append(header(100), make([]byte, 10)...)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.ReadFrame(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stalled frame: %v", err)
	}
	// Part of a header.
	r2, w2 := pair(t)
	r2.SetReadLimits(ReadLimits{FrameTimeout: timeout})
	if _, err := w2.UnixConn().Write([]byte{1, 0}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r2.ReadFrame(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stalled header: %v", err)
	}
}

// IdleDeadline bounds the wait for a frame, and a frame begun before it.
func TestIdleDeadline(t *testing.T) {
	r, _ := pair(t)
	r.SetReadLimits(ReadLimits{FrameTimeout: time.Hour, IdleDeadline: time.Now().Add(100 * time.Millisecond)})
	if _, _, err := r.ReadFrame(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("no frame before the idle deadline: %v", err)
	}
	r2, w2 := pair(t)
	r2.SetReadLimits(ReadLimits{FrameTimeout: time.Hour, IdleDeadline: time.Now().Add(200 * time.Millisecond)})
	if _, err := w2.UnixConn().Write(header(100)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r2.ReadFrame(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a frame begun before the idle deadline, not done by it: %v", err)
	}
}

// Reserve is asked for each body before it is read, with the frame's
// deadline, and its bytes are given back once the frame is decoded; a
// refusal fails the read.
func TestReserve(t *testing.T) {
	r, w := pair(t)
	held := 0
	var asked []int
	var deadline time.Time
	refuse := errors.New("no room")
	r.SetReadLimits(ReadLimits{FrameTimeout: time.Minute, Reserve: func(n int, d time.Time) (func(), error) {
		asked, deadline = append(asked, n), d
		if n > 1000 {
			return nil, refuse
		}
		held += n
		return func() { held -= n }, nil
	}})
	start := time.Now()
	if err := w.WriteFrame([]byte{0x08, 0x07}, nil); err != nil { // Request{id: 7}
		t.Fatal(err)
	}
	req, _, err := r.ReadRequest()
	if err != nil || req.Id != 7 {
		t.Fatalf("ReadRequest: %v, %v", req, err)
	}
	if held != 0 || len(asked) != 1 || asked[0] != 2 {
		t.Fatalf("reserved %v, %d still held", asked, held)
	}
	if deadline.Before(start.Add(time.Minute-time.Second)) || deadline.After(time.Now().Add(time.Minute)) {
		t.Fatalf("reserved with deadline %v, want a minute after the frame began", deadline)
	}
	if err := w.WriteFrame(make([]byte, 1001), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.ReadRequest(); !errors.Is(err, refuse) {
		t.Fatalf("a frame refused its bytes: %v", err)
	}
}
