package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/image"
)

// runCLIWith runs gpucr with stdin.
func runCLIWith(t *testing.T, stdin []byte, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	app := newApp(&o, &e)
	app.Reader = bytes.NewReader(stdin)
	code = ExitOK
	if err := app.Run(append([]string{"gpucr"}, args...)); err != nil {
		code = ExitFailure
		e.WriteString(err.Error())
	}
	return code, o.String(), e.String()
}

// `gpucr image receive` makes the directory, names it on its first line
// and fills it from stdin; a second part goes in with --into; `gpucr image
// discard` removes it only by that identity. A directory that holds
// something is refused, and a version answer lists the feature.
func TestImageReceiveDiscard(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "inventory.img"), []byte("inv"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src, "pre", "r"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "pre", "r", "c"), []byte("chunk"), 0o600); err != nil {
		t.Fatal(err)
	}
	stream := func(pre bool) []byte {
		var b bytes.Buffer
		if _, err := image.Send(&b, src, image.SendOptions{Only: func(rel string) bool { return strings.HasPrefix(rel, "pre") == pre }}); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	dst := filepath.Join(t.TempDir(), "-img") // a name like a flag, after "--"
	code, out, errOut := runCLIWith(t, stream(true), "image", "receive", "--", dst)
	if code != ExitOK {
		t.Fatalf("receive: %d %s %s", code, out, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var named receivedJSON
	var got image.ReceiveResult
	if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &named) != nil || json.Unmarshal([]byte(lines[1]), &got) != nil ||
		named.Dir != dst || !named.Made || named.ID == "" || got.Files != 1 || got.Dirs != 2 {
		t.Fatalf("receive printed %q", out)
	}
	if code, out, errOut := runCLIWith(t, stream(false), "image", "receive", "--into", named.ID, dst); code != ExitOK {
		t.Fatalf("receive --into: %d %s %s", code, out, errOut)
	}
	for _, f := range []string{"inventory.img", "pre/r/c"} {
		if _, err := os.Stat(filepath.Join(dst, f)); err != nil {
			t.Errorf("received: %v", err)
		}
	}
	if code, _, errOut := runCLIWith(t, stream(false), "image", "receive", dst); code == ExitOK || !strings.Contains(errOut, "is not empty") {
		t.Errorf("receive into a directory that holds an image: %d %s", code, errOut)
	}
	if code, _, errOut := runCLIWith(t, nil, "image", "discard", "--id", "1:2", dst); code == ExitOK ||
		!strings.Contains(errOut, "is not the directory the image was received into") {
		t.Errorf("discard of another identity: %d %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dst, "inventory.img")); err != nil {
		t.Fatalf("discard of another identity removed something: %v", err)
	}
	if code, out, errOut := runCLIWith(t, nil, "image", "discard", "--id", named.ID, "--", dst); code != ExitOK {
		t.Fatalf("discard: %d %s %s", code, out, errOut)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Errorf("%s stays after discard: %v", dst, err)
	}
	_, out, _ = runCLI(t, "version", "--json")
	var v map[string]string
	if json.Unmarshal([]byte(out), &v) != nil || !strings.Contains(v["features"], "image-receive") {
		t.Errorf("version --json: %q", out)
	}
}
