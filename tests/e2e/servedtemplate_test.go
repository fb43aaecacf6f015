package e2e

// Served mode's templates: a checkpoint with --template keeps the served
// process's replay as a script in the image; `gpucr image load --template`
// has a worker run it before the restore, and the restored process attaches
// to that worker with nothing to make again.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// templateOf is the template status lists for the image img, its worker's
// pid (0: none).
func templateOf(t testing.TB, h *helperProc, img string) int {
	t.Helper()
	st := servedStatusAs(t, h, nil)
	if st.Served == nil {
		return 0
	}
	for _, tp := range st.Served.Templates {
		if tp.ImagesDir == img {
			p, _ := tp.Pid.Int64()
			return int(p)
		}
	}
	return 0
}

// templateSetup starts a helper with a pool and room for resident images
// (and extra flags), and a served heartbeat with args, 10 heartbeats in.
func templateSetup(t *testing.T, dir string, env []string, args []string, extra ...string) (*helperProc, *app) {
	t.Helper()
	h := startHelper(t, dir, env, append([]string{"--served-pool", "1", "--resident-memory", "256M"}, extra...)...)
	waitIdle(t, h, 1)
	a := startServed(t, dir, h, env, "heartbeat", nil, args...)
	a.waitIter(10, time.Minute)
	return h, a
}

// scriptIn is the one template script the image img holds.
func scriptIn(t *testing.T, img string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(img, "gpucr", "template-*.script"))
	if len(m) != 1 {
		t.Fatalf("the image holds template scripts %v, want one", m)
	}
	return m[0]
}

// restoreIntoTemplate restores img (the checkpoint of a) and checks that the
// restored process runs on, served by its template's worker tw.
func restoreIntoTemplate(t *testing.T, h *helperProc, env []string, img string, a *app, tw int) {
	t.Helper()
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+10, time.Minute)
	if w := workerOf(t, h, a.pid); w != tw {
		t.Errorf("the restored pid %d is served by worker %d, not by its template %d", a.pid, w, tw)
	}
}

