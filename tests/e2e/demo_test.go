package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testroot"
)

// TestDemoCleansUp: `make demo`'s script ends with "demo: OK", exit 0 and
// its work directory gone, also when removing that directory spans one of
// the helper's ticks. The helper touches helper.alive beside its socket
// every second, making it again if it is gone: the demo's rm -rf of its work
// directory while the helper ran failed 1 run in 10 ("Directory not empty",
// after "demo: OK"). Here rm lists and unlinks the directory's entries,
// waits past a tick, then removes the directory, as a slow rm -rf does.
func TestDemoCleansUp(t *testing.T) {
	needTool(t, "criu")
	bin := t.TempDir()
	slowRm := `#!/bin/bash
for a in "$@"; do
	case $a in
	/tmp/gpucr-demo.*)
		/bin/rm -rf "$a"/* "$a"/.[!.]* 2>/dev/null
		sleep 1.5
		exec rmdir "$a" ;;
	esac
done
exec /bin/rm "$@"
`
	if err := os.WriteFile(filepath.Join(bin, "rm"), []byte(slowRm), 0o755); err != nil {
		t.Fatal(err)
	}
	before, _ := filepath.Glob("/tmp/gpucr-demo.*")
	env := append(makeEnv(), "PATH="+bin+":"+os.Getenv("PATH"), "BUILD="+buildDir(t))
	out, err := runErr(3*time.Minute, env, "bash", filepath.Join(testroot.Dir(t), "scripts", "demo.sh"))
	if err != nil || !strings.Contains(out, "demo: OK") {
		t.Fatalf("demo: %v\n%s", err, tail(out, 20))
	}
	after, _ := filepath.Glob("/tmp/gpucr-demo.*")
	for _, d := range after {
		if !strings.Contains(strings.Join(before, "\n"), d) {
			t.Errorf("the demo left %s", d)
			_ = os.RemoveAll(d)
		}
	}
}
