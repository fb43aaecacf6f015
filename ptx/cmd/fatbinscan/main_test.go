package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/ptx"
)

// entry and container lay out a fat binary as ptx/fatbin.go describes.
func entry(kind, arch int, payload []byte) []byte {
	padded := (len(payload) + 7) &^ 7
	e := make([]byte, 64+padded)
	le := binary.LittleEndian
	le.PutUint16(e, uint16(kind))
	le.PutUint32(e[4:], 64)
	le.PutUint32(e[8:], uint32(padded))
	le.PutUint32(e[16:], uint32(len(payload)))
	le.PutUint32(e[28:], uint32(arch))
	copy(e[64:], payload)
	return e
}

func container(entries ...[]byte) []byte {
	body := bytes.Join(entries, nil)
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h, ptx.FatbinMagic)
	binary.LittleEndian.PutUint16(h[4:], 1)
	binary.LittleEndian.PutUint16(h[6:], 16)
	binary.LittleEndian.PutUint64(h[8:], uint64(len(body)))
	return append(h, body...)
}

// TestScanFindsContainersInAFile: containers at aligned offsets among other
// bytes (a file that is not ELF is searched whole) are all found, their
// entries counted by kind and gpucr's own kernels analysed; a container
// whose size runs past the end is counted as damaged.
func TestScanFindsContainersInAFile(t *testing.T) {
	text := []byte(ptx.Kernels + "\x00")
	var b []byte
	b = append(b, make([]byte, 24)...) // other bytes first
	b = append(b, container(entry(ptx.FatbinPTX, 90, text), entry(ptx.FatbinELF, 90, []byte("\x7fELF..")))...)
	b = append(b, make([]byte, 16)...) // padding between containers
	b = append(b, container(entry(ptx.FatbinELF, 100, []byte("\x7fELF....")))...)
	broken := container(entry(ptx.FatbinELF, 80, []byte("cut")))
	b = append(b, broken[:len(broken)-8]...)
	path := filepath.Join(t.TempDir(), "lib.bin")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := scan(path, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"(whole file,", "2 containers, 1 damaged or not understood",
		"ELF/SASS (kind 2): 2; PTX: 1",
		"PTX entries analysed 1 (archs [90]), not analysed 0",
		"kernels 2: decided 2, undecided 0",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