// TestServedTemplate: a served process checkpointed with --template and its
// image loaded with --template is restored into the worker that ran its
// script: status lists the template until the restore takes it, the
// restored process is served by that very worker, and it continues exactly
// (its modules, functions and their attributes, a global's contents, also
// where the template's worker placed the global elsewhere, the
// context's limits, streams with priorities, graphs, cuBLAS's and
// cuBLASLt's objects were all made by the script; a program on served
// mode's runtime keeps its __device__ variable's count). The same process
// checkpointed again with --template and restored without a template
// replays as always: writing the script left it whole.
func TestServedTemplate(t *testing.T) {
	needTool(t, "criu")
	env := gpucrEnv(t)
	for i, c := range []appCase{
		{"heartbeat", []string{"--attrs", "--mib", "8", "--buffers", "3"}},
		{"heartbeat", []string{"--attrs", "--moved-global", "--mib", "8", "--buffers", "3"}},
		{"heartbeat", []string{"--graph", "--mib", "8", "--buffers", "3"}},
		{"blasbeat", []string{"--graph", "--lt-per-call"}},
		{"rtbeat", []string{"--graph", "--mib", "8", "--buffers", "3"}},
	} {
		t.Run(fmt.Sprintf("%s-%d", c.name, i), func(t *testing.T) {
			dir := t.TempDir()
			h := startHelper(t, dir, env, "--served-pool", "1", "--resident-memory", "256M")
			waitIdle(t, h, 1)
			args := append(append([]string{}, c.args...), "--interval-ms", "20", "--hb-every", "1")
			a := startServed(t, dir, h, env, c.name, nil, args...)
			a.waitIter(10, time.Minute)

			img := dir + "/img"
			cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--template")
			a.reap(30 * time.Second)
			waitPidFree(a.pid, 10*time.Second)
			scriptIn(t, img)
			if out := cliOK(t, h, env, img, "image", "inspect", img); !strings.Contains(out, "a template script of") {
				t.Errorf("gpucr image inspect does not show the template script:\n%s", out)
			}
			out := cliOK(t, h, env, img, "image", "load", img, "--template")
			if !strings.Contains(out, "1 templates wait for its restore") {
				t.Errorf("gpucr image load --template says:\n%s", out)
			}
			tw := templateOf(t, h, img)
			if tw == 0 {
				t.Fatalf("status lists no template of %s after the load:\n%s", img, tail(h.logText(), 20))
			}
			restoreIntoTemplate(t, h, env, img, a, tw)
			if left := templateOf(t, h, img); left != 0 {
				t.Errorf("status still lists template %d after the restore took it", left)
			}
			if !strings.Contains(h.logText(), `"template":true`) {
				t.Errorf("the helper's log does not say the restore's worker was its template:\n%s", tail(h.logText(), 20))
			}

			// Again with --template, restored with no template loaded: the replay.
			img2 := dir + "/img2"
			cliOK(t, h, env, img2, "checkpoint", strconv.Itoa(a.pid), "-D", img2, "--template")
			a.reap(30 * time.Second)
			waitPidFree(a.pid, 10*time.Second)
			before := a.lastIter()
			cliOK(t, h, env, img2, "restore", "-D", img2)
			a.waitIter(before+10, time.Minute)
			if bad := unexpectedWarnings(a.output(), movedGlobal(c.args)); len(bad) > 0 {
				t.Errorf("served mode's warnings: %q\n%s", bad, tail(a.output(), 20))
			}
			a.kill()
			ref := c.name
			if c.name == "rtbeat" {
				ref = "heartbeat" // the same checksums, on the runtime
				if n, last := lastBeats(a.output()), maxIter(a.heartbeats()); n != last {
					t.Errorf("rtbeat's __device__ count is %d at iteration %d", n, last)
				}
			}
			compareWithReference(t, a.heartbeats(), reference(t, env, ref, args, maxIter(a.heartbeats())))
			if t.Failed() {
				t.Logf("%s:\n%s", c.name, tail(a.output(), 30))
				t.Logf("helper:\n%s", tail(h.logText(), 40))
			}
		})
	}
}

// TestServedTemplateDamaged: a template script changed in the image is
// refused by name at the load, and no template is made; the image still
// restores (its process replays), exactly.
func TestServedTemplateDamaged(t *testing.T) {
	needTool(t, "criu")
	env := gpucrEnv(t)
	dir := t.TempDir()
	args := []string{"--attrs", "--mib", "8", "--buffers", "3", "--interval-ms", "20", "--hb-every", "1"}
	h, a := templateSetup(t, dir, env, args)
	img := dir + "/img"
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--template")
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	script := scriptIn(t, img)
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(script, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(time.Minute, env, binPath(t, "gpucr"), "image", "load", img, "--template", "--socket", h.socket)
	if err == nil || !strings.Contains(out, "template script damaged") || !strings.Contains(out, filepath.Base(script)) {
		t.Errorf("gpucr image load --template of a damaged script: %v\n%s", err, out)
	}
	if tw := templateOf(t, h, img); tw != 0 {
		t.Errorf("a template (worker %d) was made from a damaged script", tw)
	}
	before := a.lastIter()
	cliOK(t, h, env, img, "restore", "-D", img)
	a.waitIter(before+10, time.Minute)
	a.kill()
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, maxIter(a.heartbeats())))
}

