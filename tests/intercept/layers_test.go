package intercept_test

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testroot"
)

// The interposer is built in layers (intercept/README.md): the number a
// file's name in intercept/src starts with is its layer, and a file includes
// only headers of its own layer and the layers below, with no include cycle.
// The CRIU plugin shares protocol/c with it, never a file of intercept/src.

var (
	layerName     = regexp.MustCompile(`^([0-9]+)_[a-z0-9_]+\.[ch]$`)
	quotedInclude = regexp.MustCompile(`(?m)^[ \t]*#[ \t]*include[ \t]*"([^"]+)"`)
)

// includeDirs are where the build (-I) finds a quoted include that is not
// beside the file: the driver API header and protocol/c.
var includeDirs = []string{"include", "protocol/c"}

// stripComments blanks C comments, keeping string and character literals
// and line breaks, so that a commented-out #include does not count.
func stripComments(src string) string {
	var b strings.Builder
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			end := strings.Index(src[i+2:], "*/")
			if end < 0 {
				end = len(src) - i - 2
			}
			b.WriteString(strings.Map(func(r rune) rune {
				if r == '\n' {
					return r
				}
				return ' '
			}, src[i:min(len(src), i+2+end+2)]))
			i += 2 + end + 1
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			for i < len(src) && src[i] != '\n' {
				i++
			}
			if i < len(src) {
				b.WriteByte('\n')
			}
		case c == '"' || c == '\'':
			b.WriteByte(c)
			for i++; i < len(src) && src[i] != c && src[i] != '\n'; i++ {
				b.WriteByte(src[i])
				if src[i] == '\\' && i+1 < len(src) {
					i++
					b.WriteByte(src[i])
				}
			}
			if i < len(src) {
				b.WriteByte(src[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func quotedIncludes(src string) []string {
	var out []string
	for _, m := range quotedInclude.FindAllStringSubmatch(stripComments(src), -1) {
		out = append(out, m[1])
	}
	return out
}

// readIncludes returns the quoted includes of every .c and .h file in dir (relative to root).
func readIncludes(t *testing.T, root, dir string) map[string][]string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, dir))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]string{}
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".c") || strings.HasSuffix(e.Name(), ".h")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = quotedIncludes(string(b))
	}
	return files
}

