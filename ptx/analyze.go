package ptx

import (
	"fmt"
	"sort"
	"strings"
)

// Entry is one kernel (.entry) of a PTX module, as far as gpucr needs it:
// its parameters and, per parameter, whether the kernel may write global
// memory through a pointer derived from it. A checkpoint that runs while the
// application computes needs exactly that: the buffers a running kernel may
// change.
type Entry struct {
	Name   string
	Params []Param
	// Undecided lists why the analysis cannot say that the parameters
	// marked are the only ways the kernel writes memory (a store through a
	// pointer it loaded from memory, a call, a surface store, ...). Empty:
	// every global write goes through a parameter with Writes set.
	Undecided []string
	// ReadsUndecided lists why the analysis cannot say that the kernel
	// reads global memory only through its parameters (a load through a
	// pointer it loaded from memory, a texture or surface read, a call).
	// Empty, with Undecided empty too: every global access, read or write,
	// goes through a parameter with Reads or Writes set, which is what a
	// restore that loads memory on demand needs to hold a launch only for
	// the buffers its parameters point into.
	ReadsUndecided []string
}

// Param is one kernel parameter.
type Param struct {
	Name string
	Type string // the PTX type, e.g. ".u64"
	Size int    // bytes (arrays: all elements)
	// Writes: some store, atomic or reduction to global (or generic) memory
	// has an address derived from this parameter. Reads: some load does.
	Writes, Reads bool
}

// Module is the entries of a PTX text, in order.
type Module struct {
	Version, Target string
	Entries         []Entry
}

// Analyze parses PTX text and, for each entry, finds the parameters the
// kernel may write through.
//
// The analysis follows values, not control: every instruction is taken to
// run (predicates and branches are ignored), and a register's provenance is
// the union over every instruction that writes it, iterated to a fixed
// point. A value derived from a parameter (ld.param, then additions, logic,
// conversions, mov, cvta, selp, min/max or a mad's addend with it as an
// operand) carries that parameter; products, shifts and quotients carry
// nothing (they scale an index: a pointer is not multiplied), and neither
// does a parameter narrower than 8 bytes (an index or a size, not a 64-bit
// pointer). A value loaded from global, generic, const or local memory
// carries "memory" (a pointer the kernel read, e.g. from a table of
// pointers). A st, atom or red whose state space is global or generic (or
// cp.async.bulk to global) writes through whatever its address carries; a
// write through a "memory" value is undecided, since the pointer may point
// into any buffer. Stores to shared and local memory are ignored. Calls to
// functions and surface stores make the entry undecided too (the callee or
// the surface is not followed). It is conservative in one direction only:
// a parameter it does not mark is not written through by any instruction
// of the entry's own body, unless the entry is undecided.
func Analyze(text string) (*Module, error) {
	toks, err := tokenize(text)
	if err != nil {
		return nil, err
	}
	m := &Module{}
	for i := 0; i < len(toks); i++ {
		switch toks[i] {
		case ".version":
			if i+1 < len(toks) {
				m.Version = toks[i+1]
			}
		case ".target":
			if i+1 < len(toks) {
				m.Target = toks[i+1]
			}
		case ".entry":
			e, next, err := parseEntry(toks, i+1)
			if err != nil {
				return nil, err
			}
			m.Entries = append(m.Entries, *e)
			i = next - 1
		case "{":
			// a .func body or anything else at the top level: skipped
			depth := 0
			for ; i < len(toks); i++ {
				if toks[i] == "{" {
					depth++
				} else if toks[i] == "}" {
					if depth--; depth == 0 {
						break
					}
				}
			}
		}
	}
	if m.Version == "" {
		return nil, fmt.Errorf("ptx: no .version directive: not PTX text")
	}
	return m, nil
}

