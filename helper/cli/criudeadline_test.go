package cli

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	criu "github.com/checkpoint-restore/go-criu/v7"
)

// fakeCRIU writes an executable script standing in for criu.
func fakeCRIU(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// A CRIU that never answers is killed at the deadline, and reaped.
func TestRunCRIUDeadline(t *testing.T) {
	hang := fakeCRIU(t, "exec sleep 60")
	out := runCRIU(hang, 300*time.Millisecond, false, func(cr *criu.Criu) error {
		_, err := cr.GetCriuVersion()
		return err
	})
	if !out.timedOut || out.swrk <= 0 || out.hung || out.err == nil {
		t.Fatalf("outcome %+v: want a timeout that killed swrk and returned", out)
	}
	if st := procStateLetter(out.swrk); st != "" {
		t.Errorf("criu swrk (pid %d) not killed and reaped: state %s", out.swrk, st)
	}
}

// A CRIU that exits at once is a failure, not a timeout.
func TestRunCRIUExits(t *testing.T) {
	out := runCRIU(fakeCRIU(t, "exit 3"), time.Minute, false, func(cr *criu.Criu) error {
		_, err := cr.GetCriuVersion()
		return err
	})
	if out.timedOut || out.err == nil {
		t.Fatalf("outcome %+v: want a failure", out)
	}
}