// layerOf is the layer a file of intercept/src names, or -1.
func layerOf(name string) int {
	m := layerName.FindStringSubmatch(name)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// resolve says which file an include of a file in dir means, as the
// compiler looks for it: beside the file, then in the include directories
// (exists reports whether a path relative to the repository is a file).
// "" if none.
func resolve(dir, inc string, inDir map[string]bool, exists func(string) bool) string {
	p := path.Join(dir, inc)
	if path.Dir(p) == dir && inDir[path.Base(p)] || exists(p) {
		return p
	}
	for _, d := range includeDirs {
		if p := path.Join(d, inc); exists(p) {
			return p
		}
	}
	return ""
}

func inIncludeDirs(p string) bool {
	for _, d := range includeDirs {
		if strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// checkLayers returns what breaks the layering of the files of dir (name ->
// quoted includes): a file that names no layer, an include of a higher
// layer's file, an include from elsewhere than dir and the include
// directories, an include cycle.
func checkLayers(dir string, files map[string][]string, exists func(string) bool) []string {
	var bad []string
	inDir := map[string]bool{}
	for name := range files {
		inDir[name] = true
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	edges := map[string][]string{}
	for _, name := range names {
		l := layerOf(name)
		if l < 0 {
			bad = append(bad, fmt.Sprintf("%s/%s names no layer (N_name.c or N_name.h, N its layer)", dir, name))
		}
		for _, inc := range files[name] {
			p := resolve(dir, inc, inDir, exists)
			switch {
			case p == "" || path.Dir(p) != dir && !inIncludeDirs(p):
				bad = append(bad, fmt.Sprintf("%s/%s includes %q, which is neither in %s nor in %s",
					dir, name, inc, dir, strings.Join(includeDirs, " or ")))
			case path.Dir(p) == dir:
				to := path.Base(p)
				edges[name] = append(edges[name], to)
				if lt := layerOf(to); l >= 0 && lt > l {
					bad = append(bad, fmt.Sprintf("%s/%s (layer %d) includes %s of layer %d above it", dir, name, l, to, lt))
				}
			}
		}
	}
	// Include cycles (only possible within a layer once the layers hold).
	for _, loop := range cycles(names, edges) {
		bad = append(bad, fmt.Sprintf("include cycle in %s: %s", dir, strings.Join(loop, " -> ")))
	}
	return bad
}

// cycles returns every loop a depth-first walk of edges meets, starting
// from names in order: each as the files in it, the first one again at its
// end (a -> b -> a).
func cycles(names []string, edges map[string][]string) [][]string {
	const (
		unseen = iota
		open
		done
	)
	var out [][]string
	state := map[string]int{}
	var stack []string
	var visit func(n string)
	visit = func(n string) {
		state[n] = open
		stack = append(stack, n)
		for _, m := range edges[n] {
			switch state[m] {
			case open:
				i := len(stack) - 1
				for stack[i] != m {
					i--
				}
				out = append(out, append(append([]string{}, stack[i:]...), m))
			case unseen:
				visit(m)
			}
		}
		stack = stack[:len(stack)-1]
		state[n] = done
	}
	for _, name := range names {
		if state[name] == unseen {
			visit(name)
		}
	}
	return out
}

// checkPlugin returns the includes of the plugin's files (dir: name ->
// quoted includes) that reach intercept/src: by path, or by the name of one
// of its files (found there through an -I).
func checkPlugin(dir string, files map[string][]string, interceptSrc map[string][]string) []string {
	var bad []string
	for name, incs := range files {
		for _, inc := range incs {
			p := path.Join(dir, inc)
			if strings.Contains(p, "intercept/") || interceptSrc[path.Base(inc)] != nil {
				bad = append(bad, fmt.Sprintf("%s/%s includes %q, a file of the interposer's intercept/src", dir, name, inc))
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// checkPluginBuild returns the Makefile lines of the plugin's build that
// name intercept/src: its sources, and the recipe of $(PLUGIN).
func checkPluginBuild(makefile string) []string {
	var bad []string
	inRecipe := false
	for i, line := range strings.Split(makefile, "\n") {
		switch {
		case strings.HasPrefix(line, "$(PLUGIN):"):
			inRecipe = true
		case inRecipe && !strings.HasPrefix(line, "\t"):
			inRecipe = false
		}
		if (inRecipe || strings.HasPrefix(line, "PLUGIN_SRC") || strings.HasPrefix(line, "$(PLUGIN):")) &&
			strings.Contains(line, "intercept/src") {
			bad = append(bad, fmt.Sprintf("Makefile:%d builds intercept/src into the plugin: %s", i+1, strings.TrimSpace(line)))
		}
	}
	return bad
}

func TestLayers(t *testing.T) {
	root := testroot.Dir(t)
	exists := func(p string) bool {
		st, err := os.Stat(filepath.Join(root, filepath.FromSlash(p)))
		return err == nil && !st.IsDir()
	}
	src := readIncludes(t, root, "intercept/src")
	if len(src) == 0 {
		t.Fatal("no C files in intercept/src")
	}
	for _, p := range checkLayers("intercept/src", src, exists) {
		t.Error(p)
	}
	for _, p := range checkPlugin("criuplugin", readIncludes(t, root, "criuplugin"), src) {
		t.Error(p)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkPluginBuild(string(mk)) {
		t.Error(p)
	}
}

// TestLayerChecksFail: the checks above find what they are for.
func TestLayerChecksFail(t *testing.T) {
	have := map[string]bool{"include/gpucr/cudadrv.h": true, "protocol/c/wire.h": true, "criuplugin/plugin.h": true}
	exists := func(p string) bool { return have[p] }
	dir := "intercept/src"
	good := map[string][]string{
		"1_base.h":   {"gpucr/cudadrv.h"},
		"1_log.c":    {"1_base.h"},
		"1_other.h":  {"1_base.h"},
		"1_other2.h": {"1_other.h"},
		"2_link.h":   {"1_base.h"},
		"2_link.c":   {"1_base.h", "2_link.h", "wire.h"},
		"3_alloc.h":  {"1_base.h"},
		"3_alloc.c":  {"2_link.h", "3_alloc.h"},
		"4_wraps.c":  {"3_alloc.h", "2_link.h"},
	}
	if bad := checkLayers(dir, good, exists); len(bad) != 0 {
		t.Fatalf("a good layering fails: %q", bad)
	}
	with := func(name string, incs ...string) map[string][]string {
		m := map[string][]string{}
		for k, v := range good {
			m[k] = v
		}
		m[name] = append(append([]string(nil), m[name]...), incs...)
		return m
	}
	for _, c := range []struct {
		what  string
		files map[string][]string
		want  string
	}{
		{"a lower layer including a higher one", with("2_link.c", "3_alloc.h"), "layer 2) includes 3_alloc.h of layer 3"},
		{"a cycle within a layer", with("1_base.h", "1_other2.h"), "include cycle"},
		{"a file naming no layer", with("alloc.c", "1_base.h"), "names no layer"},
		{"an include found nowhere", with("1_log.c", "nowhere.h"), "neither in"},
		{"an include from elsewhere", with("1_log.c", "../../criuplugin/plugin.h"), "neither in"},
	} {
		bad := checkLayers(dir, c.files, exists)
		if !strings.Contains(strings.Join(bad, "\n"), c.want) {
			t.Errorf("%s: got %q, want a problem with %q", c.what, bad, c.want)
		}
	}
	plugin := map[string][]string{"gpucr_plugin.c": {"wire.h"}}
	if bad := checkPlugin("criuplugin", plugin, good); len(bad) != 0 {
		t.Errorf("the plugin including protocol/c fails: %q", bad)
	}
	for _, inc := range []string{"2_link.h", "../intercept/src/2_link.h"} {
		plugin := map[string][]string{"gpucr_plugin.c": {"wire.h", inc}}
		if bad := checkPlugin("criuplugin", plugin, good); len(bad) != 1 {
			t.Errorf("the plugin including %s: %q, want one problem", inc, bad)
		}
	}
	mk := "PLUGIN_SRC   := criuplugin/gpucr_plugin.c $(PROTO_C_SRC)\n$(PLUGIN): $(PLUGIN_SRC) Makefile\n\t$(CC) -Iprotocol/c -o $@\n\nother: intercept/src/x.c\n"
	if bad := checkPluginBuild(mk); len(bad) != 0 {
		t.Errorf("a plugin build without intercept/src fails: %q", bad)
	}
	if bad := checkPluginBuild(strings.Replace(mk, "-Iprotocol/c", "-Iprotocol/c -Iintercept/src", 1)); len(bad) != 1 {
		t.Errorf("a plugin build with -Iintercept/src: %q, want one problem", bad)
	}
	if bad := checkPluginBuild(strings.Replace(mk, "$(PROTO_C_SRC)", "intercept/src/wire.c", 1)); len(bad) != 1 {
		t.Errorf("plugin sources from intercept/src: %q, want one problem", bad)
	}
	if got := quotedIncludes("/* #include \"3_alloc.h\" */\n// #include \"4_x.h\"\n#include \"1_base.h\"\n  #  include \"2_link.h\"\n#include <stdio.h>\n"); strings.Join(got, ",") != "1_base.h,2_link.h" {
		t.Errorf("includes parsed: %q", got)
	}
}
