package cuda

import (
	"path/filepath"
	"slices"
	"testing"
)

func TestProbeSimDriver(t *testing.T) {
	lib := simDriver(t)
	r, err := Probe(lib)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.EvalSymlinks(lib)
	got, _ := filepath.EvalSymlinks(r.Path)
	if got != want || r.Version != 13000 || len(r.MissingCheckpointAPI) != 0 {
		t.Fatalf("Probe(%s) = %+v, want path %s, version 13000, the whole checkpoint API", lib, r, want)
	}
}

// A library without the driver API: no version, every entry point missing.
func TestProbeNotADriver(t *testing.T) {
	r, err := Probe("libm.so.6")
	if err != nil {
		t.Fatal(err)
	}
	if r.Version != 0 || r.Path != "" || !slices.Equal(r.MissingCheckpointAPI, CheckpointAPI) {
		t.Fatalf("Probe(libm.so.6) = %+v", r)
	}
	if _, err := Probe(filepath.Join(t.TempDir(), "libcuda.so.1")); err == nil {
		t.Fatal("Probe of a missing library succeeded")
	}
}
