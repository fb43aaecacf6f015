package intercept_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testroot"
)

// The layers hold for calls as well as includes (intercept/README.md): a
// source file of intercept/src uses only what its own layer and the layers
// below define, and no files use each other in a loop, within a layer or
// across. A header declares what a layer offers; these checks look at who
// uses it, by the names each .c file defines at file scope (functions and
// variables that are not static) and the names every other .c file writes.

var (
	identifier = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	// a line at column 0 that may begin a definition at file scope
	topLevelName = regexp.MustCompile(`(?m)^[A-Za-z_][^\n;{}=#]*?\b([A-Za-z_][A-Za-z0-9_]*)[ \t]*(\(|=|;|\[)`)
)

// blankLiterals blanks the insides of string and character literals (after
// stripComments), so that a name inside a message is no use of it.
func blankLiterals(src string) string {
	b := []byte(src)
	for i := 0; i < len(b); i++ {
		if b[i] != '"' && b[i] != '\'' {
			continue
		}
		q := b[i]
		for i++; i < len(b) && b[i] != q && b[i] != '\n'; i++ {
			if b[i] == '\\' && i+1 < len(b) {
				b[i] = ' '
				i++
			}
			b[i] = ' '
		}
	}
	return string(b)
}

// closeParen is the index just past the parenthesis that closes the one at
// src[open], or -1.
func closeParen(src string, open int) int {
	depth := 0
	for i := open; i < len(src); i++ {
		switch src[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

var attribute = regexp.MustCompile(`^\s*(__attribute__\s*\(\(.*?\)\)\s*)*`)

// fileScopeDefinitions lists the names a C source (comments and literals
// blanked) defines at file scope for other files: functions with a body and
// variables, neither static nor extern nor a typedef.
func fileScopeDefinitions(src string) []string {
	var out []string
	for _, m := range topLevelName.FindAllStringSubmatchIndex(src, -1) {
		head := src[m[0]:m[2]]
		words := identifier.FindAllString(head, -1)
		if slices.ContainsFunc(words, func(w string) bool {
			return w == "static" || w == "extern" || w == "typedef" || w == "return"
		}) || len(words) == 0 {
			continue // not for other files, or no definition
		}
		name := src[m[2]:m[3]]
		if src[m[4]:m[5]] == "(" {
			end := closeParen(src, m[4])
			if end < 0 {
				continue
			}
			rest := src[end:]
			rest = rest[len(attribute.FindString(rest)):]
			if !strings.HasPrefix(rest, "{") {
				continue // a declaration
			}
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// checkCalls returns what breaks the layering of the .c files of dir (name
// -> source) by use: a file using a name a higher layer's file defines, and
// files that use each other in a loop. A name in apiNames is the driver's:
// the wrappers of layer 8 are defined under the names the driver API
// declares, and every other use of such a name (GC_REAL(cuMemRelease), a
// __typeof__) means the driver, not the wrapper.
func checkCalls(dir string, sources map[string]string, apiNames map[string]bool) []string {
	definedBy := map[string]string{}
	names := make([]string, 0, len(sources))
	clean := map[string]string{}
	for name, src := range sources {
		names = append(names, name)
		clean[name] = blankLiterals(stripComments(src))
	}
	sort.Strings(names)
	var bad []string
	for _, name := range names {
		for _, def := range fileScopeDefinitions(clean[name]) {
			if apiNames[def] {
				continue
			}
			if other, ok := definedBy[def]; ok {
				bad = append(bad, fmt.Sprintf("%s/%s and %s/%s both define %s", dir, other, dir, name, def))
				continue
			}
			definedBy[def] = name
		}
	}
	edges := map[string][]string{}
	uses := map[[2]string][]string{} // from, to: the names
	for _, name := range names {
		seen := map[string]bool{}
		for _, id := range identifier.FindAllString(clean[name], -1) {
			to, ok := definedBy[id]
			if !ok || to == name || seen[id] {
				continue
			}
			seen[id] = true
			k := [2]string{name, to}
			if len(uses[k]) == 0 {
				edges[name] = append(edges[name], to)
			}
			uses[k] = append(uses[k], id)
		}
		sort.Strings(edges[name])
	}
	for _, from := range names {
		lf := layerOf(from)
		for _, to := range edges[from] {
			if lt := layerOf(to); lf >= 0 && lt > lf {
				bad = append(bad, fmt.Sprintf("%s/%s (layer %d) uses %s of %s (layer %d above it)",
					dir, from, lf, strings.Join(uses[[2]string{from, to}], ", "), to, lt))
			}
		}
	}
	for _, loop := range cycles(names, edges) {
		var ties []string
		for j := 0; j+1 < len(loop); j++ {
			ties = append(ties, fmt.Sprintf("%s -> %s (%s)", loop[j], loop[j+1], strings.Join(uses[[2]string{loop[j], loop[j+1]}], ", ")))
		}
		bad = append(bad, fmt.Sprintf("call loop in %s: %s", dir, strings.Join(ties, "; ")))
	}
	return bad
}

// readSources returns the text of every .c file of dir (relative to root).
func readSources(t *testing.T, root, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, dir))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".c") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

// TestCallLayers: no file of the interposer uses a higher layer's names,
// and none use each other in a loop.
func TestCallLayers(t *testing.T) {
	root := testroot.Dir(t)
	srcs := readSources(t, root, "intercept/src")
	if len(srcs) == 0 {
		t.Fatal("no C files in intercept/src")
	}
	api, err := os.ReadFile(filepath.Join(root, "include", "gpucr", "cudadrv.h"))
	if err != nil {
		t.Fatal(err)
	}
	apiNames := map[string]bool{}
	for _, id := range identifier.FindAllString(stripComments(string(api)), -1) {
		apiNames[id] = true
	}
	if !apiNames["cuMemRelease"] {
		t.Fatal("cudadrv.h as read declares no cuMemRelease")
	}
	// the check sees the uses it is for: the wrappers use the gate
	defs := fileScopeDefinitions(blankLiterals(stripComments(srcs["1_gate.c"])))
	if !slices.Contains(defs, "gc_gate_enter") {
		t.Fatalf("1_gate.c's definitions as read: %q, without gc_gate_enter", defs)
	}
	for _, p := range checkCalls("intercept/src", srcs, apiNames) {
		t.Error(p)
	}
}

// TestCallChecksFail: the call checks find what they are for.
func TestCallChecksFail(t *testing.T) {
	good := map[string]string{
		"1_log.c":  "/* gc_gate_enter() is named in a comment */\nint gc_log_debug;\nvoid gc_warn(const char *f, ...) { (void)f; }\n",
		"1_gate.c": "static int closed;\nint gc_gate_enter(void) {\n    gc_warn(\"gc_sync_hold\");\n    return closed;\n}\nvoid gc_gate_leave(void);\n",
		"1_sync.c": "unsigned long gc_sync_hold(void)\n    __attribute__((unused)) {\n    return (unsigned long)gc_gate_enter() + gc_log_debug;\n}\n",
		"2_link.c": "int gc_link(void) { return gc_gate_enter(); }\n",
		// a wrapper under the driver's name, and the driver's function named below it
		"8_wrap.c": "CUresult cuMemFree(CUdeviceptr p) { return gc_link() + (int)p; }\n",
		"3_mem.c":  "void gc_mem_drop(void) { GC_REAL(cuMemFree)(0); }\n",
	}
	api := map[string]bool{"cuMemFree": true, "CUresult": true, "CUdeviceptr": true}
	if bad := checkCalls("intercept/src", good, api); len(bad) != 0 {
		t.Fatalf("a good layering fails: %q", bad)
	}
	with := func(name, src string) map[string]string {
		m := map[string]string{}
		for k, v := range good {
			m[k] = v
		}
		m[name] += src
		return m
	}
	for _, c := range []struct {
		what  string
		files map[string]string
		want  string
	}{
		{"a lower layer using a higher one", with("1_sync.c", "void gc_x(void) { gc_link(); }\n"),
			"1_sync.c (layer 1) uses gc_link of 2_link.c (layer 2 above it)"},
		{"a loop within a layer", with("1_gate.c", "void gc_y(void) { gc_sync_hold(); }\n"),
			"call loop in intercept/src: 1_gate.c -> 1_sync.c (gc_sync_hold); 1_sync.c -> 1_gate.c (gc_gate_enter)"},
		{"a loop through a variable", with("1_log.c", "void gc_z(void) { (void)gc_sync_hold; }\n"), "call loop"},
		{"one name defined twice", with("2_link.c", "int gc_log_debug = 1;\n"), "both define gc_log_debug"},
	} {
		bad := checkCalls("intercept/src", c.files, api)
		if !strings.Contains(strings.Join(bad, "\n"), c.want) {
			t.Errorf("%s: got %q, want a problem with %q", c.what, bad, c.want)
		}
	}
}
