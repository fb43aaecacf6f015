package image

// CheckRestorable checks what a restore into processes needs beyond a
// readable image: every buffer belongs to a process the image lists, with a
// positive pid, and is mapped somewhere (address not 0) and holds something.
// The writer of a process image never breaks these; a manifest that does was
// written by hand, or re-sealed. (Images written before the process list
// existed list no process, and are not held to that part.)
//
// What no check of the image alone can see is whether it matches the
// restored process's own record of its memory (a buffer moved, shrunk or
// dropped by whoever could rewrite the image): the helper checks that when
// the process comes back, before it may run.
func (im *Image) CheckRestorable() error {
	procs := map[int]bool{}
	for _, p := range im.m.GetProcesses() {
		procs[int(p.GetPid())] = true
	}
	for i, b := range im.Buffers() {
		switch {
		case b.Pid <= 0:
			return corruptf("buffer %d (0x%x): pid %d", i, b.Address, b.Pid)
		case len(procs) > 0 && !procs[b.Pid]:
			return corruptf("buffer %d (0x%x) belongs to pid %d, which is not a process of the image", i, b.Address, b.Pid)
		case b.Address == 0 || b.Size == 0:
			return corruptf("buffer %d: address 0x%x, size %d (a buffer is mapped somewhere and holds something)", i, b.Address, b.Size)
		}
	}
	return nil
}
