// Package ptx is reserved for gpucr's own GPU code: kernels such as
// GPU-side hashing of device memory (so that a checkpoint need not copy what
// has not changed) and the PTX and fatbin handling they need. Nothing is
// written yet and nothing imports it. The interposer's per-kernel parameter
// layouts come from the driver (cuFuncGetParamInfo, cuKernelGetParamInfo),
// not from parsing PTX.
package ptx
