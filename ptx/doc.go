// Package ptx is gpucr's own GPU code: kernels written as PTX text
// (kernels.ptx, embedded here as Kernels) that the helper loads with
// cuModuleLoadData into its own context on each device, so that gpucr needs
// neither nvcc nor anything of the application's. The simulated driver runs
// the same entries as C functions (tests/sim/kernels/gpucr.c).
//
// ChunkHash defines the chunk hash the kernel gpucr_chunk_hash computes on
// the GPU: a checkpoint hashes device memory where it lies and copies only
// chunks it does not have yet, and a restore checks every loaded chunk
// there.
//
// Analyze reads the application's PTX far enough to say, per kernel, which
// parameters the kernel may write global memory through (what a
// checkpoint taken while kernels run must treat as changing), and where it
// cannot decide; ParseFatbin finds the PTX in a fat binary. A fat binary
// with SASS only (cuBLAS ships most kernels that way) cannot be analysed:
// SASS's encoding is not public. The interposer's per-kernel parameter
// layouts come from the driver (cuFuncGetParamInfo, cuKernelGetParamInfo),
// not from parsing PTX. README.md has the rules and the limits.
package ptx

import _ "embed"

// Kernels is the PTX text of gpucr's kernels.
//
//go:embed kernels.ptx
var Kernels string

// Entry names in Kernels.
const (
	ChunkHashKernel = "gpucr_chunk_hash"
	CompareKernel   = "gpucr_compare"
)
