package e2e

// A GPU image that is well formed but does not match the process it restores
// (a manifest rewritten and re-sealed by someone who could write the image
// directory) must never leave a process frozen while the restore says it
// worked: it is refused before CRIU restores anything, or the restored
// process is stopped with the reason, and `gpucr restore` fails naming it.

import (
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/protocol/imagepb"
)

// resealManifest rewrites DIR/gpucr/manifest.pb after edit changed it, with
// a correct checksum: what anyone who can write the directory can do.
func resealManifest(t *testing.T, dir string, edit func(m *imagepb.Manifest)) {
	t.Helper()
	path := filepath.Join(dir, "gpucr", "manifest.pb")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file imagepb.ManifestFile
	if err := proto.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	var m imagepb.Manifest
	if err := proto.Unmarshal(file.GetManifest(), &m); err != nil {
		t.Fatal(err)
	}
	edit(&m)
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	file.Manifest = body
	file.ManifestCrc32C = crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli))
	opts := proto.MarshalOptions{Deterministic: true}
	if b, err = opts.Marshal(&file); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// biggest is the index of the manifest's largest buffer (several chunks).
func biggest(m *imagepb.Manifest) int {
	best := 0
	for i, b := range m.GetBuffers() {
		if b.GetSize() > m.GetBuffers()[best].GetSize() {
			best = i
		}
	}
	return best
}

func TestRestoreRefusesMismatchedImage(t *testing.T) {
	needTool(t, "criu")
	cases := []struct {
		name string
		edit func(m *imagepb.Manifest)
		want string // in gpucr restore's error
		// refused before CRIU restores anything (the image alone is wrong),
		// else the restored process is stopped when it comes back.
		early bool
	}{
		{"buffer moved", func(m *imagepb.Manifest) { m.Buffers[biggest(m)].Address += 1 << 40 }, "does not match the process", false},
		{"buffer shrunk", func(m *imagepb.Manifest) {
			b := m.Buffers[biggest(m)]
			last := b.Chunks[len(b.Chunks)-1]
			b.Size -= uint64(last.GetSize())
			b.Chunks = b.Chunks[:len(b.Chunks)-1]
		}, "does not match the process", false},
		{"buffer dropped", func(m *imagepb.Manifest) {
			i := biggest(m)
			m.Buffers = append(m.Buffers[:i], m.Buffers[i+1:]...)
		}, "does not match the process", false},
		{"buffer of an impossible pid", func(m *imagepb.Manifest) { m.Buffers[biggest(m)].Pid = 1 << 30 }, "not a process of the image", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			env := gpucrEnv(t)
			h := startHelper(t, dir, env)
			img := filepath.Join(dir, "img")
			a := startUnder(t, dir, h, env, "heartbeat", "--mib", "24", "--buffers", "3", "--interval-ms", "10")
			a.waitIter(15, time.Minute)
			cliOK(t, h, env, img, "checkpoint", strconv.Itoa(a.pid), "-D", img)
			a.reap(30 * time.Second)
			waitPidFree(a.pid, 10*time.Second)
			waitNoClients(t, h, 10*time.Second)
			resealManifest(t, img, tc.edit)
			if out, err := runErr(time.Minute, nil, binPath(t, "gpucr"), "image", "verify", img); tc.early && err == nil {
				t.Errorf("gpucr image verify accepted the manifest:\n%s", out)
			}

			start := time.Now()
			out, err := cli(t, h, env, "restore", "-D", img)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("gpucr restore of a mismatched image: %v (want a failure naming %q)\n%s", err, tc.want, out)
			}
			if took := time.Since(start); took > 30*time.Second {
				t.Errorf("the refusal took %v", took)
			}
			// Nothing is left frozen: the process is gone (never restored,
			// or stopped when it came back) and the helper holds nothing.
			waitDead(t, a.pid, 10*time.Second)
			waitNoClients(t, h, 10*time.Second)
			if tc.early {
				b, _ := os.ReadFile(filepath.Join(img, "restore.log"))
				if strings.Contains(string(b), "Forking task") {
					t.Errorf("CRIU forked tasks although the image was refused first")
				}
				// The reason is in CRIU's own log too, for whoever reads only that.
				if !strings.Contains(string(b), tc.want) {
					t.Errorf("restore.log does not say why the restore was refused (%q):\n%s", tc.want, tail(string(b), 10))
				}
			} else if !strings.Contains(a.output(), "GPU state is lost") {
				t.Errorf("the restored process did not say why it stopped:\n%s", tail(a.output(), 5))
			}
			if hl, _ := os.ReadFile(h.log); !strings.Contains(string(hl), tc.want) {
				t.Errorf("the helper did not log the refusal (%q):\n%s", tc.want, tail(string(hl), 10))
			}
		})
	}
}
