package daemon

import (
	"strings"
	"testing"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// TestServeRefusedWhenOff: a helper without a pool of workers answers a
// served process's Serve with a refusal that says how to turn served mode
// on, and attaches no descriptor.
func TestServeRefusedWhenOff(t *testing.T) {
	_, sock := startServer(t, newFake())
	c := dial(t, sock)
	if r := c.hello(helperpb.Role_ROLE_SERVED, 0); r.Error != nil || r.GetHello() == nil || len(r.GetHello().Devices) != 1 {
		t.Fatalf("ROLE_SERVED hello: %v", r)
	}
	r, fds, err := c.call(&helperpb.Request{Id: 2, Body: &helperpb.Request_Serve{Serve: &helperpb.Serve{}}})
	if err != nil || r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_UNAVAILABLE ||
		!strings.Contains(r.Error.Message, "--served-pool") || len(fds) != 0 {
		t.Fatalf("Serve with served mode off: %v, %d fds, %v", r, len(fds), err)
	}
	if st := status(t, sock); st.Served != nil {
		t.Errorf("status of a helper without served mode shows a pool: %v", st.Served)
	}
}

// TestServedRoleAsksOnlyServe: a served process's connection that asks
// anything but Serve (here an allocation, which only a client's calls
// connection may ask) is refused and closed.
func TestServedRoleAsksOnlyServe(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	c := dial(t, sock)
	c.hello(helperpb.Role_ROLE_SERVED, 0)
	r, _, err := c.call(&helperpb.Request{Id: 2, Body: &helperpb.Request_Alloc{Alloc: &helperpb.Alloc{DeviceUuid: dev.Info().Uuid, Size: 1}}})
	if err != nil || r.Error == nil || r.Error.Code != helperpb.ErrorCode_ERROR_BAD_REQUEST {
		t.Fatalf("Alloc on a served connection: %v, %v", r, err)
	}
	if _, _, err := c.w.ReadFrame(); err == nil {
		t.Fatal("the served connection stays open after a refused request")
	}
	if b, n := dev.Used(); b != 0 || n != 0 {
		t.Errorf("the refused Alloc made %d bytes in %d handles", b, n)
	}
}

// TestServedDevice: a Serve names its device by ordinal or UUID; a
// process the helper holds memory for gets the device of that memory
// whatever it names.
func TestServedDevice(t *testing.T) {
	d0, d1 := newFake(), newFake()
	devs := []Device{d0, d1}
	if got, err := servedDevice(devs, &helperpb.Serve{Device: 1}, nil); err != nil || got != 1 {
		t.Errorf("ordinal 1: %d, %v", got, err)
	}
	if _, err := servedDevice(devs, &helperpb.Serve{Device: 2}, nil); err == nil || !strings.Contains(err.Error(), "no device 2") {
		t.Errorf("ordinal 2 of 2 devices: %v", err)
	}
	if _, err := servedDevice(devs, &helperpb.Serve{Uuid: "GPU-nope"}, nil); err == nil || !strings.Contains(err.Error(), "GPU-nope") {
		t.Errorf("an unknown UUID: %v", err)
	}
	cl := &client{allocs: map[uint64]*alloc{1: {dev: d1}, 2: {dev: d1}}}
	if got, err := servedDevice(devs, &helperpb.Serve{Device: 0}, cl); err != nil || got != 1 {
		t.Errorf("a client whose memory is on device 1, asking for 0: %d, %v", got, err)
	}
	cl.allocs[3] = &alloc{dev: d0}
	if got, err := servedDevice(devs, &helperpb.Serve{Device: 0}, cl); err != nil || got != 0 {
		t.Errorf("a client with memory on both devices, asking for 0: %d, %v", got, err)
	}
}
