package daemon

// Module analysis for copy-on-write windows: a process that loads a module
// image with PTX (cuModuleLoadData of PTX text, a fat binary with PTX
// entries) asks which parameters each kernel may write through
// (ptx.WriteSets), so that its interposer saves, before a launch in a
// window, only the buffers the kernel may write, not every buffer a
// parameter points into. The image comes as a sealed memfd the interposer
// wrote it into: the helper reads that file, never the process's memory
// (which it could read as root where the process's own user could not: a
// set-user-ID program the client exec'd), and the seals keep its bytes and
// size from changing while they are read. What analyses hold at once is
// bounded (analysisBudget).

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

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

// serve serves an AnalyzeModule of client cl within the budget; the
// image's memfd came with it on c.
func (b *analysisBudget) serve(c *conn, cl *client, id uint64, req *helperpb.AnalyzeModule) *helperpb.Response {
	f := c.takeFD()
	if f == nil {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST,
			"AnalyzeModule without the module image as a sealed memfd: the helper reads no process's memory (an interposer older than the helper?)")
	}
	defer f.Close()
	size, err := sealedImageSize(f)
	if err == nil && req.Size != size {
		err = fmt.Errorf("the request says %d bytes, its memfd holds %d", req.Size, size)
	}
	if err != nil {
		cl.log.Info("module image refused", zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "module image: %v", err)
	}
	cl.mu.Lock()
	uid := cl.uid
	cl.mu.Unlock()
	a, err := b.begin(uid, size)
	if err != nil {
		cl.log.Info("module analysis refused", zap.Uint64("bytes", size), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "module image of %s not analysed: %v", units.Bytes(size), err)
	}
	defer a.end()
	image := make([]byte, size)
	if _, err := f.ReadAt(image, 0); err != nil {
		return errResp(id, helperpb.ErrorCode_ERROR_BAD_REQUEST, "module image: reading its memfd: %v", err)
	}
	sets, err := ptx.WriteSetsWithin(image, a.more)
	if errors.Is(err, ptx.ErrNoRoom) {
		cl.log.Info("module analysis refused", zap.Uint64("bytes", size), zap.Error(err))
		return errResp(id, helperpb.ErrorCode_ERROR_UNAVAILABLE, "module image of %s not analysed: %v (%v)",
			units.Bytes(size), a.noRoom(), err)
	}
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
	cl.log.Debug("module image analysed", zap.Uint64("bytes", size), zap.Int("kernels", len(sets)),
		zap.Int("decided", decided))
	return &helperpb.Response{Id: id, Body: &helperpb.Response_ModuleKernels{ModuleKernels: out}}
}

// ---- the memory analyses may hold ----

// maxModuleText bounds what one analysis may decompress where no budget
// does (root's): four images' worth.
const maxModuleText = 4 * maxModuleImage

// analysisWait is how long an analysis waits for room in the helper's
// total budget (the uid's own share is never waited for): the module's
// load waits for the answer.
const analysisWait = time.Second

// trimAfter: an analysis of this many bytes or more has the helper give
// its free memory back to the system afterwards.
const trimAfter = 16 << 20

// analysisBudget bounds the bytes being analysed at once: the module
// images read and the PTX their compressed entries hold. A small request
// (an address and a size) would otherwise make the helper hold 64 MiB, any
// number of times at once (24 clients took it from 98 MiB to 2.9 GiB).
type analysisBudget struct {
	b       *budget
	lim     *Limits
	trimmer *memTrimmer
}

func newAnalysisBudget(lim *Limits, done <-chan struct{}) *analysisBudget {
	return &analysisBudget{b: newBudget(lim.AnalysisBytes, lim.AnalysisBytesPerUID, done), lim: lim,
		trimmer: &memTrimmer{interval: time.Second}}
}

// analysis is the room one analysis holds.
type analysis struct {
	ab       *analysisBudget
	uid      uint32
	limited  bool
	bytes    uint64 // taken in all
	releases []func()
	refused  error // why more was refused, for the message
}

