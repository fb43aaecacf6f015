package printable

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for in, want := range map[string]string{
		"python3":                             "python3",
		"train.py --lr=3e-4":                  "train.py --lr=3e-4",
		"données-日本":                          "données-日本",
		"a\nb":                                `a\nb`,
		"x\x1b[2J\x1b]0;t\x07":                `x\x1b[2J\x1b]0;t\x07`,
		"tab\there\r":                         `tab\there\r`,
		"back\\slash":                         `back\slash`,
		"\xff\xfe":                            `\xff\xfe`,
		"c1\u009bm":                           `c1\u009bm`,
		"rtl\u202etxt.exe":                    `rtl\u202etxt.exe`,
		"del\x7f":                             `del\x7f`,
		"zero\u200bwidth":                     `zero\u200bwidth`,
		"\\n looks like a newline, \n is one": `\n looks like a newline, \n is one`,
	} {
		if got := String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
		if again := String(want); again != want {
			t.Errorf("String(%q) = %q: escaping twice changes it", want, again)
		}
	}
}

func TestBounded(t *testing.T) {
	long := strings.Repeat("\n", 300000)
	got := Bounded(long, 4096)
	if len(got) > 4096 || !strings.HasPrefix(got, `\n\n`) || !strings.HasSuffix(got, "...") || strings.Contains(got, "\n") {
		t.Errorf("Bounded of 300,000 newlines: %d bytes, %q...", len(got), got[:min(len(got), 20)])
	}
	if got := Bounded(strings.Repeat("日", 2000), 100); len(got) > 100 || !utf8.ValidString(got) {
		t.Errorf("cut inside a character: %q", got)
	}
	if got := Bounded("short", 4096); got != "short" {
		t.Errorf("Bounded(short) = %q", got)
	}
}
