package devicemap

import (
	"strings"
	"testing"
)

// TestParse: OLD=NEW pairs, spaces ignored, "" no map; a part that is not
// OLD=NEW is refused, naming it.
func TestParse(t *testing.T) {
	got, err := Parse(" 0 = 1 ,GPU-aa=GPU-bb")
	if err != nil || len(got) != 2 || got[0] != (Entry{"0", "1"}) || got[1] != (Entry{"GPU-aa", "GPU-bb"}) {
		t.Fatalf("Parse = %v, %v", got, err)
	}
	if got, err := Parse("  "); got != nil || err != nil {
		t.Errorf("Parse of nothing = %v, %v", got, err)
	}
	for _, bad := range []string{"0", "0=", "=1", "0=1=2", "0=1,"} {
		if _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), "is not OLD=NEW") {
			t.Errorf("Parse(%q) = %v", bad, err)
		}
	}
}
