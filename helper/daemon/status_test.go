package daemon

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
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
