package checkpoint

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/helper/proc"
)

// TestScanTreeSelf: this test process holds a file unlinked under one name
// and linked under another, one with no name left, and a TCP connection to
// itself: the scan finds the first file among those --link-remap dumps,
// the second among those CRIU copies whole (ghosts), and the
// connection's two ends, each with its peer inside.
func TestScanTreeSelf(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "tmp"), filepath.Join(dir, "sem.x")
	f, err := os.Create(a)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Link(a, b); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	ghost, err := os.Create(filepath.Join(dir, "ghost"))
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	os.Remove(ghost.Name())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s1, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()

	self := proc.Pid(os.Getpid())
	s := scanTree([]proc.Pid{self})
	if len(s.unlinked) != 1 || s.unlinked[0].path != a {
		t.Errorf("unlinked files: %+v, want only %s", s.unlinked, a)
	}
	if len(s.ghosts) != 1 || s.ghosts[0].path != ghost.Name() {
		t.Errorf("files without a name left: %+v, want only %s", s.ghosts, ghost.Name())
	}
	var mine []treeConn
	for _, tc := range s.conns {
		if strings.Contains(tc.String(), c.LocalAddr().String()) {
			mine = append(mine, tc)
		}
	}
	if len(mine) != 2 || !mine[0].inside || !mine[1].inside {
		t.Fatalf("the connection %s: %+v, want its two ends, inside", c.LocalAddr(), mine)
	}

	// Alone in "the tree", the peer is outside: refused, naming it, unless
	// the user chose.
	want := c.LocalAddr().String() + " -> " + l.Addr().String()
	s.conns = mine[:1]
	if !strings.Contains(mine[0].String()+mine[1].String(), want) {
		t.Fatalf("no end named %q: %s / %s", want, mine[0], mine[1])
	}
	got, auto, err := chooseCRIUOptions(self, []proc.Pid{self}, CRIU{})
	if err != nil || !got.LinkRemap || !got.TCPEstablished || got.NetworkLock != "skip" || len(auto) != 3 {
		t.Errorf("chosen: %+v %+v %v, want link-remap, tcp-established, network-lock skip", got, auto, err)
	}
	got, auto, err = chooseCRIUOptions(self, []proc.Pid{self}, CRIU{TCPClose: true, NetworkLock: "iptables"})
	if err != nil || got.TCPEstablished || got.NetworkLock != "iptables" || len(auto) != 1 {
		t.Errorf("with --tcp-close --network-lock iptables: %+v %+v %v", got, auto, err)
	}
	got, auto, err = chooseCRIUOptions(self, []proc.Pid{self}, CRIU{Extra: []string{"network-lock nftables", "link-remap"}})
	if err != nil || got.LinkRemap || got.NetworkLock != "" || len(auto) != 1 || auto[0].Option != "--tcp-established" {
		t.Errorf("with --criu-opt network-lock, link-remap: %+v %+v %v", got, auto, err)
	}
}

