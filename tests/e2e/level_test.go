package e2e

// Images on a level that outlives the machine: `gpucr image push|pull|ls`
// against a real S3-compatible server (SeaweedFS, scripts/s3-server.sh:
// started by scripts/run-tests.sh, or here when a developer runs the tests
// without it).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/gpucr/gpucr/internal/testroot"
)

// atExit runs after every test of the binary (TestMain).
var atExit []func()

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// The two users of scripts/s3-server.sh's server, each with a bucket of
// its own.
var s3Users = map[string][2]string{
	"gpucr-a": {"AKIAGPUCRTESTA0000000", "gpucr-test-secret-a-000000000000000000000"},
	"gpucr-b": {"AKIAGPUCRTESTB0000000", "gpucr-test-secret-b-000000000000000000000"},
}

var (
	s3Once     sync.Once
	s3Endpoint string
	s3Err      error
)

// s3Server is the test object store's endpoint: $GPUCR_TEST_S3_ENDPOINT
// (scripts/run-tests.sh started it), else one started now for this test
// binary (weed on PATH: make deps installs it). Without one the test
// fails under CI and is skipped elsewhere.
func s3Server(t *testing.T) string {
	t.Helper()
	s3Once.Do(func() {
		if s3Endpoint = os.Getenv("GPUCR_TEST_S3_ENDPOINT"); s3Endpoint != "" {
			return
		}
		if _, err := exec.LookPath("weed"); err != nil {
			s3Err = errors.New("no weed (SeaweedFS) on PATH: make deps installs it")
			return
		}
		dir, err := os.MkdirTemp("", "gpucr-s3-")
		if err != nil {
			s3Err = err
			return
		}
		out, err := exec.Command("bash", filepath.Join(testroot.Dir(t), "scripts", "s3-server.sh"), dir).Output()
		if err != nil {
			s3Err = fmt.Errorf("scripts/s3-server.sh: %v", err)
			return
		}
		s3Endpoint = strings.TrimSpace(string(out))
		atExit = append(atExit, func() {
			if b, err := os.ReadFile(filepath.Join(dir, "weed.pid")); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			os.RemoveAll(dir)
		})
	})
	if s3Err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no object store for the test: %v", s3Err)
		}
		t.Skipf("no object store: %v", s3Err)
	}
	return s3Endpoint
}

// s3Env is env with user's credentials for the store at endpoint.
func s3Env(env []string, endpoint, user string) []string {
	k := s3Users[user]
	return append(append([]string{}, env...), "AWS_ENDPOINT_URL="+endpoint, "AWS_ACCESS_KEY_ID="+k[0],
		"AWS_SECRET_ACCESS_KEY="+k[1], "AWS_REGION=us-east-1")
}

