package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testroot"
)

// readmeWalkThrough is the README's hands-on block: the ```sh block after
// its "walk-through" comment, and the line of the README it starts on.
func readmeWalkThrough(t *testing.T, readme string) (block string, line int) {
	t.Helper()
	i := strings.Index(readme, "<!-- walk-through:")
	if i < 0 {
		t.Fatal("the README has no walk-through (a ```sh block after a <!-- walk-through: ... --> comment)")
	}
	rest := readme[i:]
	start := strings.Index(rest, "```sh\n")
	if start < 0 {
		t.Fatal("the README's walk-through comment is followed by no ```sh block")
	}
	body := rest[start+len("```sh\n"):]
	end := strings.Index(body, "```")
	if end < 0 {
		t.Fatal("the README's walk-through block does not end")
	}
	return body[:end], strings.Count(readme[:i+start], "\n") + 1
}

// TestReadmeFirstScreen: the README's first screen takes a newcomer from a
// fresh clone to a checkpoint and a restore: the two set-up commands come
// first (they came after 77% of its words), then a walk-through on the
// simulated driver, which this test runs as it is, in a plain root shell's
// environment, at the top of the repository: the process must be
// checkpointed, restored and compute on.
func TestReadmeFirstScreen(t *testing.T) {
	needTool(t, "criu")
	root := testroot.Dir(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	const screen = 50 // lines
	lineOf := func(s string) int {
		i := strings.Index(readme, s)
		if i < 0 {
			return -1
		}
		return strings.Count(readme[:i], "\n") + 1
	}
	for _, cmd := range []string{"make demo ", "make test "} {
		if l := lineOf("\n" + cmd); l < 0 || l > screen/2 {
			t.Errorf("README: %q as a command is on line %d, want it within the first %d lines", cmd, l, screen/2)
		}
	}
	block, at := readmeWalkThrough(t, readme)
	if end := at + strings.Count(block, "\n"); end > screen {
		t.Errorf("README: the walk-through ends on line %d, want it on the first screen (%d lines)", end, screen)
	}
	for _, want := range []string{"setsid gpucr run", "</dev/null", "gpucr checkpoint", "gpucr restore", "LD_LIBRARY_PATH=$PWD/build/sim"} {
		if !strings.Contains(block, want) {
			t.Errorf("README: the walk-through lacks %q:\n%s", want, block)
		}
	}
	if l := lineOf("--shell-job"); l < 0 || l > screen+10 {
		t.Errorf("README: --shell-job (for a process started from a shell) is first named on line %d", l)
	}

	// Run it as it is, where it says: the repository's top, after `make`.
	if _, err := os.Stat(filepath.Join(root, "build", "bin", "gpucr")); err != nil {
		t.Fatalf("the walk-through uses build/ at the repository's top: run `make` (%v)", err)
	}
	script := "set -e\ntrap 'kill $pid $helper 2>/dev/null; rm -rf \"$T\"' EXIT\n" + block
	env := []string{"HOME=" + t.TempDir(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=dumb"}
	cmd := func() (string, error) {
		return runErr(3*time.Minute, env, "bash", "-c", "cd "+strconv.Quote(root)+" && bash -s <<'WALK'\n"+script+"WALK\n")
	}
	out, err := cmd()
	if err != nil {
		t.Fatalf("the README's walk-through failed: %v\n%s", err, out)
	}
	pid := regexp.MustCompile(`checkpoint (\d+): done in`).FindStringSubmatch(out)
	if pid == nil || !strings.Contains(out, "restore: pid "+pid[1]+" running again") {
		t.Fatalf("the walk-through did not checkpoint and restore the process:\n%s", out)
	}
	// the heartbeat before the checkpoint, and the two after the restore
	var iters []int
	for _, m := range regexp.MustCompile(`(?m)^hb (\d+) [0-9a-f]{16}`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		iters = append(iters, n)
	}
	if len(iters) != 3 || iters[1] <= iters[0] || iters[2] <= iters[1] {
		t.Errorf("the walk-through's heartbeats %v: want one before the checkpoint and two later ones after the restore:\n%s", iters, out)
	}
}
