package image

import (
	"errors"
	"os"
	"testing"
)

// The image directory's lock is held by one open of it at a time, and
// the refusal names the holder.
func TestLockImageNamesHolder(t *testing.T) {
	dir := t.TempDir()
	a, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := LockImage(a, dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = LockImage(b, dir)
	var iu *InUseError
	if !errors.As(err, &iu) || !errors.Is(err, ErrBusy) || iu.Pid != os.Getpid() {
		t.Fatalf("second lock: %v, want an InUseError naming pid %d", err, os.Getpid())
	}
	want := "the image in " + dir + " is being restored by another gpucr restore (pid "
	if got := err.Error(); len(got) < len(want) || got[:len(want)] != want {
		t.Errorf("message %q", got)
	}
	a.Close() // released with the descriptor
	if err := LockImage(b, dir); err != nil {
		t.Fatalf("lock after the holder closed: %v", err)
	}
}
