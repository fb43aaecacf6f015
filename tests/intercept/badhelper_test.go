package intercept_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// TestHelloWrongID: a helper that answers the interposer's Hello under another
// request id is no helper to use. The application runs on without checkpoint
// support, computing what it computes without the interposer, with one
// warning (the interposer once freed that reply twice and crashed).
func TestHelloWrongID(t *testing.T) {
	lib := need(t, "build/lib/libgpucr.so")
	sim := need(t, "build/sim/libcuda.so.1")
	bin := need(t, "build/bin/heartbeat")
	sock := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				w, err := wire.New(c)
				if err != nil {
					c.Close()
					return
				}
				defer w.Close()
				for {
					req, fds, err := w.ReadRequest()
					if err != nil {
						return
					}
					wire.CloseFDs(fds)
					if w.Write(&helperpb.Response{Id: req.Id + 41, Body: &helperpb.Response_Hello{
						Hello: &helperpb.HelloReply{ProtocolVersion: uint32(helperpb.Version_PROTOCOL_VERSION), ClientToken: 7},
					}}, nil) != nil {
						return
					}
				}
			}()
		}
	}()

	run := func(preload bool) (string, string, error) {
		cmd := exec.Command(bin, "--mib", "4", "--iters", "5")
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Dir(sim), "GPUCR_LIBCUDA="+sim, "GPUCR_SOCKET="+sock)
		if preload {
			cmd.Env = append(cmd.Env, "LD_PRELOAD="+lib)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return doneRE.FindString(string(out)), stderr.String(), err
	}
	want, _, err := run(false)
	if err != nil || want == "" {
		t.Fatalf("without the interposer: %v (%q)", err, want)
	}
	got, stderr, err := run(true)
	if err != nil {
		t.Fatalf("with the interposer: %v\n%s", err, stderr)
	}
	if got != want {
		t.Errorf("%q with the interposer, %q without", got, want)
	}
	if n := strings.Count(stderr, "gpucr: "); n != 1 || !strings.Contains(stderr, "hello failed") {
		t.Errorf("want one warning, that the hello failed:\n%s", stderr)
	}
}
