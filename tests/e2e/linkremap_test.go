package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// semLoop is a Python process holding a semaphore of multiprocessing's
// spawn context, as every DataLoader with workers and torch.multiprocessing
// do: glibc's sem_open maps it under a temporary name that it unlinks once
// the semaphore has its own, which stays until the process ends. Each
// iteration takes or gives a unit (semValue says which), so the value it
// prints after a restore shows the semaphore came back as it was.
const semLoop = `import multiprocessing as mp, os, sys, time
n = int(sys.argv[1])
s = mp.get_context("spawn").Semaphore(2)
print("ready pid=%d" % os.getpid(), flush=True)
for i in range(1, n + 1):
    if i % 4 == 0:
        s.release()
    elif s.get_value() > 0:
        s.acquire()
    print("hb %d %d" % (i, s.get_value()), flush=True)
    time.sleep(0.01)
print("done", flush=True)
`

// semValue is semLoop's semaphore value after iteration i.
func semValue(i int) int {
	v := 2
	for k := 1; k <= i; k++ {
		if k%4 == 0 {
			v++
		} else if v > 0 {
			v--
		}
	}
	return v
}

// TestLinkRemapImageRestoresAfterTheEnd: CRIU dumps semLoop's semaphore
// (open under a name it unlinked, linked under another) as a link it makes
// beside it (--link-remap), and removes that link itself: at once after a
// --leave-running dump, and in a restore. gpucr keeps a copy of it in the
// image, so the image restores after the process ended, and again after
// that, each time with the semaphore's value of the dump (a dump that
// stops the process leaves the link, which the first restore uses); an
// image whose copy is gone is refused, naming the link.
func TestLinkRemapImageRestoresAfterTheEnd(t *testing.T) {
	needTool(t, "criu")
	py := needTool(t, "python3")
	for _, leave := range []bool{true, false} {
		name := "stop"
		if leave {
			name = "leave-running"
		}
		t.Run(name, func(t *testing.T) { linkRemapRestores(t, py, leave) })
	}
}

func linkRemapRestores(t *testing.T, py string, leave bool) {
	dir := t.TempDir()
	env := gpucrEnv(t)
	h := startHelper(t, dir, env)
	script := filepath.Join(dir, "semloop.py")
	if err := os.WriteFile(script, []byte(semLoop), 0o644); err != nil {
		t.Fatal(err)
	}
	const iters = 300
	a := startUnderArgv(t, dir, h, env, "semloop", []string{py, script, strconv.Itoa(iters)})
	a.waitIter(30, time.Minute)
	img := filepath.Join(dir, "img")
	args := []string{"checkpoint", strconv.Itoa(a.pid), "-D", img, "--link-remap"}
	if leave {
		args = append(args, "--leave-running")
	}
	cliOK(t, h, env, img, args...)
	b, err := os.ReadFile(filepath.Join(img, "gpucr-link-remaps.json"))
	if err != nil {
		t.Fatalf("the image keeps no copy of CRIU's links: %v", err)
	}
	var copies []struct{ Path string }
	if err := json.Unmarshal(b, &copies); err != nil || len(copies) == 0 {
		t.Fatalf("the image's copies of CRIU's links: %v: %s", err, b)
	}
	if leave {
		if code := a.wait(time.Minute); code != 0 {
			t.Fatalf("semloop after its dump: exit %d:\n%s", code, tail(a.output(), 10))
		}
	}
	for _, c := range copies {
		_, err := os.Lstat(c.Path)
		if leave != os.IsNotExist(err) {
			t.Fatalf("CRIU's link %s after the dump (--leave-running %v): %v: the test shows nothing", c.Path, leave, err)
		}
	}
	check := func(from int) {
		t.Helper()
		hbs := a.heartbeats()[from:]
		if len(hbs) < 10 || hbs[0].Iter <= 30 {
			t.Fatalf("the restored process printed %d heartbeats from iteration %v", len(hbs), hbs)
		}
		for _, hb := range hbs {
			if hb.Checksum != strconv.Itoa(semValue(hb.Iter)) {
				t.Fatalf("iteration %d: semaphore value %s, want %d", hb.Iter, hb.Checksum, semValue(hb.Iter))
			}
		}
	}
	for round := 1; round <= 2; round++ {
		waitPidFree(a.pid, 10*time.Second)
		mark := len(a.heartbeats())
		out := cliOK(t, h, env, img, "restore", "-D", img)
		made := strings.Contains(out, "made "+copies[0].Path+" again from the image")
		if want := leave || round == 2; made != want {
			t.Errorf("restore %d: made CRIU's link again: %v, want %v:\n%s", round, made, want, tail(out, 10))
		}
		a.waitFor(time.Minute, "the restored process's end", func(s string, hbs []heartbeat) bool {
			return len(hbs) > mark && hbs[len(hbs)-1].Iter >= iters
		})
		check(mark)
	}
	waitPidFree(a.pid, 10*time.Second)
	ents, _ := filepath.Glob(filepath.Join(img, "gpucr-link-remap-*"))
	for _, e := range ents {
		os.Remove(e)
	}
	os.Remove(filepath.Join(img, "gpucr-link-remaps.json"))
	out, err := cli(t, h, env, "restore", "-D", img)
	if err == nil || !strings.Contains(out, copies[0].Path+", the link CRIU made at the dump") || !strings.Contains(out, "is gone") {
		t.Errorf("restore without the copies: %v, want a refusal naming %s:\n%s", err, copies[0].Path, tail(out, 10))
	}
}