// TestOwnedConns: only sockets of the tree, in its namespace, neither
// listening nor closed, nor in TIME_WAIT (no owner).
func TestOwnedConns(t *testing.T) {
	text := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 101 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 102 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:9C41 0100007F:1F90 06 00000000:00000000 03:00000000 00000000     0        0 0 3 0000000000000000
   4: 0100007F:9C42 0200000A:1F90 01 00000000:00000000 00:00000000 00000000     0        0 103 1 0000000000000000 20 4 30 10 -1
   5: 00000000:0000 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 104 1 0000000000000000 20 4 30 10 -1
`
	owner := map[uint64]proc.Pid{100: 1, 101: 1, 102: 2, 103: 2, 104: 2, 0: 1}
	got, listeners, queued := ownedConns(strings.NewReader(text), 2, owner, func(proc.Pid) bool { return true })
	if len(got) != 3 {
		t.Fatalf("%d connections, want 3: %+v", len(got), got)
	}
	if len(queued) != 0 { // the TIME_WAIT one (inode 0) is no queued end
		t.Errorf("queued %+v", queued)
	}
	// the tree's listener on 127.0.0.1:8080 takes a connection to it: one
	// in flight (its other end still in the listener's queue) is the tree's
	if len(listeners) != 1 || !listensFor(listeners[0], got[1].conn) || listensFor(listeners[0], got[0].conn) ||
		listensFor(listeners[0], got[2].conn) {
		t.Errorf("listeners %+v for %+v", listeners, got)
	}
	anyAddr := listeners[0]
	anyAddr.local = [16]byte{}
	if !listensFor(anyAddr, got[1].conn) || listensFor(anyAddr, got[0].conn) {
		t.Errorf("a listener on every address: %+v", anyAddr)
	}
	if !isPeer(got[0].conn, got[1].conn) || isPeer(got[0].conn, got[2].conn) {
		t.Errorf("peers: %+v", got)
	}
	if s := got[2].String(); s != "pid 2: 127.0.0.1:40002 -> 10.0.0.2:8080" {
		t.Errorf("named %q", s)
	}
}

// TestDumpRecordNetworkLock: the restore repeats the dump's network lock,
// unless told one itself.
func TestDumpRecordNetworkLock(t *testing.T) {
	rec := dumpRecordOf(CRIU{TCPEstablished: true, NetworkLock: "skip", LinkRemap: true})
	var c CRIU
	applied := rec.applyTo(&c)
	if c.NetworkLock != "skip" || !c.TCPEstablished || strings.Join(applied, " ") != "--tcp-established --network-lock skip" {
		t.Errorf("applied %q: %+v", applied, c)
	}
	c = CRIU{Extra: []string{"network-lock iptables"}}
	rec.applyTo(&c)
	if c.NetworkLock != "" {
		t.Errorf("the restore's own --criu-opt network-lock overridden: %+v", c)
	}
	if err := (CRIU{Binary: "criu", NetworkLock: "bogus"}).check(); err == nil {
		t.Error("--network-lock bogus accepted")
	}
}

// TestQueuedEnd: a connection to the tree's own listener that the tree has
// not accepted yet has its other end in the listener's queue (inode 0,
// established): ownedConns hands that end back apart, and it is the peer.
func TestQueuedEnd(t *testing.T) {
	text := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0000000000000000 100 0 0 10 0
   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 105 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 20 4 30 10 -1
`
	owner := map[uint64]proc.Pid{100: 1, 105: 1}
	conns, listeners, queued := ownedConns(strings.NewReader(text), 2, owner, func(proc.Pid) bool { return true })
	if len(conns) != 1 || len(listeners) != 1 || len(queued) != 1 {
		t.Fatalf("conns %+v listeners %+v queued %+v", conns, listeners, queued)
	}
	if !isPeer(conns[0].conn, queued[0]) || !listensFor(listeners[0], conns[0].conn) {
		t.Errorf("the queued end is not the connection's peer at the tree's listener: %+v %+v %+v", conns, listeners, queued)
	}
	c := conns[0]
	c.pending = true
	if s := c.String(); !strings.Contains(s, "not accepted yet") {
		t.Errorf("named %q", s)
	}
}

// TestChooseGhostLimit: files without a name left that are larger than
// CRIU's own limit raise it to the largest, rounded up to a MiB, and are
// named; one over what gpucr copies unasked refuses the checkpoint, naming
// it and the option; a limit the user named is left alone.
func TestChooseGhostLimit(t *testing.T) {
	nccl := ghostFile{unlinkedFile{pid: 7, comm: "python3", path: "/dev/shm/nccl-AbCdEf"}, 34213888}
	small := ghostFile{unlinkedFile{pid: 7, comm: "python3", path: "/tmp/small"}, 4096}
	var c CRIU
	a, err := chooseGhostLimit(7, []ghostFile{small, nccl}, &c)
	if err != nil || a == nil || a.Option != "--ghost-limit 33M" || c.GhostLimit != 33<<20 ||
		!strings.Contains(a.Why, "/dev/shm/nccl-AbCdEf, 32.6 MiB") || strings.Contains(a.Why, "/tmp/small") {
		t.Errorf("NCCL's buffer: %+v, limit %d, %v", a, c.GhostLimit, err)
	}
	c = CRIU{}
	if a, err := chooseGhostLimit(7, []ghostFile{small}, &c); a != nil || err != nil || c.GhostLimit != 0 {
		t.Errorf("a file within CRIU's limit: %+v, limit %d, %v", a, c.GhostLimit, err)
	}
	huge := ghostFile{unlinkedFile{pid: 8, comm: "train", path: "/scratch/big"}, 3 << 30}
	c = CRIU{}
	_, err = chooseGhostLimit(8, []ghostFile{nccl, huge}, &c)
	if err == nil || !strings.Contains(err.Error(), "before anything was stopped") || !strings.Contains(err.Error(), "/scratch/big, 3072.0 MiB") ||
		!strings.Contains(err.Error(), "--criu-opt 'ghost-limit 3072M'") {
		t.Errorf("a file of 3 GiB: %v", err)
	}
	for _, user := range []CRIU{{GhostLimit: 1 << 20}, {Extra: []string{"ghost-limit 2M"}}} {
		c := user
		if a, err := chooseGhostLimit(8, []ghostFile{nccl, huge}, &c); a != nil || err != nil || c.GhostLimit != user.GhostLimit {
			t.Errorf("the user's limit %+v: %+v, %v", user, a, err)
		}
	}
	if err := (CRIU{Binary: "criu", GhostLimit: 1 << 20, Extra: []string{"ghost-limit 2M"}}).check(); err == nil {
		t.Errorf("a ghost limit named twice is not refused")
	}
}
