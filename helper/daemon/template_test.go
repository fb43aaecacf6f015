package daemon

import (
	"bytes"
	"strings"
	"testing"
)

// The token is read from a script's header only when the header is one of
// this gpucr's.
func TestScriptToken(t *testing.T) {
	hdr := make([]byte, 40)
	copy(hdr, []byte{0x47, 0x53, 0x43, 0x52, 1, 0, 0, 0})
	for i := 16; i < 32; i++ {
		hdr[i] = byte(i)
	}
	tok, err := scriptToken(hdr)
	if err != nil || !bytes.Equal(tok, hdr[16:32]) {
		t.Fatalf("scriptToken = %x, %v; want %x", tok, err, hdr[16:32])
	}
	if _, err := scriptToken(hdr[:20]); err == nil || !strings.Contains(err.Error(), "shorter") {
		t.Errorf("a short header: %v", err)
	}
	bad := bytes.Clone(hdr)
	bad[0] ^= 1
	if _, err := scriptToken(bad); err == nil || !strings.Contains(err.Error(), "magic") {
		t.Errorf("another magic: %v", err)
	}
	bad = bytes.Clone(hdr)
	bad[4] = 2
	if _, err := scriptToken(bad); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("another version: %v", err)
	}
}
