package ptx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// WriteSet is what a checkpoint may assume of one kernel of a module image:
// the parameters it may write global memory through.
type WriteSet struct {
	// Written has bit i set if the kernel may write through parameter i
	// (the driver's parameter index: the PTX declaration order).
	Written uint64
	// Decided: the kernel writes only through the parameters in Written.
	// False where the analysis cannot say (a store through a pointer the
	// kernel loaded from memory, a call, a surface store, more than 64
	// parameters) or where two PTX entries of the image with the kernel's
	// name disagree: it may write anything it can reach.
	Decided bool
	// ReadsDecided: the kernel also reads global memory only through its
	// parameters (the analysis found no load through a pointer it loaded
	// from memory, no texture or surface read, no call). With Decided, the
	// buffers its parameters point into are all it may touch.
	ReadsDecided bool
}

// WriteSets analyses a module image as cuModuleLoadData and
// cuLibraryLoadData take it: PTX text, or a fat binary (its PTX entries;
// SASS says nothing). Kernels it cannot read are absent; a kernel found in
// several PTX entries (one per architecture) may write what any of them
// writes, and is decided only if every one is. An ELF cubin, or anything
// else, has no PTX: an empty map and no error.
func WriteSets(image []byte) (map[string]WriteSet, error) { return WriteSetsWithin(image, nil) }

// WriteSetsWithin is WriteSets that asks take, if set, for the bytes of
// every compressed PTX entry before decompressing it (the size the entry's
// header says, which it must then have): what an analysis holds is the
// image and what take granted. A refusal ends the analysis with an error
// wrapping ErrNoRoom and no kernels: a kernel is not decided on the entries
// that fit alone.
func WriteSetsWithin(image []byte, take func(n uint64) bool) (map[string]WriteSet, error) {
	out := map[string]WriteSet{}
	switch {
	case len(image) >= 4 && binary.LittleEndian.Uint32(image) == FatbinMagic:
		entries, err := parseFatbin(image, take)
		if errors.Is(err, ErrNoRoom) {
			return map[string]WriteSet{}, err
		}
		if err != nil && len(entries) == 0 {
			return out, err
		}
		seen := map[string]bool{}
		for _, e := range entries {
			if e.Module != nil {
				addWriteSets(out, seen, e.Module)
			}
		}
		return out, nil
	case isPTXText(image):
		if i := bytes.IndexByte(image, 0); i >= 0 {
			image = image[:i]
		}
		m, err := Analyze(string(image))
		if err != nil {
			return out, fmt.Errorf("PTX text: %w", err)
		}
		addWriteSets(out, map[string]bool{}, m)
		return out, nil
	}
	return out, nil
}

// isPTXText says whether image starts as PTX does: a comment or a
// directive, after white space.
func isPTXText(image []byte) bool {
	t := bytes.TrimLeft(image[:min(len(image), 4096)], " \t\r\n")
	return len(t) > 0 && (t[0] == '.' || bytes.HasPrefix(t, []byte("//")) || bytes.HasPrefix(t, []byte("/*")))
}

func addWriteSets(out map[string]WriteSet, seen map[string]bool, m *Module) {
	for _, e := range m.Entries {
		ws := WriteSet{Decided: len(e.Undecided) == 0 && len(e.Params) <= 64, ReadsDecided: len(e.ReadsUndecided) == 0}
		for i, p := range e.Params {
			if p.Writes && i < 64 {
				ws.Written |= 1 << i
			}
		}
		if seen[e.Name] {
			prev := out[e.Name]
			ws.Written |= prev.Written
			ws.Decided = ws.Decided && prev.Decided
			ws.ReadsDecided = ws.ReadsDecided && prev.ReadsDecided
		}
		seen[e.Name] = true
		out[e.Name] = ws
	}
}
