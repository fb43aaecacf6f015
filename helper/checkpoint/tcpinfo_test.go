package checkpoint

import (
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/proc"
)

// TestTCPInfoWindowFull: a connection whose receiver reads nothing fills
// up; its sender's side then has bytes in its send queue, none of them
// unacknowledged, and the peer's window closed, which is what the job's
// drain accepts as quiet. The receiver's side, which sent nothing, is not
// window-full: its peer's window is open.
func TestTCPInfoWindowFull(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_ = r.(*net.TCPConn).SetReadBuffer(64 << 10)
	_ = w.(*net.TCPConn).SetWriteBuffer(64 << 10)
	go func() {
		chunk := make([]byte, 64<<10)
		_ = w.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}()
	fd, err := sockDiagSocket()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	self := proc.Pid(os.Getpid())
	writer := JobConn{Local: w.LocalAddr().String(), Remote: w.RemoteAddr().String()}
	var last connInfo
	var lastTx uint64
	for deadline := time.Now().Add(10 * time.Second); ; {
		qs, err := connQueues(self)
		if err != nil {
			t.Fatal(err)
		}
		q, ok := qs[writer]
		if !ok {
			t.Fatalf("%s is not in /proc/net/tcp", writer)
		}
		ti, err := tcpInfoOf(fd, q.conn)
		if err != nil {
			t.Fatalf("tcp_info of %s: %v", writer, err)
		}
		last, lastTx = ti, q.tx
		if q.tx > 0 && ti.windowFull() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer's side never showed a full receiver: %d bytes queued, %+v", lastTx, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
	qs, _ := connQueues(self)
	q := qs[writer.Peer()]
	if ti, err := tcpInfoOf(fd, q.conn); err != nil || ti.windowFull() {
		t.Errorf("the reader's side (it sent nothing, its peer reads): %+v, %v; want an open window", ti, err)
	}
}
