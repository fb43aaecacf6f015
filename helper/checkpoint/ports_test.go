package checkpoint

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Lines in /proc/net/tcp's format, made up after what the GPU machine had
// when a DDP job had just ended: the port a rank listened on (0xAA49 =
// 43593) held by a connection in TIME_WAIT, another port listening, one
// connection open.
const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 020000C0:AA49 020000C0:B2C4 06 00000000:00000000 03:00000F2A 00000000     0        0 0 3 0000000000000000
   1: 0100007F:6D7C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 27714 1 0000000000000000 100 0 0 10 0
   2: 0100007F:B2C6 0100007F:6D7C 01 00000000:00000000 00:00000000 00000000     0        0 27718 1 0000000000000000 20 4 30 10 -1
`

func TestPortUse(t *testing.T) {
	use := func(port uint16) portUse {
		var u portUse
		readPortUse(strings.NewReader(procNetTCP), unix.AF_INET, port, &u)
		return u
	}
	for _, tc := range []struct {
		name            string
		port            uint16
		reuse           bool
		blocked, passes bool
	}{
		{"TIME_WAIT, no SO_REUSEADDR: wait", 43593, false, true, true},
		{"TIME_WAIT, SO_REUSEADDR: free", 43593, true, false, true},
		{"listening elsewhere: refuse", 0x6D7C, true, true, false},
		{"an open connection, no SO_REUSEADDR: refuse", 0xB2C6, false, true, false},
		{"an open connection, SO_REUSEADDR: free", 0xB2C6, true, false, true},
		{"unused: free", 5555, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blocked, passes := use(tc.port).blocks(listenPort{port: tc.port, reuseAddr: tc.reuse})
			if blocked != tc.blocked || passes != tc.passes {
				t.Errorf("port %d (SO_REUSEADDR %v): blocked %v, passes %v; want %v, %v (%+v)", tc.port, tc.reuse,
					blocked, passes, tc.blocked, tc.passes, use(tc.port))
			}
		})
	}
}

// CRIU's failure to bind a listening socket again is explained.
func TestBindHint(t *testing.T) {
	h := criuHintsFor([]string{"pid 25327: inet: Can't bind inet socket (id 9): Address already in use"}, false)
	if len(h) != 1 || !strings.Contains(h[0], "TCP port") {
		t.Errorf("hints %q", h)
	}
}