// s3Client is a client of the store as user, its bucket (named as the
// user) made if missing.
func s3Client(t *testing.T, endpoint, user string) *minio.Client {
	t.Helper()
	k := s3Users[user]
	c, err := minio.New(strings.TrimPrefix(endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4(k[0], k[1], ""),
		Region: "us-east-1", BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ok, err := c.BucketExists(ctx, user); err != nil {
		t.Fatalf("bucket %s: %v", user, err)
	} else if !ok {
		if err := c.MakeBucket(ctx, user, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
			t.Fatalf("make bucket %s: %v", user, err)
		}
	}
	// A new bucket takes writes once the server has made its collection.
	for {
		_, err := c.PutObject(ctx, user, "probe", strings.NewReader("x"), 1, minio.PutObjectOptions{})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("bucket %s takes no write: %v", user, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c
}

// levelCase is a level test's set-up: the store at ep with user gpucr-a's
// client (c) and environment (senv; env without credentials), and a
// heartbeat of mib run in-process under helper h (its files in dir), 5
// heartbeats in; newLevelCase also checkpointed it into img (it ended).
type levelCase struct {
	c         *minio.Client
	ep, dir   string
	env, senv []string
	img       string
	a         *app
	h         *helperProc
}

// newLevelJob is a levelCase whose heartbeat runs on; hflags go to the
// helper.
func newLevelJob(t *testing.T, mib string, hflags ...string) *levelCase {
	t.Helper()
	needTool(t, "criu")
	l := &levelCase{ep: s3Server(t), env: gpucrEnv(t), dir: t.TempDir()}
	l.c = s3Client(t, l.ep, "gpucr-a")
	l.senv = s3Env(l.env, l.ep, "gpucr-a")
	l.h = startHelper(t, l.dir, l.env, hflags...)
	l.a = startUnderRun(t, l.dir, l.h, l.env, "heartbeat", nil, append([]string{binPath(t, "heartbeat")}, levelArgs(mib)...), nil)
	l.a.waitIter(5, time.Minute)
	return l
}

func newLevelCase(t *testing.T, mib string) *levelCase {
	t.Helper()
	l := newLevelJob(t, mib)
	l.img = l.dir + "/img"
	cliOK(t, l.h, l.env, l.img, "checkpoint", strconv.Itoa(l.a.pid), "-D", l.img)
	l.a.reap(30 * time.Second)
	waitPidFree(l.a.pid, 10*time.Second)
	return l
}

// levelArgs are heartbeat's arguments in these tests.
func levelArgs(mib string) []string {
	return []string{"--mib", mib, "--buffers", "4", "--interval-ms", "20", "--hb-every", "1"}
}

func gpucrOut(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	return runErr(2*time.Minute, env, binPath(t, "gpucr"), args...)
}

// TestLevelPushPullRestore: a checkpoint pushed to the object store, pushed
// again under another name (nothing crosses: the bucket has every file),
// listed, pulled into a new directory with every file checked (the image
// verifies there), and restored by its URL alone (restore -D s3://...),
// continues exactly; neither the output nor --json carries the secret key.
func TestLevelPushPullRestore(t *testing.T) {
	l := newLevelCase(t, "16")
	env, senv, img, a, h := l.env, l.senv, l.img, l.a, l.h

	out, err := gpucrOut(t, senv, "image", "push", img, "s3://gpucr-a/job/1", "--json")
	if err != nil || !strings.Contains(out, `"moved_bytes"`) {
		t.Fatalf("push: %v\n%s", err, out)
	}
	if strings.Contains(out, s3Users["gpucr-a"][1]) {
		t.Errorf("the push's output holds the secret key:\n%s", out)
	}
	out, err = gpucrOut(t, senv, "image", "push", img, "s3://gpucr-a/job/1-again", "--json")
	if err != nil || !strings.Contains(out, `"moved_bytes":0`) {
		t.Errorf("the second push of the same image sent bytes: %v\n%s", err, out)
	}
	out, err = gpucrOut(t, senv, "image", "ls", "s3://gpucr-a/job")
	if err != nil || !strings.Contains(out, "s3://gpucr-a/job/1\n") && !strings.HasSuffix(strings.TrimSpace(out), "s3://gpucr-a/job/1") ||
		!strings.Contains(out, "s3://gpucr-a/job/1-again") {
		t.Errorf("ls: %v\n%s", err, out)
	}

	pulled := filepath.Join(t.TempDir(), "node2")
	if out, err := gpucrOut(t, senv, "image", "pull", "s3://gpucr-a/job/1", pulled); err != nil {
		t.Fatalf("pull: %v\n%s", err, out)
	}
	if out, err := gpucrOut(t, env, "image", "verify", pulled); err != nil {
		t.Errorf("verify of the pulled image: %v\n%s", err, out)
	}
	// A node with nothing but the URL: restore -D s3://... pulls it first.
	pullDir := t.TempDir()
	before := a.lastIter()
	out = cliOK(t, h, senv, pullDir, "restore", "-D", "s3://gpucr-a/job/1", "--pull-dir", pullDir)
	a.waitIter(before+5, time.Minute)
	if !strings.Contains(out, "pulled s3://gpucr-a/job/1 into "+pullDir+"/") {
		t.Errorf("restore -D s3://... does not say where it pulled the image:\n%s", out)
	}
	a.kill()
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", levelArgs("16"), maxIter(a.heartbeats())))
}

// TestLevelDamagedBlob: a file changed in the store is refused by name at
// the pull, which leaves no image behind.
func TestLevelDamagedBlob(t *testing.T) {
	l := newLevelCase(t, "4")
	c, senv, img := l.c, l.senv, l.img
	if out, err := gpucrOut(t, senv, "image", "push", img, "s3://gpucr-a/damaged/1"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	// The manifest's blob: the same size, one byte changed.
	m, err := os.ReadFile(filepath.Join(img, "gpucr", "manifest.pb"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256Hex(m)
	bad := bytes.Clone(m)
	bad[len(bad)/2] ^= 1
	ctx := context.Background()
	if _, err := c.PutObject(ctx, "gpucr-a", ".gpucr/blobs/"+sum, bytes.NewReader(bad), int64(len(bad)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	pulled := filepath.Join(t.TempDir(), "node2")
	out, err := gpucrOut(t, senv, "image", "pull", "s3://gpucr-a/damaged/1", pulled)
	if err == nil || !strings.Contains(out, "damaged in the object store") || !strings.Contains(out, "gpucr/manifest.pb") {
		t.Errorf("pull of a damaged file: %v\n%s", err, out)
	}
	if ents, _ := os.ReadDir(pulled); len(ents) != 0 {
		t.Errorf("a failed pull left %d entries in %s", len(ents), pulled)
	}
}

// TestLevelInterruptedPush: a push killed once its first files are in the
// store leaves no image listed (its index is written last); the next push
// sends only what is missing.
func TestLevelInterruptedPush(t *testing.T) {
	l := newLevelCase(t, "64")
	c, senv, img := l.c, l.senv, l.img
	// The bucket's blobs now: the push's first one is the first past them.
	bucket := "gpucr-a"
	ctx := context.Background()
	blobs := func() int {
		n := 0
		for o := range c.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: ".gpucr/blobs/", Recursive: true}) {
			if o.Err == nil {
				n++
			}
		}
		return n
	}
	had := blobs()
	cmd := exec.Command(binPath(t, "gpucr"), "image", "push", img, "s3://gpucr-a/cut/1", "--jobs", "1")
	cmd.Env = senv
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); blobs() == had; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no file reached the store in a minute")
		}
	}
	_ = cmd.Process.Kill()
	err := cmd.Wait()
	if err == nil {
		t.Skip("the push finished before it could be killed")
	}
	out, err := gpucrOut(t, senv, "image", "ls", "s3://gpucr-a/cut")
	if err != nil || strings.Contains(out, "s3://gpucr-a/cut/1") {
		t.Errorf("an interrupted push is listed: %v\n%s", err, out)
	}
	if out, err := gpucrOut(t, senv, "image", "pull", "s3://gpucr-a/cut/1", filepath.Join(t.TempDir(), "x")); err == nil ||
		!strings.Contains(out, "no image there") {
		t.Errorf("pull of an interrupted push: %v\n%s", err, out)
	}
	out, err = gpucrOut(t, senv, "image", "push", img, "s3://gpucr-a/cut/1", "--json")
	if err != nil {
		t.Fatalf("push again: %v\n%s", err, out)
	}
	if strings.Contains(out, `"blobs_had":0,`) {
		t.Errorf("the push after an interrupted one sent every file again:\n%s", out)
	}
}

// TestLevelOtherUser: a user whose credentials give no right to another's
// bucket can neither list nor pull its images, and the refusal names the
// object, not a key; a wrong secret is refused without being echoed.
func TestLevelOtherUser(t *testing.T) {
	l := newLevelCase(t, "4")
	ep, env, img := s3Server(t), l.env, l.img
	s3Client(t, ep, "gpucr-b")
	if out, err := gpucrOut(t, s3Env(env, ep, "gpucr-a"), "image", "push", img, "s3://gpucr-a/private/1"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	benv := s3Env(env, ep, "gpucr-b")
	if out, err := gpucrOut(t, benv, "image", "ls", "s3://gpucr-a/private"); err == nil || strings.Contains(out, "private/1") {
		t.Errorf("user b listed user a's images: %v\n%s", err, out)
	}
	pulled := filepath.Join(t.TempDir(), "stolen")
	out, err := gpucrOut(t, benv, "image", "pull", "s3://gpucr-a/private/1", pulled)
	if err == nil {
		t.Errorf("user b pulled user a's image:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(pulled, "gpucr", "manifest.pb")); err == nil {
		t.Error("user b's refused pull left a manifest")
	}
	for _, k := range s3Users["gpucr-b"] {
		if strings.Contains(out, k[len(k)-8:]) && k == s3Users["gpucr-b"][1] {
			t.Errorf("the refusal holds the secret key:\n%s", out)
		}
	}
	wrong := append(s3Env(env, ep, "gpucr-a"), "AWS_SECRET_ACCESS_KEY=not-the-secret-of-gpucr-a-00000000000000")
	out, err = gpucrOut(t, wrong, "image", "ls", "s3://gpucr-a/private", "--json")
	if err == nil || strings.Contains(out, "not-the-secret") {
		t.Errorf("a wrong secret: %v\n%s", err, out)
	}
}

// drainOf is the drain to url that `gpucr status --json` lists (nil: none).
func drainOf(t *testing.T, h *helperProc, env []string, url string) map[string]any {
	t.Helper()
	out, err := cli(t, h, env, "status", "--json")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var st struct {
		Drains []map[string]any `json:"drains"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	for _, d := range st.Drains {
		if d["url"] == url {
			return d
		}
	}
	return nil
}

// TestLevelDrain: checkpoint --drain returns once the image is complete and
// pushes it in the background; status follows the drain to "done", and the
// image then pulls and verifies. A drain killed on its way is "died" in
// status and lists no image.
func TestLevelDrain(t *testing.T) {
	l := newLevelJob(t, "16")
	env, senv, dir, h, a := l.env, l.senv, l.dir, l.h, l.a
	url := fmt.Sprintf("s3://gpucr-a/drained/%d", time.Now().UnixNano())
	img := dir + "/img"
	out := cliOK(t, h, senv, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", "--drain", url)
	if !strings.Contains(out, "draining "+img+" to "+url+" in the background") {
		t.Errorf("checkpoint --drain says:\n%s", out)
	}
	d := waitDrain(t, h, senv, url)
	if d["state"] != "done" || d["files_done"] != d["files"] || d["bytes_done"] != d["bytes"] {
		t.Errorf("the drain ended %v", d)
	}
	if out, err := gpucrOut(t, env, "status", "--socket", h.socket); err != nil || !strings.Contains(out, "[####################] 100% "+img+" -> "+url+": done") {
		t.Errorf("status does not show the finished drain: %v\n%s", err, out)
	}
	pulled := filepath.Join(t.TempDir(), "p")
	if out, err := gpucrOut(t, senv, "image", "pull", url, pulled); err != nil {
		t.Fatalf("pull of the drained image: %v\n%s", err, out)
	}
	if out, err := gpucrOut(t, env, "image", "verify", pulled); err != nil {
		t.Errorf("verify: %v\n%s", err, out)
	}

	// A drain killed at once.
	img2 := dir + "/img2"
	url2 := url + "-killed"
	out = cliOK(t, h, senv, img2, "checkpoint", strconv.Itoa(a.pid), "-D", img2, "--leave-running", "--drain", url2)
	i := strings.Index(out, "in the background (pid ")
	if i < 0 {
		t.Fatalf("no drain pid in:\n%s", out)
	}
	var dpid int
	if _, err := fmt.Sscanf(out[i:], "in the background (pid %d;", &dpid); err != nil || dpid <= 0 || syscall.Kill(dpid, syscall.SIGKILL) != nil {
		t.Fatalf("could not kill drain %d", dpid)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		d = drainOf(t, h, senv, url2)
		if d != nil && d["state"] != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed drain is still running in status: %v", d)
		}
	}
	if d["state"] != "died" && d["state"] != "done" {
		t.Errorf("a killed drain is %v", d)
	}
	if d["state"] == "died" {
		if out, err := gpucrOut(t, senv, "image", "ls", "s3://gpucr-a/drained"); err != nil || strings.Contains(out, url2) {
			t.Errorf("a drain that died is listed: %v\n%s", err, out)
		}
	}
	a.kill()
}

// TestLevelPreemption: the final checkpoint on a preemption notice,
// `checkpoint --drain URL --wait --deadline D`, returns once the image is
// safe in the store and says whether that was within D; a node with only
// the URL restores it, and it continues exactly. A deadline too short is
// reported as missed (exit 1) with the image safe all the same. Another
// user's attempt on the job is refused, and the job runs on.
func TestLevelPreemption(t *testing.T) {
	l := newLevelJob(t, "16", "--socket-mode", "0666")
	ep, env, senv, dir, h, a := l.ep, l.env, l.senv, l.dir, l.h, l.a
	url := fmt.Sprintf("s3://gpucr-a/preempted/%d", time.Now().UnixNano())

	if out, err := gpucrOut(t, senv, "checkpoint", strconv.Itoa(a.pid), "-D", dir+"/x", "--wait"); err == nil ||
		!strings.Contains(out, "no --drain was given") {
		t.Errorf("checkpoint --wait without --drain: %v\n%s", err, out)
	}
	if out, err := gpucrOut(t, senv, "checkpoint", strconv.Itoa(a.pid), "-D", dir+"/x", "--drain", url, "--deadline", "5s"); err == nil ||
		!strings.Contains(out, "bounds --drain --wait") {
		t.Errorf("checkpoint --deadline without --wait: %v\n%s", err, out)
	}

	// Another user, with credentials of their own, on this job.
	u := secondUser(t)
	theirs := filepath.Join(t.TempDir(), "theirs")
	if err := os.MkdirAll(theirs, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(filepath.Dir(theirs), 0o777)
	s3Client(t, ep, "gpucr-b")
	cmd := exec.Command(binPath(t, "gpucr"), "checkpoint", strconv.Itoa(a.pid), "-D", theirs+"/img", "--socket", h.socket,
		"--drain", "s3://gpucr-b/stolen", "--wait", "--deadline", "1m")
	cmd.Env = append(s3Env(env, ep, "gpucr-b"), "GPUCR_DRAIN_DIR="+theirs+"/drains")
	if out, err := asUser(cmd, u).CombinedOutput(); err == nil {
		t.Errorf("uid %d took a final checkpoint of root's job:\n%s", u.UID, out)
	}
	before := a.lastIter()
	a.waitIter(before+3, time.Minute)
	if out, err := gpucrOut(t, s3Env(env, ep, "gpucr-b"), "image", "ls", "s3://gpucr-b/stolen"); err != nil || !strings.Contains(out, "no images") {
		t.Errorf("the refused checkpoint left an image in the other user's bucket: %v\n%s", err, out)
	}

	img := dir + "/final"
	out := cliOK(t, h, senv, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--drain", url, "--wait", "--deadline", "2m", "--json")
	var rep struct {
		Pid   int `json:"pid"`
		Drain struct {
			Files int    `json:"files"`
			Bytes int64  `json:"bytes"`
			URL   string `json:"url"`
		} `json:"drain"`
		Safe     float64 `json:"safe_seconds"`
		Deadline float64 `json:"deadline_seconds"`
		Met      *bool   `json:"deadline_met"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &rep); err != nil {
		t.Fatalf("checkpoint --json: %v\n%s", err, out)
	}
	if rep.Pid != a.pid || rep.Drain.Files == 0 || rep.Drain.Bytes == 0 || rep.Drain.URL != url || rep.Safe <= 0 ||
		rep.Deadline != 120 || rep.Met == nil || !*rep.Met {
		t.Errorf("the final checkpoint's report: %+v\n%s", rep, out)
	}
	if d := drainOf(t, h, senv, url); d == nil || d["state"] != "done" {
		t.Errorf("status lists the final checkpoint's push as %v, want done", d)
	}
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)

	// Another node: nothing but the URL.
	pullDir := t.TempDir()
	before = a.lastIter()
	cliOK(t, h, senv, pullDir, "restore", "-D", url, "--pull-dir", pullDir)
	a.waitIter(before+5, time.Minute)

	// A deadline no push makes: reported, exit 1, the image safe anyway.
	url2 := url + "-late"
	img2 := dir + "/late"
	out, err := cli(t, h, senv, "checkpoint", strconv.Itoa(a.pid), "-D", img2, "--drain", url2, "--wait", "--deadline", "1ms")
	if err == nil || !strings.Contains(out, "past the deadline of 1ms") || !strings.Contains(out, "the image is safe at "+url2) {
		t.Errorf("a missed deadline: %v\n%s", err, out)
	}
	if out, err := gpucrOut(t, senv, "image", "ls", url2); err != nil || !strings.Contains(out, url2) {
		t.Errorf("the late image is not listed: %v\n%s", err, out)
	}
	a.reap(30 * time.Second)
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", levelArgs("16"), maxIter(a.heartbeats())))
}

// waitDrain waits for the drain to url to end, and returns its record.
func waitDrain(t *testing.T, h *helperProc, env []string, url string) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if d := drainOf(t, h, env, url); d != nil && d["state"] != "running" {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("the drain to %s is not over after a minute", url)
		}
	}
}

// TestLevelKeepNewest: a series checkpointed with --drain --keep 2 keeps
// its newest two images locally; an older one goes once its own drain is
// done, and one that no drain took (a checkpoint without --drain) stays,
// said why. What was pruned locally still restores from the store.
func TestLevelKeepNewest(t *testing.T) {
	l := newLevelJob(t, "8")
	ep, env, senv, dir, h, a := l.ep, l.env, l.senv, l.dir, l.h, l.a
	series := dir + "/series"
	base := fmt.Sprintf("s3://gpucr-a/kept/%d", time.Now().UnixNano())

	if out, err := gpucrOut(t, senv, "checkpoint", strconv.Itoa(a.pid), "-D", series+"/x", "--keep", "2"); err == nil ||
		!strings.Contains(out, "no --drain was given") {
		t.Errorf("checkpoint --keep without --drain: %v\n%s", err, out)
	}
	// 0: local only. 1..4: drained, each pruning to the newest 2.
	cliOK(t, h, senv, series+"/0", "checkpoint", strconv.Itoa(a.pid), "-D", series+"/0", "--leave-running")
	for i := 1; i <= 4; i++ {
		img, url := fmt.Sprintf("%s/%d", series, i), fmt.Sprintf("%s/%d", base, i)
		a.waitIter(a.lastIter()+2, time.Minute)
		cliOK(t, h, senv, img, "checkpoint", strconv.Itoa(a.pid), "-D", img, "--leave-running", "--drain", url, "--keep", "2")
		if d := waitDrain(t, h, senv, url); d["state"] != "done" {
			t.Fatalf("drain %d ended %v", i, d)
		}
	}
	d := drainOf(t, h, senv, base+"/4")
	pruned, _ := d["pruned"].([]any)
	var removed []string
	keptZero := false
	for _, p := range pruned {
		m := p.(map[string]any)
		if m["removed"] == true {
			removed = append(removed, filepath.Base(m["images_dir"].(string)))
		} else if filepath.Base(m["images_dir"].(string)) == "0" && strings.Contains(fmt.Sprint(m["kept"]), "no finished drain") {
			keptZero = true
		}
	}
	if len(removed) != 1 || removed[0] != "2" || !keptZero {
		t.Errorf("the last drain pruned %v and kept 0 (never drained): %v; want 2 removed (1 went with the drain before): %v", removed, keptZero, pruned)
	}
	for i, want := range []bool{true, false, false, true, true} {
		_, err := os.Stat(fmt.Sprintf("%s/%d/gpucr/manifest.pb", series, i))
		if (err == nil) != want {
			t.Errorf("image %d locally: %v, want there %v", i, err, want)
		}
	}
	if out, err := gpucrOut(t, env, "status", "--socket", h.socket); err != nil || !strings.Contains(out, "then pruned 1 older local images of its series (1 kept)") {
		t.Errorf("status does not show the prune: %v\n%s", err, out)
	}

	// Another user who can read two of the series' images, and pushes
	// them with drains of their own on record, prunes none of it: a series
	// is pruned of its caller's images only (image.SeriesOwned).
	u := secondUser(t)
	for _, p := range []string{filepath.Dir(dir), dir, series} {
		_ = os.Chmod(p, 0o755)
	}
	// Images 3 and 4 readable by all, so that the push runs and the prune
	// itself must refuse to remove root's image.
	for _, img := range []string{series + "/3", series + "/4"} {
		_ = filepath.WalkDir(img, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chmod(p, 0o755)
			} else if err == nil {
				_ = os.Chmod(p, 0o644)
			}
			return nil
		})
	}
	theirs := t.TempDir()
	_ = os.Chmod(theirs, 0o777)
	s3Client(t, ep, "gpucr-b")
	var out []byte
	var err error
	for _, args := range [][]string{{series + "/3", "s3://gpucr-b/theirs/3", "--record"},
		{series + "/4", "s3://gpucr-b/theirs/4", "--record", "--keep", "1"}} {
		cmd := exec.Command(binPath(t, "gpucr"), append([]string{"image", "push"}, args...)...)
		cmd.Env = append(s3Env(env, ep, "gpucr-b"), "GPUCR_DRAIN_DIR="+theirs+"/drains")
		o, e := asUser(cmd, u).CombinedOutput()
		out, err = append(out, o...), e
	}
	if err != nil || strings.Contains(string(out), "pruned ") {
		t.Errorf("uid %d's pushes of root's readable images: %v (they push; the prune takes only the caller's images)\n%s", u.UID, err, out)
	}
	for _, i := range []int{0, 3, 4} {
		if _, serr := os.Stat(fmt.Sprintf("%s/%d/gpucr/manifest.pb", series, i)); serr != nil {
			t.Errorf("uid %d's push --keep 1 (%v) removed root's image %d:\n%s", u.UID, err, i, out)
		}
	}

	// Image 1, gone locally, restores from the store alone.
	cliOK(t, h, senv, dir, "checkpoint", strconv.Itoa(a.pid), "-D", dir+"/last")
	a.reap(30 * time.Second)
	waitPidFree(a.pid, 10*time.Second)
	pullDir := t.TempDir()
	before := a.lastIter()
	cliOK(t, h, senv, pullDir, "restore", "-D", base+"/1", "--pull-dir", pullDir)
	a.waitIter(before+3, time.Minute)
	a.kill()
	compareWithReference(t, a.heartbeats(), reference(t, env, "heartbeat", levelArgs("8"), maxIter(a.heartbeats())))
}
