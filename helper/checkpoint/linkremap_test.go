package checkpoint

import "testing"

// A restore makes only files named as CRIU names its links.
func TestLinkRemapName(t *testing.T) {
	for name, want := range map[string]bool{"link_remap.121": true, "link_remap.0": true, "link_remap.": false,
		"link_remap.1x": false, "passwd": false, "link_remap.12/..": false} {
		if got := linkRemapName.MatchString(name); got != want {
			t.Errorf("%q: %v, want %v", name, got, want)
		}
	}
}