// TestServedTemplateAttack: another user who knows a template's token (it is
// no secret: it is in the image) asks for it in a Serve: the helper gives
// that user a worker of the pool, not the template, which stays for its
// own process. That user sees no template in status, cannot give it up,
// and cannot make templates of an image that is not theirs.
func TestServedTemplateAttack(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := sharedDir(t)
	env := gpucrEnv(t)
	args := []string{"--mib", "8", "--buffers", "3", "--interval-ms", "20", "--hb-every", "1"}
	h, a := templateSetup(t, dir, env, args, "--socket-mode", "0666")
	img := dir + "/img"
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--template")
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	cliOK(t, h, env, img, "image", "load", img, "--template")
	tw := templateOf(t, h, img)
	if tw == 0 {
		t.Fatal("no template after the load")
	}
	hdr := make([]byte, 32)
	f, err := os.Open(scriptIn(t, img))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(hdr, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	token := hdr[16:32]

	var reply *helperpb.ServeReply
	dialAs(t, h.socket, &u, 1, func(c *net.UnixConn) error {
		if err := sayHello(c, helperpb.Role_ROLE_SERVED); err != nil {
			return err
		}
		w, err := wire.New(c)
		if err != nil {
			return err
		}
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		if err := w.Write(&helperpb.Request{Id: 2, Body: &helperpb.Request_Serve{Serve: &helperpb.Serve{TemplateToken: token}}}, nil); err != nil {
			return err
		}
		r, fds, err := w.ReadResponse()
		wire.CloseFDs(fds) // the worker it got ends with this socket
		if err != nil {
			return err
		}
		if r.Error != nil {
			return fmt.Errorf("Serve: %s", r.Error.Message)
		}
		reply = r.GetServe()
		return nil
	})
	if reply == nil || reply.Template || int(reply.WorkerPid) == tw {
		t.Errorf("uid %d's Serve with another user's token got %+v (the template is worker %d)", u.UID, reply, tw)
	}
	if now := templateOf(t, h, img); now != tw {
		t.Errorf("after another user's Serve the template is %d, want %d", now, tw)
	}
	if st := servedStatusAs(t, h, &u); st.Served != nil && len(st.Served.Templates) != 0 {
		t.Errorf("uid %d's status lists root's templates: %+v", u.UID, st.Served.Templates)
	}
	gpucrCmd := func(args ...string) *exec.Cmd {
		cmd := exec.Command(binPath(t, "gpucr"), args...)
		cmd.Env = env
		return cmd
	}
	cmd := asUser(gpucrCmd("image", "unload", img, "--socket", h.socket), u)
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("uid %d gave up root's template image:\n%s", u.UID, out)
	}
	cmd = asUser(gpucrCmd("image", "load", img, "--template", "--socket", h.socket), u)
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("uid %d made templates of root's image:\n%s", u.UID, out)
	}
	if now := templateOf(t, h, img); now != tw {
		t.Errorf("after the other user's attempts the template is %d, want %d", now, tw)
	}
	// The template still serves its own process.
	restoreIntoTemplate(t, h, env, img, a, tw)
	a.kill()
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, maxIter(a.heartbeats())))
}

// TestServedTemplateLeaveRunning: a leave-running checkpoint with --template
// lets the process go on at once (in a new worker, by replay: no template
// exists yet); once it is gone, its image restores into a template made
// from the script, and goes on exactly from the checkpoint.
func TestServedTemplateLeaveRunning(t *testing.T) {
	needTool(t, "criu")
	env := gpucrEnv(t)
	dir := t.TempDir()
	args := []string{"--graph", "--mib", "8", "--buffers", "3", "--interval-ms", "20", "--hb-every", "1"}
	h, a := templateSetup(t, dir, env, args)
	img := dir + "/img"
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", "--template")
	at := a.lastIter()
	a.waitIter(at+10, time.Minute)
	if strings.Contains(a.output(), "gpucr: ") {
		t.Errorf("warnings after a leave-running checkpoint with --template:\n%s", tail(a.output(), 10))
	}
	a.kill()
	waitPidFree(a.pid, 10*time.Second)
	cliOK(t, h, env, img, "image", "load", img, "--template")
	tw := templateOf(t, h, img)
	if tw == 0 {
		t.Fatal("no template after the load")
	}
	restoreIntoTemplate(t, h, env, img, a, tw)
	a.kill()
	// The heartbeats after the restore repeat those from the checkpoint on,
	// each equal to an uninterrupted run's.
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, maxIter(a.heartbeats())))
}
