package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/gpucr/gpucr/helper/engine"
	"github.com/gpucr/gpucr/helper/internal/fakegpu"
	"github.com/gpucr/gpucr/image"
)

// bgServer is a Server with what the background copies use.
func bgServer(t *testing.T) *Server {
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	s := &Server{log: log, stopping: make(chan struct{}), pool: newPool(PoolConfig{}, log)}
	s.mem = &allocator{log: log, pool: s.pool, residents: &s.residents, snaps: &s.snaps, stopping: s.stopping}
	t.Cleanup(func() { close(s.stopping); s.wg.Wait() })
	return s
}

func bgImage(t *testing.T) (*image.Writer, string) {
	t.Helper()
	dir := t.TempDir()
	w, err := image.Create(dir, image.Origin{Host: "test", Pid: 4242, Time: time.Now()}, image.Options{ChunkSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return w, dir
}

// writeOne is a background copy's work: one buffer of 1 MiB into w.
func writeOne(w *image.Writer) error {
	bw, err := w.AddBuffer(image.BufferInfo{Pid: 4242, Address: 0x7f0000000000, Size: 1 << 20, Kind: image.AllocMemAlloc})
	if err != nil {
		return err
	}
	if err := bw.WriteChunk(0, make([]byte, 1<<20)); err != nil {
		return err
	}
	return bw.Close()
}

func committed(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, image.SubDir, "manifest.pb"))
	return err == nil
}

// A deferred commit of an image whose copy waits for its process (CRIU has
// ended, the process is not running yet) returns at once; the copy starts
// once the process runs, and the commit follows it, finishing the copy's
// transfer without error.
func TestBackgroundCommitFollowsTheResume(t *testing.T) {
	s := bgServer(t)
	w, dir := bgImage(t)
	cl := testClient(t, lifeDropped)
	tr := s.transfers.begin(w.Dir(), true, 1<<20, []int64{4242})
	tr.background = true
	b := s.bg.of(w)
	started := make(chan time.Time, 1)
	b.add(tr, func() error {
		cl.untilRunning(b.settling, s.stopping)
		started <- time.Now()
		return writeOne(w)
	})
	s.commitLater(w)
	time.Sleep(150 * time.Millisecond)
	if committed(dir) || tr.proto().Finished {
		t.Fatal("the image was committed before its process ran again")
	}
	resumed := time.Now()
	if err := cl.fire(evResumed); err != nil {
		t.Fatal(err)
	}
	if at := <-started; at.Before(resumed) {
		t.Fatal("the copy started before the process ran again")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !tr.proto().Finished {
		if time.Now().After(deadline) {
			t.Fatal("the copy's transfer never finished")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := tr.proto().Error; e != "" || !committed(dir) {
		t.Fatalf("after the copy: error %q, committed %v", e, committed(dir))
	}
	if s.bg.has(w) {
		t.Error("the image's background copies are still listed")
	}
}

// Dropping an image (a failed dump) does not wait for a process that will
// not run again soon: the copy waiting for it gives up, the image is gone,
// and the transfer tells why.
func TestBackgroundAbortDoesNotWait(t *testing.T) {
	s := bgServer(t)
	w, dir := bgImage(t)
	cl := testClient(t, lifeDetached)
	tr := s.transfers.begin(w.Dir(), true, 1<<20, []int64{4242})
	b := s.bg.of(w)
	b.add(tr, func() error {
		cl.untilRunning(b.settling, s.stopping)
		return writeOne(w)
	})
	t0 := time.Now()
	if err := s.bg.settle(w, true, s.salvage); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("dropping the image took %v", d)
	}
	p := tr.proto()
	if !p.Finished || !strings.Contains(p.Error, "dropped") || committed(dir) {
		t.Errorf("after the drop: %+v, committed %v", p, committed(dir))
	}
}

// A copy that fails (a full disk, say) drops the image at the commit, which
// returns its error; so does the transfer.
func TestBackgroundFailureDropsTheImage(t *testing.T) {
	s := bgServer(t)
	w, dir := bgImage(t)
	tr := s.transfers.begin(w.Dir(), true, 1<<20, []int64{4242})
	full := errors.New("the image directory is full")
	s.bg.of(w).add(tr, func() error { return full })
	if err := s.bg.settle(w, false, s.salvage); !errors.Is(err, full) {
		t.Fatalf("commit after a failed copy: %v", err)
	}
	if p := tr.proto(); !p.Finished || p.Error != full.Error() || committed(dir) {
		t.Errorf("after the failed copy: %+v, committed %v", p, committed(dir))
	}
}

// The copies of one image run one at a time, in the order queued: a later
// process's part is sealed after the earlier copies have ended.
func TestBackgroundCopiesRunInOrder(t *testing.T) {
	s := bgServer(t)
	w, _ := bgImage(t)
	b := s.bg.of(w)
	var order []int
	release := make(chan struct{})
	b.add(s.transfers.begin(w.Dir(), true, 0, nil), func() error { <-release; order = append(order, 1); return nil })
	b.add(s.transfers.begin(w.Dir(), true, 0, nil), func() error { order = append(order, 2); return nil })
	time.Sleep(50 * time.Millisecond)
	if len(order) != 0 {
		t.Fatalf("the second copy ran before the first ended: %v", order)
	}
	close(release)
	if err := b.wait(); err != nil {
		t.Fatal(err)
	}
	if len(order) != 2 || order[0] != 1 || order[1] != 2 {
		t.Errorf("order %v, want [1 2]", order)
	}
	_ = s.bg.settle(w, true, s.salvage)
}

// An allocation that finds the device full while a concurrent checkpoint's
// snapshot holds memory there waits for the snapshot to be freed, and then
// succeeds, instead of failing the application.
func TestAllocationWaitsForSnapshot(t *testing.T) {
	s := bgServer(t)
	dev := fakegpu.New(0, 64<<20)
	h, err := dev.Create(32<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := engine.TakeSnapshot([]engine.Region{{Device: dev.GPU(), Handle: h, Size: 32 << 20, Pid: 4242, Address: 0x7f0000000000}},
		engine.SnapshotOptions{})
	if err != nil || snap.Bytes != 32<<20 {
		t.Fatalf("snapshot: %v, %+v", err, snap)
	}
	unhold := s.snaps.hold(snap)
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = snap.Release()
		unhold()
	}()
	t0 := time.Now()
	h2, err := s.mem.create(dev, 16<<20, 0) // 32 MiB used, 32 MiB by the snapshot: full
	if err != nil {
		t.Fatalf("allocation while the snapshot was held: %v", err)
	}
	if time.Since(t0) < 50*time.Millisecond {
		t.Error("the allocation did not wait for the snapshot")
	}
	_ = dev.Release(h2)
	// With no snapshot held, a full device fails at once.
	big, err := dev.Create(32<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Release(big)
	t0 = time.Now()
	if _, err := s.mem.create(dev, 16<<20, 0); !isOOM(err) || time.Since(t0) > time.Second {
		t.Errorf("a full device without snapshots: %v after %v", err, time.Since(t0))
	}
	_ = dev.Release(h)
}
