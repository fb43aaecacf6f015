// Command fatbinscan reports what ptx.ParseFatbin and ptx.Analyze make of
// the GPU code in real programs and libraries (libcublas, libtorch_cuda,
// ...):
//
//	fatbinscan FILE...
//
// For each ELF file it finds the fat binaries (containers starting with the
// magic 0xBA55ED50 in its .nv_fatbin section, or anywhere in the file when
// there is no such section), and prints per file: containers, entries by
// kind, PTX entries whose text was analysed or not (and why), kernels
// found, and of those how many the analysis decided (every global write
// goes through a marked parameter) or left undecided, with the commonest
// reasons. It is built statically so that it runs on the GPU machine.
package main

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/gpucr/gpucr/ptx"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fatbinscan FILE...")
		os.Exit(2)
	}
	rc := 0
	for _, f := range os.Args[1:] {
		if err := scan(f, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "fatbinscan: %s: %v\n", f, err)
			rc = 1
		}
	}
	os.Exit(rc)
}

// fatbinBytes returns the bytes to search for containers: the .nv_fatbin
// section of an ELF file, or the whole file.
func fatbinBytes(path string) ([]byte, string, error) {
	if ef, err := elf.Open(path); err == nil {
		defer ef.Close()
		if s := ef.Section(".nv_fatbin"); s != nil {
			b, err := s.Data()
			return b, ".nv_fatbin", err
		}
	}
	b, err := os.ReadFile(path)
	return b, "whole file", err
}

type tally struct {
	containers, damaged    int
	kinds                  map[string]int
	ptxAnalysed, ptxFailed int
	failReasons            map[string]int
	kernels, decided       int
	undecidedWhy           map[string]int
	writtenParams, params  int
	archs                  map[int]int
}

func scan(path string, out io.Writer) error {
	b, where, err := fatbinBytes(path)
	if err != nil {
		return err
	}
	t := tally{kinds: map[string]int{}, failReasons: map[string]int{}, undecidedWhy: map[string]int{}, archs: map[int]int{}}
	le := binary.LittleEndian
	for off := 0; off+16 <= len(b); off += 8 {
		if le.Uint32(b[off:]) != ptx.FatbinMagic {
			continue
		}
		size := le.Uint64(b[off+8:])
		hlen := uint64(le.Uint16(b[off+6:]))
		end := uint64(off) + hlen + size
		if end > uint64(len(b)) {
			t.damaged++
			continue
		}
		entries, err := ptx.ParseFatbin(b[off:end])
		t.containers++
		if err != nil {
			t.damaged++
		}
		for _, e := range entries {
			switch e.Kind {
			case ptx.FatbinPTX:
				t.kinds["PTX"]++
				if e.Module == nil {
					t.ptxFailed++
					t.failReasons[firstWords(e.NotAnalysed)]++
					continue
				}
				t.ptxAnalysed++
				t.archs[e.Arch]++
				for _, k := range e.Module.Entries {
					t.kernels++
					if len(k.Undecided) == 0 {
						t.decided++
					}
					for _, why := range k.Undecided {
						t.undecidedWhy[firstWords(why)]++
					}
					for _, p := range k.Params {
						t.params++
						if p.Writes {
							t.writtenParams++
						}
					}
				}
			default:
				t.kinds[fmt.Sprintf("ELF/SASS (kind %d)", e.Kind)]++
			}
		}
		off = int(end) - 8 // continue after this container (the loop adds 8)
	}
	fmt.Fprintf(out, "%s (%s, %d MB): %d containers", path, where, len(b)>>20, t.containers)
	if t.damaged > 0 {
		fmt.Fprintf(out, ", %d damaged or not understood", t.damaged)
	}
	fmt.Fprintf(out, "; entries: %s\n", counts(t.kinds))
	if t.kinds["PTX"] > 0 {
		fmt.Fprintf(out, "  PTX entries analysed %d (archs %v), not analysed %d %s\n", t.ptxAnalysed, archList(t.archs), t.ptxFailed, counts(t.failReasons))
		fmt.Fprintf(out, "  kernels %d: decided %d, undecided %d; parameters %d, marked written %d\n",
			t.kernels, t.decided, t.kernels-t.decided, t.params, t.writtenParams)
		if len(t.undecidedWhy) > 0 {
			fmt.Fprintf(out, "  why undecided (a kernel may count under several): %s\n", counts(t.undecidedWhy))
		}
	}
	return nil
}

// firstWords shortens a reason to its kind: the words before a colon or a
// register name, so that reasons group.
func firstWords(s string) string {
	if i := strings.IndexAny(s, ":%("); i > 0 {
		s = s[:i]
	}
	w := strings.Fields(s)
	if len(w) > 6 {
		w = w[:6]
	}
	return strings.Join(w, " ")
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	var parts []string
	for i, k := range keys {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("... %d more", len(keys)-8))
			break
		}
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return "{" + strings.Join(parts, "; ") + "}"
}

func archList(m map[int]int) []int {
	var a []int
	for k := range m {
		a = append(a, k)
	}
	sort.Ints(a)
	return a
}
