package daemon

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// Status requests that come together share builds: forty at once, while a
// client takes its time to answer, cost a few builds, not forty; and every
// reply is built after its request came.
func TestStatusShared(t *testing.T) {
	_, sock := startServer(t, newFake())
	c := dial(t, sock)
	tok := c.register()
	ctl := startControl(t, sock, tok)
	ctl.mu.Lock()
	ctl.delay = 50 * time.Millisecond
	ctl.mu.Unlock()
	status(t, sock) // one build: the client answers, slowly
	ctl.mu.Lock()
	before := len(ctl.asked)
	ctl.mu.Unlock()

	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); status(t, sock) }()
	}
	wg.Wait()
	ctl.mu.Lock()
	asked := len(ctl.asked) - before
	ctl.mu.Unlock()
	// Each build asks the client twice (GetStats, Snapshot).
	if builds := asked / 2; builds < 1 || builds > 8 {
		t.Errorf("40 Status requests at once made %d builds", builds)
	}

	// A request made after a change sees it.
	ctl.mu.Lock()
	ctl.reasons = []string{"something changed"}
	ctl.mu.Unlock()
	st := status(t, sock)
	if len(st.Clients) != 1 || !slices.Contains(st.Clients[0].NotCheckpointable, "something changed") {
		t.Errorf("status after a change: %+v", st.Clients)
	}
}

// A client whose control connection does not answer Status is shown as not
// answering, and not asked again for a while: the next Status does not wait
// for it.
func TestStatusQuietClient(t *testing.T) {
	_, sock := startServer(t, newFake())
	c := dial(t, sock)
	tok := c.register()
	ctl := startControl(t, sock, tok)
	ctl.mu.Lock()
	ctl.delay = 2 * time.Second // longer than the StatusTimeout of 300 ms
	ctl.mu.Unlock()
	for i := 0; i < 2; i++ {
		start := time.Now()
		st := status(t, sock)
		took := time.Since(start)
		if len(st.Clients) != 1 || st.Clients[0].Checkpointable ||
			!strings.Contains(strings.Join(st.Clients[0].NotCheckpointable, "; "), "does not answer") {
			t.Fatalf("status %d of a silent client: %+v", i, st.Clients)
		}
		// The first waits the StatusTimeout (300 ms) for it; the second
		// must not wait for it at all.
		if i == 1 && took >= 300*time.Millisecond {
			t.Errorf("the second status waited %v for a client that did not answer the first", took)
		}
	}
}

// The reasons a client gives for not being checkpointable are its own
// words, as many and as long as it likes: 20 clients giving 1 MiB each made
// the Status reply too long to send, and every caller got EOF. The reply
// stays well within a frame, and shows each client's reasons cut short.
func TestStatusWithinFrame(t *testing.T) {
	_, sock := startServer(t, newFake())
	for i := 0; i < 20; i++ {
		c := dial(t, sock)
		ctl := startControl(t, sock, c.register())
		ctl.mu.Lock()
		ctl.reasons = []string{strings.Repeat("r", 1<<20), "second\x1b[2J\nline"}
		ctl.mu.Unlock()
	}
	st := status(t, sock)
	if len(st.Clients) != 20 {
		t.Fatalf("status lists %d clients, want 20", len(st.Clients))
	}
	if n := proto.Size(st); n > 1<<20 {
		t.Errorf("the Status reply is %d bytes", n)
	}
	for _, c := range st.Clients {
		for _, r := range c.NotCheckpointable {
			if strings.ContainsAny(r, "\x1b\n") {
				t.Errorf("a reason with control characters: %q", r)
			}
		}
	}
}

// Each caller's reply is made of the shared build, within the budget: the
// caller's own clients first, then the others by pid, and how many were
// left out; a request for some pids gets only those. The shared build is
// not changed.
func TestStatusForCaller(t *testing.T) {
	s := New(Config{Devices: []Device{newFake()}})
	var clients []*helperpb.ClientInfo
	for pid := int64(1); pid <= 40; pid++ {
		uid := uint32(2000)
		if pid%10 == 0 {
			uid = 1000
		}
		clients = append(clients, &helperpb.ClientInfo{Pid: pid, Uid: uid, Program: strings.Repeat("p", 1000)})
	}
	b := &statusBuild{reply: &helperpb.StatusReply{HelperVersion: "test", Clients: clients}}
	for _, ci := range clients {
		b.sizes = append(b.sizes, fieldSize(proto.Size(ci)))
	}
	s.statusBudget = 10 * 1010 // room for about 9 clients
	r := b.replyFor(1000, &helperpb.Status{}, s.statusBudget)
	if n := len(r.Clients); n < 5 || n > 10 || r.ClientsLeftOut != uint32(40-n) {
		t.Fatalf("%d clients listed, %d left out, in a budget for about 9", n, r.ClientsLeftOut)
	}
	for i, want := range []int64{10, 20, 30, 40, 1} {
		if r.Clients[i].Pid != want {
			t.Errorf("client %d is pid %d, want %d (the caller's own first, then by pid)", i, r.Clients[i].Pid, want)
		}
	}
	if n := proto.Size(r); n > s.statusBudget {
		t.Errorf("the reply is %d bytes, over its budget of %d", n, s.statusBudget)
	}
	r = b.replyFor(0, &helperpb.Status{Pids: []int64{33, 7, 99}}, s.statusBudget)
	if len(r.Clients) != 2 || r.Clients[0].Pid != 7 || r.Clients[1].Pid != 33 || r.ClientsLeftOut != 0 {
		t.Errorf("pids 33, 7, 99: %v, %d left out", r.Clients, r.ClientsLeftOut)
	}
	if len(b.reply.Clients) != 40 || b.reply.ClientsLeftOut != 0 {
		t.Errorf("the shared build changed: %d clients, %d left out", len(b.reply.Clients), b.reply.ClientsLeftOut)
	}
}

// The encoded reply is the reply replyFor makes, in a Response of the
// request's id; one caller's is encoded once a build.
func TestStatusResponseEncoded(t *testing.T) {
	s := New(Config{Devices: []Device{newFake()}})
	b := &statusBuild{reply: &helperpb.StatusReply{HelperVersion: "test", Clients: []*helperpb.ClientInfo{
		{Pid: 1, Uid: 5, Program: "a"}, {Pid: 2, Uid: 6, Program: "b"}}}}
	for _, ci := range b.reply.Clients {
		b.sizes = append(b.sizes, fieldSize(proto.Size(ci)))
	}
	for _, req := range []*helperpb.Status{{}, {Pids: []int64{2}}} {
		for _, id := range []uint64{0, 7, 1 << 40} {
			body, err := b.response(id, 6, req, s.statusBudget)
			if err != nil {
				t.Fatal(err)
			}
			var got helperpb.Response
			if err := proto.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			want := &helperpb.Response{Id: id, Body: &helperpb.Response_Status{Status: b.replyFor(6, req, s.statusBudget)}}
			if !proto.Equal(&got, want) {
				t.Errorf("id %d, %v: %v, want %v", id, req, &got, want)
			}
		}
	}
	if len(b.encoded) != 1 || b.encoded[6] == nil {
		t.Errorf("encoded once for uid 6: %v", b.encoded)
	}
}
