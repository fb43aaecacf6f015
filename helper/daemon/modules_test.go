package daemon

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/protocol/helperpb"
	"github.com/gpucr/gpucr/ptx"
)

// sealedMemfd is a memfd holding b with seals (0: none), as the
// interposer passes a module image.
func sealedMemfd(t testing.TB, b []byte, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("gpucr-module", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, b); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

func analyzeModuleReq(size uint64) *helperpb.Request {
	return &helperpb.Request{Body: &helperpb.Request_AnalyzeModule{AnalyzeModule: &helperpb.AnalyzeModule{Size: size}}}
}

// An AnalyzeModule's image is a sealed memfd: it is analysed; an image
// named by its address only (which the helper would read in the process's
// memory, as root), a memfd that could still change, another kind of file,
// or one of another size than the request says is refused, and the
// connection goes on.
func TestAnalyzeModuleTakesSealedMemfd(t *testing.T) {
	_, sock := startServer(t, newFake())
	c := dial(t, sock)
	c.register()
	image := []byte(ptx.Kernels)
	good := sealedMemfd(t, image, imageSeals)
	defer unix.Close(good)
	r, _, err := c.call(analyzeModuleReq(uint64(len(image))), good)
	if err != nil || r.GetModuleKernels() == nil || len(r.GetModuleKernels().Kernels) == 0 {
		t.Fatalf("a sealed memfd of PTX: %v, %v", r, err)
	}
	refused := func(what string, req *helperpb.Request, want string, fds ...int) {
		t.Helper()
		r, _, err := c.call(req, fds...)
		if err != nil || r.Error == nil || !strings.Contains(r.Error.Message, want) {
			t.Errorf("%s: %v, %v; want a refusal saying %q", what, r, err, want)
		}
	}
	addr := &helperpb.Request{Body: &helperpb.Request_AnalyzeModule{AnalyzeModule: &helperpb.AnalyzeModule{
		Address: 0x1000, Size: uint64(len(image))}}} // the deprecated field alone
	refused("an address and no memfd", addr, "sealed memfd")
	open := sealedMemfd(t, image, 0)
	defer unix.Close(open)
	refused("an unsealed memfd", analyzeModuleReq(uint64(len(image))), "seals", open)
	noSeal := sealedMemfd(t, image, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	defer unix.Close(noSeal)
	refused("a memfd whose seals may still change", analyzeModuleReq(uint64(len(image))), "seals", noSeal)
	tmp, err := os.CreateTemp(t.TempDir(), "image")
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	if _, err := tmp.Write(image); err != nil {
		t.Fatal(err)
	}
	refused("a regular file", analyzeModuleReq(uint64(len(image))), "not a sealed memfd", int(tmp.Fd()))
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	refused("a pipe", analyzeModuleReq(uint64(len(image))), "not a sealed memfd", p[0])
	refused("another size", analyzeModuleReq(uint64(len(image))+1), "memfd holds", good)
	empty := sealedMemfd(t, nil, imageSeals)
	defer unix.Close(empty)
	refused("an empty memfd", analyzeModuleReq(0), "not analysed", empty)
	// still served
	if r, _, err := c.call(analyzeModuleReq(uint64(len(image))), good); err != nil || r.GetModuleKernels() == nil {
		t.Fatalf("after the refusals: %v, %v", r, err)
	}
}

// Past its share of the analysis budget, a uid's analysis is refused at
// once, naming the limit.
func TestAnalyzeModuleBudgetPerUID(t *testing.T) {
	s, sock := startServerLimits(t, Limits{AnalysisBytesPerUID: 1 << 20, AnalysisBytes: 4 << 20, limitRoot: true}, newFake())
	c := dial(t, sock)
	c.register()
	big := sealedMemfd(t, make([]byte, 2<<20), imageSeals)
	defer unix.Close(big)
	r, _, err := c.call(analyzeModuleReq(2<<20), big)
	if err != nil || r.Error.GetCode() != helperpb.ErrorCode_ERROR_UNAVAILABLE ||
		!strings.Contains(r.Error.GetMessage(), "--module-analysis-memory-per-uid") {
		t.Fatalf("2 MiB past a share of 1 MiB: %v, %v", r, err)
	}
	// while a share is held, another analysis of the uid is refused at once
	a, err := s.analyses.begin(uint32(os.Getuid()), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	small := sealedMemfd(t, []byte(ptx.Kernels), imageSeals)
	defer unix.Close(small)
	if r, _, err := c.call(analyzeModuleReq(uint64(len(ptx.Kernels))), small); err != nil || r.Error.GetCode() != helperpb.ErrorCode_ERROR_UNAVAILABLE {
		t.Errorf("with the uid's share taken: %v, %v", r, err)
	}
	a.end()
	if r, _, err := c.call(analyzeModuleReq(uint64(len(ptx.Kernels))), small); err != nil || r.GetModuleKernels() == nil {
		t.Errorf("once it is given back: %v, %v", r, err)
	}
}
