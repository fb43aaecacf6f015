package main

import "github.com/gpucr/gpucr/image/mountinfo"

// filesystemOf describes the filesystem dir lives on, as "TYPE (SOURCE on
// MOUNTPOINT)". Throughput means little without it: tmpfs measures memory
// bandwidth, a disk measures the disk.
func filesystemOf(dir string) string {
	m, err := mountinfo.Of(dir)
	if err != nil {
		return "unknown"
	}
	return m.String()
}
