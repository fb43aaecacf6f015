package served

import (
	"slices"
	"testing"
)

// TestWorkerEnvKeepsTheDriversOnly: a worker gets what finds and sets up the
// driver, not the rest of the helper's environment.
func TestWorkerEnvKeepsTheDriversOnly(t *testing.T) {
	got := WorkerEnv([]string{"PATH=/bin", "LD_LIBRARY_PATH=/sim", "CUDA_VISIBLE_DEVICES=1", "GPUCR_LIBCUDA=/x.so",
		"NCCL_NVLS_ENABLE=0", "AWS_SECRET_ACCESS_KEY=k", "HOME=/root", "LD_PRELOAD=/evil.so", "NVIDIA_DRIVER_CAPABILITIES=all"})
	want := []string{"PATH=/bin", "LD_LIBRARY_PATH=/sim", "CUDA_VISIBLE_DEVICES=1", "GPUCR_LIBCUDA=/x.so", "NCCL_NVLS_ENABLE=0",
		"NVIDIA_DRIVER_CAPABILITIES=all"}
	if !slices.Equal(got, want) {
		t.Errorf("WorkerEnv = %q, want %q", got, want)
	}
}
