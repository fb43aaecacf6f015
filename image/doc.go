// Package image is gpucr's GPU image: the device memory of the checkpointed
// processes, stored inside the CRIU image directory DIR where CRIU and crit
// never look (docs/image-api.md is the contract):
//
//	DIR/gpucr/manifest.pb     committed manifest (protocol/imagepb.ManifestFile)
//	DIR/gpucr/chunks/HH/HASH  chunk files; HASH = hex xxh3-128 of the raw bytes
//	DIR/gpucr/.tmp-*          unfinished writes, never read
//	DIR/gpucr/.lock           flock held by a Writer or GC working on DIR
//
// Directories are made 0700 and files 0600 (Options.Owner: given to the user
// the image is written for). Everything beneath DIR is opened beneath an open
// directory, following no symlink and waiting on no FIFO, and checked to be
// what it should be before any I/O (safeopen.go).
//
// Each buffer is split into chunks (4 MiB by default). A chunk is stored once
// per image and never again in a descendant image (it refers to the ancestor's
// file instead); an all-zero chunk is only a flag in the manifest. Every chunk
// read is checked against the xxh3-128 of its raw bytes (its name: storage
// damage, a file put under the wrong name, a bad decompression); a compressed
// chunk also has a CRC32C of its stored bytes, checked before they reach the
// decoder. The manifest carries its own CRC32C.
//
// Commit order makes a crash harmless: chunk files are written under
// temporary names and renamed into chunks/, the file system is synced, then
// the manifest is written under a temporary name, synced, and renamed to
// manifest.pb last. Until that rename DIR shows the previous image (or none,
// which readers report as ErrIncomplete).
package image