// tokenize splits PTX into words and punctuation, without comments.
func tokenize(s string) ([]string, error) {
	var toks []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case strings.HasPrefix(s[i:], "//"):
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case strings.HasPrefix(s[i:], "/*"):
			end := strings.Index(s[i+2:], "*/")
			if end < 0 {
				return nil, fmt.Errorf("ptx: unterminated comment")
			}
			i += end + 4
		case c == '"':
			end := strings.IndexByte(s[i+1:], '"')
			if end < 0 {
				return nil, fmt.Errorf("ptx: unterminated string")
			}
			toks = append(toks, s[i:i+end+2])
			i += end + 2
		case isWord(c):
			j := i
			for j < len(s) && (isWord(s[j]) || strings.HasPrefix(s[j:], "::")) {
				if s[j] == ':' {
					j++ // a qualifier such as .shared::cta is one word
				}
				j++
			}
			toks = append(toks, s[i:j])
			i = j
		default:
			toks = append(toks, string(c))
			i++
		}
	}
	return toks, nil
}

func isWord(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '$' || c == '%'
}

// typeSizes are the PTX fundamental types' sizes.
var typeSizes = map[string]int{".b8": 1, ".u8": 1, ".s8": 1, ".b16": 2, ".u16": 2, ".s16": 2, ".f16": 2, ".bf16": 2,
	".b32": 4, ".u32": 4, ".s32": 4, ".f32": 4, ".f16x2": 4, ".bf16x2": 4, ".b64": 8, ".u64": 8, ".s64": 8, ".f64": 8,
	".b128": 16}

// parseEntry parses ".entry NAME (params) {body}" from toks[i] (the name).
func parseEntry(toks []string, i int) (*Entry, int, error) {
	if i >= len(toks) {
		return nil, i, fmt.Errorf("ptx: .entry without a name")
	}
	e := &Entry{Name: toks[i]}
	i++
	if i < len(toks) && toks[i] == "(" {
		i++
		for i < len(toks) && toks[i] != ")" {
			if toks[i] == "," {
				i++
				continue
			}
			if toks[i] != ".param" {
				return nil, i, fmt.Errorf("ptx: entry %s: parameter list: unexpected %q", e.Name, toks[i])
			}
			p := Param{}
			i++
			for ; i < len(toks) && strings.HasPrefix(toks[i], "."); i++ {
				if sz, ok := typeSizes[toks[i]]; ok && p.Type == "" {
					p.Type, p.Size = toks[i], sz
				}
				if toks[i] == ".align" && i+1 < len(toks) {
					i++ // its value
				}
			}
			if i >= len(toks) {
				return nil, i, fmt.Errorf("ptx: entry %s: unterminated parameter list", e.Name)
			}
			p.Name = toks[i]
			i++
			if i+2 < len(toks) && toks[i] == "[" && toks[i+2] == "]" {
				var n int
				if _, err := fmt.Sscan(toks[i+1], &n); err == nil {
					p.Size *= n
				}
				i += 3
			}
			e.Params = append(e.Params, p)
		}
		i++ // ")"
	}
	// Performance directives (.maxntid 256, 1, 1 ...) up to the body.
	for i < len(toks) && toks[i] != "{" && toks[i] != ";" {
		i++
	}
	if i >= len(toks) || toks[i] == ";" {
		return e, i + 1, nil // a declaration without a body
	}
	depth, start := 0, i
	for ; i < len(toks); i++ {
		if toks[i] == "{" {
			depth++
		} else if toks[i] == "}" {
			if depth--; depth == 0 {
				break
			}
		}
	}
	if depth != 0 {
		return nil, i, fmt.Errorf("ptx: entry %s: unterminated body", e.Name)
	}
	analyzeBody(e, toks[start+1:i])
	return e, i + 1, nil
}

// provenance is where a value may come from: parameters (by index), or
// memory (a value the kernel loaded).
type provenance struct {
	params uint64 // bit i: parameter i (entries with more than 64 parameters: see memory)
	memory bool
}

func (p provenance) or(q provenance) provenance {
	return provenance{params: p.params | q.params, memory: p.memory || q.memory}
}

type instr struct {
	op   string   // the opcode with its modifiers, e.g. "st.global.u32"
	args []string // operands as written: "%r1", "[%rd2+8]", "{%r1,%r2}", "name"
}

