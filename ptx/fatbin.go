package ptx

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// A fat binary (what nvcc embeds in a program or library, and what
// cuModuleLoadData and cuLibraryLoadData accept) is a sequence of
// containers, each a 16-byte header and then entries: a header of its own
// and a payload, PTX text or an ELF cubin (SASS for one GPU architecture),
// either of them possibly zstd-compressed. The layout (facts of the format;
// NVIDIA documents none of it beyond the magic numbers in its fatbinary
// header):
//
//	container: u32 magic (0xBA55ED50), u16 version (1), u16 header size
//	           (16), u64 bytes of the entries that follow
//	entry:     u16 kind (1 PTX, 2 or 16 ELF), u16, u32 header size (64,
//	           80 or 112), u32 payload bytes with padding (a multiple of 8),
//	           u32, u32 payload bytes, u32, u32 minor version, u32 SM
//	           architecture, u32, u32, u64 flags, 16 bytes of which bytes
//	           8-15 are the uncompressed size; the payload follows the
//	           entry header, the next entry the padded payload.

// FatbinMagic starts a fat binary container.
const FatbinMagic = 0xBA55ED50

// Fatbin entry kinds.
const (
	FatbinPTX = 1
	FatbinELF = 2
)

// FatbinEntry is one entry of a fat binary, with the kernels of a PTX
// entry analysed.
type FatbinEntry struct {
	Kind int // FatbinPTX, FatbinELF (or another kind, kept as found)
	Arch int // SM architecture, e.g. 90
	// Module is the analysis of a PTX entry (Analyze), nil for others.
	Module *Module
	// Why an entry says nothing about its kernels: SASS (an ELF cubin)
	// cannot be analysed (its encoding is not public: it would take
	// NVIDIA's nvdisasm, which is not part of the driver), or the payload
	// could not be read.
	NotAnalysed string
}

const (
	fatbinHeaderLen = 16
	fatbinEntryLen  = 64
	zstdMagic       = 0xFD2FB528
)

// ParseFatbin reads every container of a fat binary in b and analyses its
// PTX entries. A library holds many containers one after another; parsing
// stops at the first bytes that are not a container.
func ParseFatbin(b []byte) ([]FatbinEntry, error) { return parseFatbin(b, nil) }

// ErrNoRoom: an analysis needed more memory than it was given
// (WriteSetsWithin).
var ErrNoRoom = errors.New("no room to decompress")

// parseFatbin is ParseFatbin; take, if set, is asked for the bytes of each
// compressed PTX entry before it is decompressed, and a refusal (or an
// entry that does not say its size) ends the parse with an error wrapping
// ErrNoRoom.
func parseFatbin(b []byte, take func(n uint64) bool) ([]FatbinEntry, error) {
	var out []FatbinEntry
	le := binary.LittleEndian
	containers := 0
	for len(b) >= fatbinHeaderLen && le.Uint32(b) == FatbinMagic {
		if v := le.Uint16(b[4:]); v != 1 {
			return out, fmt.Errorf("fatbin container %d: version %d, not 1", containers, v)
		}
		hlen, size := int(le.Uint16(b[6:])), le.Uint64(b[8:])
		if hlen < fatbinHeaderLen || uint64(len(b)-hlen) < size {
			return out, fmt.Errorf("fatbin container %d: header %d bytes, %d bytes of entries, %d left: truncated",
				containers, hlen, size, len(b)-hlen)
		}
		body := b[hlen : hlen+int(size)]
		for len(body) > 0 {
			if len(body) < fatbinEntryLen {
				return out, fmt.Errorf("fatbin container %d: %d stray bytes after the last entry", containers, len(body))
			}
			kind, ehlen := int(le.Uint16(body)), int(le.Uint32(body[4:]))
			padded, payload := int(le.Uint32(body[8:])), int(le.Uint32(body[16:]))
			arch := int(le.Uint32(body[28:]))
			flags := le.Uint64(body[40:])
			raw := le.Uint64(body[56:])
			if ehlen < fatbinEntryLen || ehlen > len(body) || padded > len(body)-ehlen || payload > padded {
				return out, fmt.Errorf("fatbin container %d: entry header of %d bytes with %d (%d padded) bytes of payload: damaged",
					containers, ehlen, payload, padded)
			}
			e := FatbinEntry{Kind: kind, Arch: arch}
			if kind != FatbinPTX {
				// Not even decompressed: nothing reads it.
				e.NotAnalysed = fmt.Sprintf("SASS for sm_%d (kind %d): machine code whose encoding is not public", arch, kind)
			} else if data, err := fatbinPayload(body[ehlen:ehlen+payload], flags, raw, take); errors.Is(err, ErrNoRoom) {
				return out, fmt.Errorf("fatbin container %d, PTX for sm_%d: %w", containers, arch, err)
			} else if err != nil {
				e.NotAnalysed = err.Error()
			} else {
				text := string(bytes.TrimRight(data, "\x00"))
				if e.Module, err = Analyze(text); err != nil {
					e.NotAnalysed = err.Error()
				}
			}
			out = append(out, e)
			body = body[ehlen+padded:]
		}
		b = b[hlen+int(size):]
		containers++
	}
	if containers == 0 {
		return nil, errors.New("not a fat binary: no container magic 0xBA55ED50")
	}
	return out, nil
}

// maxDecompressed bounds one decompressed entry where no take bounds it.
const maxDecompressed = 1 << 30

// fatbinPayload is an entry's payload, decompressed if it is zstd; take,
// if set, must grant the size the entry says it has (rawSize) first, and
// the decompression stops past it: a few compressed bytes may claim
// gigabytes.
func fatbinPayload(p []byte, flags, rawSize uint64, take func(n uint64) bool) ([]byte, error) {
	if len(p) >= 4 && binary.LittleEndian.Uint32(p) == zstdMagic {
		limit := uint64(maxDecompressed)
		if take != nil {
			switch {
			case rawSize == 0:
				return nil, fmt.Errorf("%w: a compressed entry that does not say its size", ErrNoRoom)
			case !take(rawSize):
				return nil, fmt.Errorf("%w: %d bytes decompressed", ErrNoRoom, rawSize)
			}
			limit = rawSize
		}
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(limit))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		out, err := d.DecodeAll(p, nil)
		if err != nil {
			return nil, fmt.Errorf("zstd payload: %w", err)
		}
		if rawSize != 0 && uint64(len(out)) != rawSize {
			return nil, fmt.Errorf("zstd payload: %d bytes, header says %d", len(out), rawSize)
		}
		return out, nil
	}
	// Older toolkits compressed with a method of their own (flags 0x2000 or
	// 0x8000 without the zstd magic).
	if flags&(0x2000|0x8000) != 0 {
		return nil, fmt.Errorf("payload compressed with a method other than zstd (flags 0x%x)", flags)
	}
	return p, nil
}
