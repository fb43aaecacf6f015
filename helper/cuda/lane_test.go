package cuda

import (
	"os"
	"strings"
	"testing"
	"time"
)

// streamThreads counts the simulated driver's stream worker threads in this
// process: one per stream that exists.
func streamThreads(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, _ := os.ReadFile("/proc/self/task/" + e.Name() + "/comm")
		if strings.TrimSpace(string(b)) == "sim-stream" {
			n++
		}
	}
	return n
}

// A closed lane gives its stream (and staging buffer) back: closing used to
// clear the thread's context first, so the driver refused both and every
// lane closed after a failed copy leaked them.
func TestLaneCloseFreesItsStream(t *testing.T) {
	d := loadSim(t)
	before := streamThreads(t)
	for range 50 {
		l, err := d.Devices[0].NewLane(64 << 10)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	// A destroyed stream's worker thread ends right after: wait for it.
	after := streamThreads(t)
	for deadline := time.Now().Add(2 * time.Second); after > before && time.Now().Before(deadline); after = streamThreads(t) {
		time.Sleep(10 * time.Millisecond)
	}
	if after > before {
		t.Fatalf("%d streams before 50 lanes were started and closed, %d after", before, after)
	}
}
