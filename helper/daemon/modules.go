package daemon

// Module analysis for copy-on-write windows: a process that loads a module
// image with PTX (cuModuleLoadData of PTX text, a fat binary with PTX
// entries) asks which parameters each kernel may write through
// (ptx.WriteSets), so that its interposer saves, before a launch in a
// window, only the buffers the kernel may write, not every buffer a
// parameter points into. The image is read from the process's own memory
// (the request names it), where it is while the load call that asks runs.

import (
	"fmt"
	"slices"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/internal/units"
	"github.com/gpucr/gpucr/protocol/helperpb"
	"github.com/gpucr/gpucr/ptx"
)

// maxModuleImage bounds the image the helper reads for an analysis; a
// larger one is not analysed (its kernels count as writing everything they
// point into).
const maxModuleImage = 64 << 20

// maxModuleKernels bounds the kernels one answer names (the frame must stay
// well under wire.MaxFrame); the ones left out count as undecided.
const maxModuleKernels = 20000

// analyzeModule serves an AnalyzeModule of client cl.
func (s *Server) analyzeModule(cl *client, id uint64, req *helperpb.AnalyzeModule) *helperpb.Response {
	if req.Size == 0 || req.Size > maxModuleImage {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "module image of %s: not analysed (at most %s)",
			units.Bytes(req.Size), units.Bytes(maxModuleImage))
	}
	image, err := readProcessMemory(int(cl.pid), req.Address, int(req.Size))
	if err != nil {
		cl.log.Debug("module image not analysed", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "module image at 0x%x: %v", req.Address, err)
	}
	sets, err := ptx.WriteSets(image)
	if err != nil {
		cl.log.Debug("module image not analysed", zap.Error(err))
	}
	// Every kernel it read, decided or not: a restore loading on demand
	// holds an undecided kernel's launches for all memory, and one absent
	// (no PTX) only for what its parameters point into.
	names := make([]string, 0, len(sets))
	decided := 0
	for name, ws := range sets {
		names = append(names, name)
		if ws.Decided {
			decided++
		}
	}
	slices.Sort(names)
	out := &helperpb.ModuleKernels{}
	for _, name := range names[:min(len(names), maxModuleKernels)] {
		ws := sets[name]
		out.Kernels = append(out.Kernels, &helperpb.KernelWrites{Name: name, Written: ws.Written, Decided: ws.Decided,
			ReadsDecided: ws.ReadsDecided})
	}
	cl.log.Debug("module image analysed", zap.Uint64("bytes", req.Size), zap.Int("kernels", len(sets)),
		zap.Int("decided", decided))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_ModuleKernels{ModuleKernels: out}}
}

// readProcessMemory reads n bytes at addr of process pid.
func readProcessMemory(pid int, addr uint64, n int) ([]byte, error) {
	buf := make([]byte, n)
	for off := 0; off < n; {
		got, err := unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &buf[off], Len: uint64(n - off)}},
			[]unix.RemoteIovec{{Base: uintptr(addr) + uintptr(off), Len: n - off}}, 0)
		if err != nil {
			return nil, fmt.Errorf("read %d bytes of process %d's memory: %w", n, pid, err)
		}
		if got == 0 {
			return nil, fmt.Errorf("read %d bytes of process %d's memory: short read at %d", n, pid, off)
		}
		off += got
	}
	return buf, nil
}