// begin takes size bytes for an analysis of uid's (root: not counted):
// past uid's share refused at once, past the total after a short wait.
func (ab *analysisBudget) begin(uid uint32, size uint64) (*analysis, error) {
	a := &analysis{ab: ab, uid: uid, limited: ab.lim.limited(uid)}
	if err := a.take(size, analysisWait); err != nil {
		return nil, err
	}
	return a, nil
}

// take takes n more bytes, waiting up to wait for the total.
func (a *analysis) take(n uint64, wait time.Duration) error {
	if !a.limited {
		if a.bytes+n > maxModuleText {
			return fmt.Errorf("%s to analyse at once, more than %s", units.Bytes(a.bytes+n), units.Bytes(maxModuleText))
		}
		a.bytes += n
		return nil
	}
	release, err := a.ab.b.take(a.uid, int64(n), wait)
	switch {
	case errors.Is(err, errOverUID):
		return fmt.Errorf("uid %d has as many bytes of module images being analysed as it may (%s, --module-analysis-memory-per-uid); "+
			"this module's kernels count as writing everything they point into", a.uid, sizeStr(uint64(a.ab.lim.AnalysisBytesPerUID)))
	case errors.Is(err, errOverTotal):
		return fmt.Errorf("the helper's memory for module analyses (%s, --module-analysis-memory) stayed taken; "+
			"this module's kernels count as writing everything they point into", sizeStr(uint64(a.ab.lim.AnalysisBytes)))
	case err != nil:
		return err
	}
	a.bytes += n
	a.releases = append(a.releases, release)
	return nil
}

// more is asked before compressed PTX is decompressed (ptx.WriteSetsWithin):
// never waits.
func (a *analysis) more(n uint64) bool {
	if err := a.take(n, 0); err != nil {
		a.refused = err
		return false
	}
	return true
}

// noRoom says why more was refused.
func (a *analysis) noRoom() error {
	if a.refused == nil {
		return errors.New("no room")
	}
	return a.refused
}

// end gives the room back; after a large analysis the helper gives its free
// memory back to the system too.
func (a *analysis) end() {
	for _, r := range a.releases {
		r()
	}
	if a.bytes >= trimAfter {
		a.ab.trimmer.request()
	}
}

// imageSeals are the seals a module image's memfd must have: neither its
// bytes, nor its size, nor its seals can change any more.
const imageSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// sealedImageSize checks that f is a module image as AnalyzeModule takes
// it, a memfd with imageSeals (only a memfd has seals to add: any other
// file is refused), a regular file of 1 to maxModuleImage bytes, and says
// its size. Nothing is read before: a FIFO or a socket is refused without
// a wait.
func sealedImageSize(f *os.File) (uint64, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var seals int
	var st unix.Stat_t
	var serr, ferr error
	if err := rc.Control(func(fd uintptr) {
		seals, serr = unix.FcntlInt(fd, unix.F_GET_SEALS, 0)
		ferr = unix.Fstat(int(fd), &st)
	}); err != nil {
		return 0, err
	}
	switch {
	case serr != nil:
		return 0, fmt.Errorf("not a sealed memfd (F_GET_SEALS: %w)", serr)
	case seals&imageSeals != imageSeals:
		return 0, fmt.Errorf("a memfd without the seals it needs (0x%x of 0x%x: write, shrink, grow, seal)", seals&imageSeals, imageSeals)
	case ferr != nil:
		return 0, fmt.Errorf("fstat: %w", ferr)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return 0, fmt.Errorf("not a regular file (mode 0%o)", st.Mode)
	case st.Size <= 0 || uint64(st.Size) > maxModuleImage:
		return 0, fmt.Errorf("%s: not analysed (at most %s)", units.Bytes(uint64(max(st.Size, 0))), units.Bytes(maxModuleImage))
	}
	return uint64(st.Size), nil
}
