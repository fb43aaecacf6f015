package inventory

import (
	"errors"
	"strings"
	"testing"
)

// Without libnvidia-ml.so.1 (this machine, CI) NVML must fail cleanly and the
// report must say so.
func TestCollectWithoutDriverOrNVML(t *testing.T) {
	inv := Collect(nil, errors.New("dlopen libcuda.so.1: not found"))
	if _, err := queryNVML(); err == nil {
		t.Skip("NVML present on this host")
	}
	if inv.Source != "none" || len(inv.Devices) != 0 {
		t.Fatalf("inventory %+v", inv)
	}
	notes := strings.Join(inv.Notes, "; ")
	if !strings.Contains(notes, "driver: dlopen") || !strings.Contains(notes, "NVML") {
		t.Fatalf("notes %q", notes)
	}
}