// instructions splits a body into instructions (predicate guards and
// labels dropped; directives such as .reg kept out).
func instructions(body []string) []instr {
	var out []instr
	for i := 0; i < len(body); {
		t := body[i]
		switch {
		case t == "{" || t == "}" || t == ";":
			i++
			continue
		case t == "@": // a guard: @%p or @!%p
			i++
			if i < len(body) && body[i] == "!" {
				i++
			}
			i++ // the predicate
			continue
		case strings.HasPrefix(t, "."): // a directive
			for i < len(body) && body[i] != ";" {
				i++
			}
			continue
		case i+1 < len(body) && body[i+1] == ":": // a label
			i += 2
			continue
		}
		in := instr{op: t}
		i++
		var cur strings.Builder
		depth := 0
		for ; i < len(body) && body[i] != ";"; i++ {
			switch x := body[i]; {
			case x == "[" || x == "{":
				depth++
				cur.WriteString(x)
			case x == "]" || x == "}":
				depth--
				cur.WriteString(x)
			case x == "," && depth == 0:
				in.args = append(in.args, cur.String())
				cur.Reset()
			default:
				cur.WriteString(x)
			}
		}
		if cur.Len() > 0 {
			in.args = append(in.args, cur.String())
		}
		out = append(out, in)
		i++
	}
	return out
}

// registers lists the register names in an operand ("%rd1", "[%rd2+8]",
// "{%r1,%r2}", "%r3|%p1").
func registers(arg string) []string {
	var out []string
	for i := 0; i < len(arg); i++ {
		if arg[i] != '%' {
			continue
		}
		j := i + 1
		for j < len(arg) && isWord(arg[j]) && arg[j] != '%' {
			j++
		}
		out = append(out, arg[i:j])
		i = j - 1
	}
	return out
}

// space is the state space of a memory instruction ("" for generic).
func space(op string) string {
	for _, s := range []string{".global", ".shared", ".local", ".param", ".const"} {
		if strings.Contains(op, s+".") || strings.HasSuffix(op, s) || strings.Contains(op, s+"::") {
			return s
		}
	}
	return ""
}

