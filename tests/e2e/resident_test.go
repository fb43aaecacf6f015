package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

type residentStatus struct {
	Resident []struct {
		ImagesDir string `json:"images_dir"`
		Bytes     uint64 `json:"bytes"`
		Restores  uint64 `json:"restores"`
	} `json:"resident_images"`
	Budget uint64 `json:"resident_budget"`
}

func residents(t *testing.T, h *helperProc, env []string) residentStatus {
	t.Helper()
	out := cliOK(t, h, env, "", "status", "--json")
	var st residentStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("gpucr status --json: %v\n%s", err, out)
	}
	return st
}

// fromResident says whether a restore's --json report says its GPU data
// was copied on the GPU from the image's resident copy.
func fromResident(t *testing.T, out string) bool {
	t.Helper()
	var rep struct {
		GPU struct {
			FromResident bool   `json:"from_resident"`
			Bytes        uint64 `json:"bytes"`
			Moved        uint64 `json:"bytes_moved"`
		} `json:"gpu"`
	}
	if i := strings.LastIndex(out, "\n{"); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("restore --json: %v\n%s", err, out)
	}
	return rep.GPU.FromResident && rep.GPU.Bytes > 0 && rep.GPU.Moved == 0
}

// TestResidentImage: an image made resident (gpucr image load) serves two
// restores in turn from device memory, each continuing exactly from the
// checkpoint; status lists it with the restores it served; a second image
// beyond the helper's budget is refused naming the budget; unload gives the
// copy up, and the next restore reads storage again; and a resident copy is
// given up for a process that needs the memory.
func TestResidentImage(t *testing.T) {
	needTool(t, "criu")
	dir := t.TempDir()
	// 64 MiB GPUs: resident copies and a process must compete for them.
	env := gpucrEnv(t, "GPUCR_SIM_MEM_MIB=64")
	h := startHelper(t, dir, env, "--resident-memory", "40M")
	img := filepath.Join(dir, "img")
	args := []string{"--mib", "16", "--interval-ms", "20", "--hb-every", "1"}
	a := startUnder(t, dir, h, env, "heartbeat", args...)
	a.waitIter(10, time.Minute)
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
	a.reap(30 * time.Second)

	if out, err := cli(t, h, env, "image", "load", img); err != nil || !strings.Contains(out, "GPU data resident, ") {
		t.Fatalf("gpucr image load: %v\n%s", err, out)
	}
	// 16 MiB in 8 buffers, each rounded up to the 2 MiB granularity
	if st := residents(t, h, env); len(st.Resident) != 1 || st.Resident[0].ImagesDir != img || st.Resident[0].Bytes < 16<<20 ||
		st.Resident[0].Bytes > 24<<20 || st.Budget != 40<<20 {
		t.Fatalf("status after the load: %+v", st)
	}
	for n := 1; n <= 2; n++ {
		before := a.lastIter()
		out := cliOK(t, h, env, img, "restore", "-D", img, "--json")
		if !fromResident(t, out) {
			t.Errorf("restore %d: the report does not say its GPU data came from the resident copy:\n%s", n, out)
		}
		a.waitIter(before+5, time.Minute)
		_ = syscall.Kill(a.pid, syscall.SIGKILL)
		waitDead(t, a.pid, 10*time.Second)
		waitPidFree(a.pid, 10*time.Second)
	}
	if st := residents(t, h, env); len(st.Resident) != 1 || st.Resident[0].Restores != 2 {
		t.Errorf("status after two restores: %+v", st)
	}

	// A second image does not fit the budget beside the first.
	img2 := filepath.Join(dir, "img2")
	b := startUnder(t, t.TempDir(), h, env, "heartbeat", "--mib", "16", "--interval-ms", "20")
	b.waitIter(3, time.Minute)
	cliOK(t, h, env, img2, "checkpoint", strconv.Itoa(b.pid), "-D", img2, "--leave-running")
	if out, err := cli(t, h, env, "image", "load", img2); err == nil || !strings.Contains(out, "--resident-memory") {
		t.Errorf("a load beyond the budget: %v, want a refusal naming --resident-memory:\n%s", err, out)
	}
	// That process needs more memory than the device has beside the
	// resident copy: it is given up for it.
	b.kill()
	c := startUnder(t, t.TempDir(), h, env, "heartbeat", "--mib", "40", "--interval-ms", "20")
	c.waitIter(3, time.Minute)
	if st := residents(t, h, env); len(st.Resident) != 0 {
		t.Errorf("a process needed the memory of the resident copy, but it is still resident: %+v", st)
	}
	c.kill()

	// Loaded again, unloaded: the next restore reads storage.
	cliOK(t, h, env, img, "image", "load", img)
	if out, err := cli(t, h, env, "image", "unload", img); err != nil || !strings.Contains(out, "given up") {
		t.Errorf("gpucr image unload: %v\n%s", err, out)
	}
	if out, err := cli(t, h, env, "image", "unload", img); err == nil || !strings.Contains(out, "is not resident") {
		t.Errorf("unload of an image not resident: %v\n%s", err, out)
	}
	before := a.lastIter()
	out := cliOK(t, h, env, img, "restore", "-D", img, "--json")
	if fromResident(t, out) {
		t.Errorf("a restore after the unload says it came from the resident copy:\n%s", out)
	}
	a.waitIter(before+5, time.Minute)
	_ = syscall.Kill(a.pid, syscall.SIGKILL)
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", args, maxIter(a.heartbeats())))
}

