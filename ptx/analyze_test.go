package ptx

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testroot"
)

// writes is "name:RW" per parameter, for compact comparisons: R reads, W
// writes, - neither.
func writes(e Entry) string {
	var parts []string
	for _, p := range e.Params {
		f := "-"
		switch {
		case p.Writes:
			f = "W"
		case p.Reads:
			f = "R"
		}
		parts = append(parts, p.Name+":"+f)
	}
	return strings.Join(parts, " ")
}

func entry(t *testing.T, m *Module, name string) Entry {
	t.Helper()
	for _, e := range m.Entries {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("no entry %s in %+v", name, m.Entries)
	return Entry{}
}

// gpucr's own kernels: the hash reads its table and the chunks it names
// (pointers loaded from memory: reads only) and writes only out.
func TestAnalyzeOwnKernels(t *testing.T) {
	m, err := Analyze(Kernels)
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != "7.0" || m.Target != "sm_70" || len(m.Entries) != 2 {
		t.Fatalf("module %+v", m)
	}
	for name, want := range map[string]string{
		ChunkHashKernel: "gpucr_chunk_hash_table:R gpucr_chunk_hash_count:- gpucr_chunk_hash_out:W",
		CompareKernel:   "gpucr_compare_a:R gpucr_compare_b:R gpucr_compare_n:- gpucr_compare_out:W",
	} {
		e := entry(t, m, name)
		if got := writes(e); got != want || len(e.Undecided) != 0 {
			t.Errorf("%s: %s undecided %q, want %s", name, got, e.Undecided, want)
		}
		if e.Params[0].Size != 8 || e.Params[0].Type != ".u64" {
			t.Errorf("%s: first parameter %+v", name, e.Params[0])
		}
	}
}

// cString is the concatenation of the C string literals from the first
// `ptx[] =` of a test application's source (or the heartbeat's shared
// `gpuapp_hb_ptx[] =`, tests/apps/common/hbptx.c) to its `;`.
func cString(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	start := strings.Index(src, "static const char ptx[] =")
	if start < 0 {
		start = strings.Index(src, "const char gpuapp_hb_ptx[] =")
	}
	if start < 0 {
		t.Fatalf("%s: no ptx[]", file)
	}
	var out strings.Builder
	for i := start; i < len(src); i++ {
		switch src[i] {
		case ';':
			return out.String()
		case '/':
			if i+1 < len(src) && src[i+1] == '*' {
				i += strings.Index(src[i:], "*/") + 1
			}
		case '"':
			j := i + 1
			for src[j] != '"' {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			s, err := strconv.Unquote(src[i : j+1])
			if err != nil {
				t.Fatalf("%s: literal %s: %v", file, src[i:j+1], err)
			}
			out.WriteString(s)
			i = j
		}
	}
	t.Fatalf("%s: unterminated ptx[]", file)
	return ""
}

// appSource is the file that holds a test application's PTX.
func appSource(root, app string) string {
	if app == "heartbeat" {
		return filepath.Join(root, "tests/apps/common/hbptx.c")
	}
	return filepath.Join(root, "tests/apps", app+".c")
}

// The test applications' kernels: plain buffers are written through their
// parameter; ptrchase writes through pointers it loads from a table in
// device memory, which the analysis cannot follow and says so.
func TestAnalyzeTestApplications(t *testing.T) {
	root := testroot.Dir(t)
	for _, tc := range []struct {
		app, entry, want string
		undecided        bool
	}{
		{"heartbeat", "app_hb_init", "app_hb_init_param_0:W app_hb_init_param_1:- app_hb_init_param_2:-", false},
		{"heartbeat", "app_hb_step", "app_hb_step_param_0:W app_hb_step_param_1:- app_hb_step_param_2:- app_hb_step_param_3:-", false},
		{"ptrchase", "app_pc_init", "app_pc_init_param_0:R app_pc_init_param_1:- app_pc_init_param_2:-", true},
		{"ptrchase", "app_pc_step", "app_pc_step_param_0:R app_pc_step_param_1:- app_pc_step_param_2:-", true},
	} {
		m, err := Analyze(cString(t, appSource(root, tc.app)))
		if err != nil {
			t.Fatalf("%s: %v", tc.app, err)
		}
		e := entry(t, m, tc.entry)
		if got := writes(e); got != tc.want || (len(e.Undecided) > 0) != tc.undecided {
			t.Errorf("%s %s: %s undecided %q, want %s (undecided %v)", tc.app, tc.entry, got, e.Undecided, tc.want, tc.undecided)
		}
		// ptrchase also reads through the pointers it loads: an on-demand
		// restore must hold its launches for everything.
		if (len(e.ReadsUndecided) > 0) != (tc.app == "ptrchase" && tc.entry == "app_pc_step") {
			t.Errorf("%s %s: reads undecided %q", tc.app, tc.entry, e.ReadsUndecided)
		}
	}
}

// One rule each.
func TestAnalyzeRules(t *testing.T) {
	const head = ".version 8.0\n.target sm_90\n.address_size 64\n"
	for _, tc := range []struct {
		name, body string
		params     string // parameter declarations
		want       string
		undecided  string // a part of the one reason expected; "" for none
	}{
		{"store through one of two", `
	ld.param.u64 %rd1, [a];
	ld.param.u64 %rd2, [b];
	cvta.to.global.u64 %rd1, %rd1;
	ld.global.u32 %r1, [%rd2];
	st.global.u32 [%rd1+4], %r1;`, ".param .u64 a, .param .u64 b", "a:W b:R", ""},
		{"atomic and reduction, generic space", `
	ld.param.u64 %rd1, [a];
	ld.param.u64 %rd2, [b];
	atom.add.u32 %r1, [%rd1], 1;
	red.global.max.u32 [%rd2+8], %r1;`, ".param .u64 a, .param .u64 b", "a:W b:W", ""},
		{"shared and local stores are not global", `
	.shared .align 4 .b32 s[32];
	ld.param.u64 %rd1, [a];
	mov.u64 %rd2, s;
	st.shared.u32 [%rd2], 1;
	st.local.u32 [%rd1], 1;
	ld.global.u32 %r1, [%rd1];`, ".param .u64 a", "a:R", ""},
		{"a pointer carried around a loop", `
	ld.param.u64 %rd1, [a];
	ld.param.u32 %r9, [n];
$L:
	st.global.u8 [%rd3], 0;
	mov.u64 %rd3, %rd2;
	add.u64 %rd2, %rd1, 1;
	@%p1 bra $L;`, ".param .u64 a, .param .u32 n", "a:W n:-", ""},
		{"an index parameter makes no pointer", `
	ld.param.u64 %rd1, [a];
	ld.param.u32 %r1, [i];
	mul.wide.u32 %rd2, %r1, 4;
	add.u64 %rd3, %rd1, %rd2;
	@!%p2 st.global.u32 [%rd3], %r1;`, ".param .u64 a, .param .u32 i", "a:W i:-", ""},
		{"a 64-bit index, scaled", `
	ld.param.u64 %rd1, [a];
	ld.param.u64 %rd4, [i];
	shl.b64 %rd2, %rd4, 2;
	mad.lo.u64 %rd3, %rd4, 8, %rd1;
	add.u64 %rd5, %rd1, %rd2;
	st.global.u32 [%rd3], 1;
	st.global.u32 [%rd5], 1;`, ".param .u64 a, .param .u64 i", "a:W i:-", ""},
		{"a parameter's address", `
	mov.u64 %rd1, s;
	ld.param.u64 %rd2, [%rd1+8];
	st.global.v2.u32 [%rd2], {%r1, %r2};`, ".param .align 8 .b8 s[16]", "s:W", ""},
		{"a pointer loaded from memory", `
	ld.param.u64 %rd1, [tab];
	ld.global.u64 %rd2, [%rd1];
	st.global.u32 [%rd2], 7;`, ".param .u64 tab", "tab:R", "loaded from memory"},
		{"a call", `
	ld.param.u64 %rd1, [a];
	call.uni f, (%rd1);`, ".param .u64 a", "a:-", "call"},
		{"a surface store", `
	sust.b.1d.b32.trap [s, {%r1}], {%r2};`, ".param .u64 s", "s:-", "surface"},
		{"a bulk copy from shared to global", `
	ld.param.u64 %rd1, [a];
	cp.async.bulk.global.shared::cta.bulk_group [%rd1], [%rd2], 256;`, ".param .u64 a", "a:W", ""},
	} {
		text := head + ".visible .entry k(" + tc.params + ")\n{\n" + tc.body + "\n\tret;\n}\n"
		m, err := Analyze(text)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		e := m.Entries[0]
		if got := writes(e); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
		switch {
		case tc.undecided == "" && len(e.Undecided) > 0:
			t.Errorf("%s: undecided %q", tc.name, e.Undecided)
		case tc.undecided != "" && (len(e.Undecided) != 1 || !strings.Contains(e.Undecided[0], tc.undecided)):
			t.Errorf("%s: undecided %q, want one about %q", tc.name, e.Undecided, tc.undecided)
		}
	}
	// Reads: what a restore that loads on demand needs of a kernel.
	for _, tc := range []struct {
		name, body, params string
		readsUndecided     string // a part of the one reason expected; "" for none
	}{
		{"reads through parameters only", `
	ld.param.u64 %rd1, [a];
	ld.param.u64 %rd2, [b];
	ld.global.u32 %r1, [%rd2];
	st.global.u32 [%rd1], %r1;`, ".param .u64 a, .param .u64 b", ""},
		{"a read through a pointer loaded from memory", `
	ld.param.u64 %rd1, [tab];
	ld.param.u64 %rd3, [out];
	ld.global.u64 %rd2, [%rd1];
	ld.global.u32 %r1, [%rd2];
	st.global.u32 [%rd3], %r1;`, ".param .u64 tab, .param .u64 out", "loaded from memory"},
		{"shared and const loads are not global", `
	.shared .align 8 .b64 s[4];
	ld.param.u64 %rd1, [a];
	ld.global.u64 %rd2, [%rd1];
	mov.u64 %rd4, s;
	st.shared.u64 [%rd4], %rd2;
	ld.shared.u64 %rd3, [%rd4];
	ld.shared.u32 %r1, [%rd3];`, ".param .u64 a", ""},
		{"an async copy from a loaded global address", `
	ld.param.u64 %rd1, [tab];
	ld.global.u64 %rd2, [%rd1];
	cp.async.ca.shared.global [%rd3], [%rd2], 16;`, ".param .u64 tab", "cp from a global address"},
		{"a texture read", `
	ld.param.u64 %rd1, [t];
	tex.1d.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1}];`, ".param .u64 t", "texture"},
		{"a call", `
	ld.param.u64 %rd1, [a];
	call.uni f, (%rd1);`, ".param .u64 a", "call"},
	} {
		text := head + ".visible .entry k(" + tc.params + ")\n{\n" + tc.body + "\n\tret;\n}\n"
		m, err := Analyze(text)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		e := m.Entries[0]
		switch {
		case tc.readsUndecided == "" && len(e.ReadsUndecided) > 0:
			t.Errorf("%s: reads undecided %q", tc.name, e.ReadsUndecided)
		case tc.readsUndecided != "" && (len(e.ReadsUndecided) != 1 || !strings.Contains(e.ReadsUndecided[0], tc.readsUndecided)):
			t.Errorf("%s: reads undecided %q, want one about %q", tc.name, e.ReadsUndecided, tc.readsUndecided)
		}
	}
	if _, err := Analyze("not ptx at all"); err == nil {
		t.Error("text without .version was taken for PTX")
	}
}