func analyzeBody(e *Entry, body []string) {
	index := map[string]int{}
	for i, p := range e.Params {
		index[p.Name] = i
	}
	// paramOf is the parameter an operand such as [name] or [name+8] names.
	paramOf := func(arg string) (int, bool) {
		a := strings.Trim(arg, "[]")
		if k := strings.IndexAny(a, "+-"); k >= 0 {
			a = a[:k]
		}
		i, ok := index[a]
		return i, ok
	}
	ins := instructions(body)
	prov := map[string]provenance{}
	of := func(args []string) provenance {
		var p provenance
		for _, a := range args {
			for _, r := range registers(a) {
				p = p.or(prov[r])
			}
			// A parameter's own address (mov.u64 %rd1, name): its value
			// is then loaded through it.
			if i, ok := paramOf(a); ok && i < 64 {
				p.params |= 1 << uint(i)
			}
		}
		return p
	}
	undecided := map[string]bool{}
	readsUndecided := map[string]bool{}
	written := make([]bool, len(e.Params))
	read := make([]bool, len(e.Params))
	mark := func(p provenance, w bool, what string) {
		for i := range e.Params {
			// A parameter narrower than a pointer is an index or a size, not
			// a pointer of the 64-bit address space.
			if p.params&(1<<uint(i)) != 0 && e.Params[i].Size >= 8 {
				if w {
					written[i] = true
				} else {
					read[i] = true
				}
			}
		}
		if w && p.memory {
			undecided[what] = true
		}
		if !w && p.memory {
			readsUndecided[what] = true
		}
	}
	for changed := true; changed; {
		changed = false
		set := func(dst string, p provenance) {
			for _, r := range registers(dst) {
				if q := prov[r].or(p); q != prov[r] {
					prov[r] = q
					changed = true
				}
			}
		}
		for _, in := range ins {
			base := in.op
			if k := strings.IndexByte(base, '.'); k >= 0 {
				base = base[:k]
			}
			switch {
			case len(in.args) == 0:
			case base == "ld" || base == "ldu":
				if space(in.op) == ".param" {
					if i, ok := paramOf(in.args[1]); ok && i < 64 {
						set(in.args[0], provenance{params: 1 << uint(i)})
					} else {
						set(in.args[0], of(in.args[1:]))
					}
					continue
				}
				if sp := space(in.op); sp != ".shared" && sp != ".local" && sp != ".const" {
					mark(of(in.args[1:]), false, "a "+base+" through a pointer the kernel loaded from memory")
				}
				set(in.args[0], provenance{memory: true})
			case base == "st" || base == "atom" || base == "red":
				sp := space(in.op)
				if sp == ".shared" || sp == ".local" || sp == ".param" {
					if base == "atom" {
						set(in.args[0], provenance{memory: true})
					}
					continue
				}
				addr := in.args[0]
				if base == "atom" {
					addr = in.args[1]
					set(in.args[0], provenance{memory: true})
				}
				mark(of([]string{addr}), true, "a "+base+" through a pointer the kernel loaded from memory")
			case (base == "cp" || base == "wmma") && readsGlobal(in.op):
				// cp.async...shared.global, cp.async.bulk...shared.global
				// (source second), wmma.load...global (source second).
				if len(in.args) > 1 {
					mark(of(in.args[1:2]), false, "a "+base+" from a global address loaded from memory")
				}
			case (base == "cp" || base == "wmma" || base == "multimem") && writesGlobal(in.op):
				// cp[.reduce].async.bulk...global.shared (destination first),
				// wmma.store...global, multimem.st / .red: the first
				// operand is the global destination.
				mark(of(in.args[:1]), true, "a "+base+" to a global address loaded from memory")
			case base == "sust" || base == "sured":
				undecided["a surface store ("+in.op+"): the surface is not followed"] = true
			case base == "call":
				undecided["a call ("+strings.Join(in.args, ", ")+"): the callee is not followed"] = true
				readsUndecided["a call ("+strings.Join(in.args, ", ")+"): the callee is not followed"] = true
			case base == "tex" || base == "tld4" || base == "suld":
				readsUndecided["a texture or surface read ("+in.op+"): the memory behind it is not followed"] = true
				set(in.args[0], provenance{memory: true})
			case scales[base]:
				// A product, shift or quotient scales an index: a pointer
				// is not multiplied, so what comes out is no pointer.
			case base == "mad" || base == "fma":
				set(in.args[0], of(in.args[3:])) // only the addend
			default:
				// Additions, logic, conversions, mov, cvta, selp, min,
				// max, ...: the first operand is written, the rest read.
				set(in.args[0], of(in.args[1:]))
			}
		}
	}
	for i := range e.Params {
		e.Params[i].Writes, e.Params[i].Reads = written[i], read[i] || written[i]
	}
	if len(e.Params) > 64 {
		undecided["more than 64 parameters: those past the 64th are not followed"] = true
		readsUndecided["more than 64 parameters: those past the 64th are not followed"] = true
	}
	for u := range undecided {
		e.Undecided = append(e.Undecided, u)
	}
	sort.Strings(e.Undecided)
	for u := range readsUndecided {
		e.ReadsUndecided = append(e.ReadsUndecided, u)
	}
	sort.Strings(e.ReadsUndecided)
}

// scales are the instructions whose result is no pointer even if an operand
// was one.
var scales = map[string]bool{"mul": true, "mul24": true, "shl": true, "shr": true, "div": true, "rem": true,
	"setp": true, "set": true, "popc": true, "clz": true, "bfind": true, "brev": true}

// readsGlobal says whether a copy or wmma instruction reads global (or
// generic) memory through its second operand.
func readsGlobal(op string) bool {
	switch {
	case strings.HasPrefix(op, "cp."):
		return strings.Contains(op, ".shared.global") || strings.Contains(op, ".shared::cta.global") ||
			strings.Contains(op, ".shared::cluster.global")
	case strings.HasPrefix(op, "wmma."):
		return strings.Contains(op, ".load") && space(op) != ".shared" && space(op) != ".local"
	}
	return false
}

// writesGlobal says whether a copy, wmma or multimem instruction writes
// global (or generic) memory through its first operand.
func writesGlobal(op string) bool {
	switch {
	case strings.HasPrefix(op, "cp."):
		return strings.Contains(op, ".global.shared")
	case strings.HasPrefix(op, "wmma."):
		return strings.Contains(op, ".store") && space(op) != ".shared" && space(op) != ".local"
	case strings.HasPrefix(op, "multimem."):
		return strings.HasPrefix(op, "multimem.st") || strings.HasPrefix(op, "multimem.red")
	}
	return false
}
