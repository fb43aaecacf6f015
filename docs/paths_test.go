// Package docs holds the project's documents; its test keeps the paths
// they cite true.
package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testroot"
)

// citedPath is a path in backticks: folders and a name, perhaps followed by
// ":line" or ":function".
var citedPath = regexp.MustCompile("`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?)(?::[A-Za-z0-9_]+)?`")

// brokenPaths returns the paths a document (at rel) cites in backticks
// that name nothing: a path whose first folder is one of the repository's
// own top-level folders (top: tracked, not what a build makes) must exist
// from the top; another must exist beside the document if its first folder
// does (src/2_link.c in intercept/README.md). Paths of neither kind
// (DIR/gpucr, a CRIU source file, build/man) are not judged.
func brokenPaths(rel string, text string, top map[string]bool, exists func(string) bool) []string {
	var bad []string
	for _, m := range citedPath.FindAllStringSubmatch(text, -1) {
		p := strings.TrimSuffix(m[1], "/")
		first := strings.SplitN(p, "/", 2)[0]
		switch {
		case first == "." || first == "..":
		case top[first]:
			if !exists(p) {
				bad = append(bad, p)
			}
		case filepath.Dir(rel) != "." && exists(filepath.Join(filepath.Dir(rel), first)):
			if !exists(filepath.Join(filepath.Dir(rel), p)) {
				bad = append(bad, p)
			}
		}
	}
	return bad
}

// TestCitedPathsExist: every path a document of the repository cites is
// there: a file moved or removed takes its mentions with it.
func TestCitedPathsExist(t *testing.T) {
	root := testroot.Dir(t)
	out, err := exec.Command("git", "-C", root, "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	top := map[string]bool{}
	var docs []string
	for _, f := range strings.Fields(string(out)) {
		if first, _, ok := strings.Cut(f, "/"); ok {
			top[first] = true
		}
		if strings.HasSuffix(f, ".md") {
			docs = append(docs, f)
		}
	}
	exists := func(p string) bool {
		_, err := os.Stat(filepath.Join(root, p))
		return err == nil
	}
	if len(docs) < 5 || !top["helper"] {
		t.Fatalf("git ls-files lists %d documents", len(docs))
	}
	for _, rel := range docs {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range brokenPaths(rel, string(b), top, exists) {
			t.Errorf("%s cites %s, which is not in the repository", rel, p)
		}
	}
}

// TestBrokenPathsFound: the check finds a missing file, under the top and
// beside a document, and leaves alone what is no path of the repository.
func TestBrokenPathsFound(t *testing.T) {
	have := map[string]bool{"helper": true, "helper/cli": true, "helper/cli/app.go": true, "intercept": true,
		"intercept/src": true, "intercept/src/2_link.c": true}
	exists := func(p string) bool { return have[filepath.ToSlash(filepath.Clean(p))] }
	top := map[string]bool{"helper": true, "intercept": true}
	text := "`helper/cli/app.go` `helper/cli/app.go:12` `helper/cli/` `helper/cli/criudir.go` `src/2_link.c` `src/9_gone.c` `DIR/gpucr` `criu/cr-dump.c` `../lib/criu` `build/man`"
	got := strings.Join(brokenPaths("intercept/README.md", text, top, exists), " ")
	if got != "helper/cli/criudir.go src/9_gone.c" {
		t.Errorf("broken paths: %q, want the two missing files", got)
	}
}
