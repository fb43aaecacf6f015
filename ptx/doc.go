// Package ptx will parse fatbins and PTX: per-kernel parameter analysis for
// write-set speculation and gpucr's own hashing kernels. Empty in the walking
// skeleton.
package ptx
