package checkpoint

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// A restore makes only files named as CRIU names its links.
func TestLinkRemapName(t *testing.T) {
	for name, want := range map[string]bool{"link_remap.121": true, "link_remap.0": true, "link_remap.": false,
		"link_remap.1x": false, "passwd": false, "link_remap.12/..": false} {
		if got := linkRemapName.MatchString(name); got != want {
			t.Errorf("%q: %v, want %v", name, got, want)
		}
	}
}

// A link is the image's only with the copy's bytes, whatever their length.
func TestSameContent(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	big := bytes.Repeat([]byte("semaphore"), 20000) // past one 64 KiB read
	for _, tc := range []struct {
		name string
		a, b []byte
		same bool
	}{
		{"equal", big, big, true},
		{"empty", nil, nil, true},
		{"shorter", big[:len(big)-1], big, false},
		{"longer", append(append([]byte{}, big...), 'x'), big, false},
		{"one byte differs", append(append([]byte{}, big[:70000]...), append([]byte{'#'}, big[70001:]...)...), big, false},
	} {
		a := filepath.Join(dir, "link")
		if err := os.WriteFile(a, tc.a, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "copy"), tc.b, 0o600); err != nil {
			t.Fatal(err)
		}
		if same, err := sameContent(a, int(d.Fd()), "copy"); err != nil || same != tc.same {
			t.Errorf("%s: same %v (%v), want %v", tc.name, same, err, tc.same)
		}
	}
}
