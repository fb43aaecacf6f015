// Package image will hold gpucr's GPU image inside a CRIU image directory:
// manifest, chunked buffers with CRC32C, content-addressed dedup, parent
// images and atomic commit (issue 3). Empty in the walking skeleton.
package image
