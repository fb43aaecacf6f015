package daemon

import (
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzServeFrame feeds arbitrary bytes to a connection handler, as any local
// user can: it must answer or close, never panic or hang, and leave nothing
// allocated once the connection is gone.
func FuzzServeFrame(f *testing.F) {
	hello := frame(mustMarshal(&helperpb.Request{Id: 1, Body: &helperpb.Request_Hello{Hello: &helperpb.Hello{ProtocolVersion: 1, Role: helperpb.Role_ROLE_CLIENT_CALLS}}}))
	alloc := frame(mustMarshal(&helperpb.Request{Id: 2, Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{DeviceUuid: "GPU-00000000-0000-0000-0000-000000000000", Size: 1}}}))
	f.Add(hello)
	f.Add(append(append([]byte{}, hello...), alloc...))
	export := frame(mustMarshal(&helperpb.Request{Id: 3, Body: &helperpb.Request_Export{Export: &helperpb.Export{AllocId: 1}}}))
	f.Add(append(append(append([]byte{}, hello...), alloc...), export...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	dev := fakegpu.New(0, 64<<20)
	s := New(Config{Devices: []Device{dev}, Version: "fuzz", Log: zap.NewNop(), StatusTimeout: 10 * time.Millisecond})
	f.Fuzz(func(t *testing.T, in []byte) {
		fds, err := socketpair()
		if err != nil {
			t.Skip(err)
		}
		a, b := fds[0], fds[1]
		s.Go(a)
		_ = b.SetDeadline(time.Now().Add(5 * time.Second))
		go func() { _, _ = b.Write(in); _ = b.CloseWrite() }()
		buf := make([]byte, 64<<10)
		for {
			if _, err := b.Read(buf); err != nil {
				break
			}
		}
		b.Close()
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if n, _ := dev.Used(); n == 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatal("allocations left after the connection closed")
			}
		}
	})
}

func socketpair() ([2]*net.UnixConn, error) {
	var out [2]*net.UnixConn
	fds, err := unixSocketpair()
	if err != nil {
		return out, err
	}
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "sp")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return out, err
		}
		out[i] = c.(*net.UnixConn)
	}
	return out, nil
}