// TestResidentImageIsTheOwners: another user may not make root's image
// resident (whose data a restore would then copy from device memory), even
// with a descriptor of its directory in hand.
func TestResidentImageIsTheOwners(t *testing.T) {
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelperWith(t, dir, env, "--socket-mode", "0666", "--resident-memory", "64M")
	openUp(t, dir)
	a := startUnder(t, dir, h, env, "heartbeat", "--mib", "4", "--interval-ms", "20")
	a.waitIter(3, time.Minute)
	img := filepath.Join(dir, "roots")
	cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running")
	if err := os.Chmod(img, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := asOther(t, u, time.Minute, env, binPath(t, "gpucr"), "image", "load", img, "--socket", h.socket)
	if err == nil || !strings.Contains(out, "may make only its own images resident") {
		t.Errorf("user %s loading root's image: %v, want a refusal:\n%s", u.Name, err, out)
	}
	if st := residents(t, h, env); len(st.Resident) != 0 {
		t.Errorf("root's image became resident for another user: %+v", st)
	}
	a.kill()
}

// TestResidentImagesWithinTheOwnersLimit: a user's resident copies are its
// GPU memory (a user at its limit cannot park more on the device through
// `gpucr image load`); `gpucr status` shows a user its own resident images
// only (root sees all); and an unload naming a path, with no descriptor of
// the directory, is refused the same way whatever the path names, so that it
// tells nothing of directories the user cannot read.
func TestResidentImagesWithinTheOwnersLimit(t *testing.T) {
	needTool(t, "criu")
	u := secondUser(t)
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelperWith(t, dir, env, "--socket-mode", "0666", "--resident-memory", "256M",
		"--max-gpu-memory-per-uid", "40M")
	openUp(t, dir)
	udir := filepath.Join(dir, "user")
	if err := os.Mkdir(udir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(udir, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	gpucr := binPath(t, "gpucr")
	asU := func(args ...string) (string, error) {
		return asOther(t, u, time.Minute, env, gpucr, append(args, "--socket", h.socket)...)
	}

	// The user's process holds 16 MiB of its 40; two GPU-only images of it.
	a := startUnderAs(t, dir, h, env, u, "heartbeat", "--mib", "16", "--buffers", "2", "--interval-ms", "20")
	a.waitIter(3, time.Minute)
	imgs := []string{filepath.Join(udir, "a"), filepath.Join(udir, "b")}
	for _, img := range imgs {
		if out, err := asU("checkpoint", strconv.Itoa(a.pid), "-D", img, "--gpu-only", "--leave-running"); err != nil {
			t.Fatalf("the user's GPU-only checkpoint into %s: %v\n%s", img, err, out)
		}
	}
	// 16 + 16 fits the 40 MiB; a third 16 does not.
	if out, err := asU("image", "load", imgs[0]); err != nil {
		t.Fatalf("the user's first resident image: %v\n%s", err, out)
	}
	out, err := asU("image", "load", imgs[1])
	if want := fmt.Sprintf("GPU memory limit of uid %d reached", u.UID); err == nil || !strings.Contains(out, want) {
		t.Errorf("a resident image past the user's GPU memory limit: %v, want a refusal naming the limit (%q):\n%s", err, want, out)
	}
	// Nor may a new allocation of the user's take what the copy holds.
	if out, code := runUnderAs(t, h, env, &u, binPath(t, "heartbeat"), "--mib", "16", "--buffers", "2", "--iters", "3", "--interval-ms", "0"); code == 0 ||
		!strings.Contains(out, "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("an allocation past the limit that the resident copy takes up: exit %d, want CUDA_ERROR_OUT_OF_MEMORY:\n%s", code, tail(out, 10))
	}

	// Root's own resident image: root sees both, the user only its own.
	r := startUnder(t, dir, h, env, "heartbeat", "--mib", "4", "--interval-ms", "20")
	r.waitIter(3, time.Minute)
	rootImg := filepath.Join(dir, "roots")
	cliOK(t, h, env, rootImg, "checkpoint", strconv.Itoa(r.pid), "-D", rootImg, "--gpu-only", "--leave-running")
	cliOK(t, h, env, rootImg, "image", "load", rootImg)
	if st := residents(t, h, env); len(st.Resident) != 2 {
		t.Errorf("root's status: %d resident images, want 2: %+v", len(st.Resident), st)
	}
	out, err = asU("status", "--json")
	if err != nil {
		t.Fatalf("the user's status: %v\n%s", err, out)
	}
	var ust residentStatus
	if err := json.Unmarshal([]byte(out), &ust); err != nil {
		t.Fatalf("the user's status --json: %v\n%s", err, out)
	}
	if len(ust.Resident) != 1 || ust.Resident[0].ImagesDir != imgs[0] {
		t.Errorf("the user's status lists resident images %+v, want only its own %s", ust.Resident, imgs[0])
	}

	// Unload by path, without a descriptor: one answer whether the path is
	// a resident image, a directory the user cannot read, or nothing.
	secret := filepath.Join(dir, "secret")
	if err := os.Mkdir(secret, 0o700); err != nil {
		t.Fatal(err)
	}
	var first string
	for i, p := range []string{rootImg, secret, filepath.Join(secret, "nothing"), "/nonexistent/at/all"} {
		rep := rawAs(t, u, h, &helperpb.Request{Body: &helperpb.Request_UnloadResident{UnloadResident: &helperpb.UnloadResident{ImageDir: p}}}, "")
		if rep.Code != helperpb.ErrorCode_ERROR_PERMISSION.String() || !strings.Contains(rep.Message, "descriptor") {
			t.Errorf("the user's unload of %s by path: %v, want a permission error asking for a descriptor", p, rep)
		}
		msg := strings.ReplaceAll(rep.Message, p, "PATH")
		if i == 0 {
			first = msg
		} else if msg != first {
			t.Errorf("the unload by path answers %q for %s but %q for %s: it tells the paths apart", msg, p, first, rootImg)
		}
	}
	if st := residents(t, h, env); len(st.Resident) != 2 {
		t.Errorf("after the user's unloads by path: %d resident images, want 2", len(st.Resident))
	}
	// Its own, through the CLI (a descriptor): given up, and its memory with it.
	if out, err := asU("image", "unload", imgs[0]); err != nil {
		t.Errorf("the user's unload of its own image: %v\n%s", err, out)
	}
	if out, err := asU("image", "load", imgs[1]); err != nil {
		t.Errorf("a resident image within the limit again, after the unload: %v\n%s", err, out)
	}
	a.kill()
	r.kill()
}
