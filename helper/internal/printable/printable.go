// Package printable makes strings that other users choose (a client's
// program name, the reasons its interposer gives, an image directory's
// name) safe to store and to print: bounded in length, and with no
// character a terminal acts on. A newline in a program name would forge a
// line of `gpucr status`; an escape sequence would move the cursor, retitle
// the terminal or clear it.
package printable

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// String is s with every control character (C0, DEL, C1, and the Unicode
// format characters that reorder text) and every byte that is not UTF-8
// written as a Go escape (\n, \t, \x1b, \u202e). Printable text, in any
// script, stays as it is, backslashes too: so String(String(s)) is
// String(s), and what the helper stored escaped prints once escaped (a
// name that holds "\n" itself looks like one that held a newline; nothing
// of either reaches the terminal but printable characters).
func String(s string) string {
	if clean(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// unsafeRune: a rune a terminal acts on or that reorders what follows: C1
// controls and Unicode's format characters (bidirectional overrides and
// isolates, zero-width ones).
func unsafeRune(r rune) bool {
	return (r >= 0x80 && r < 0xa0) || unicode.Is(unicode.Cf, r)
}

// clean says whether String would return s unchanged.
func clean(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f || c >= 0x80 {
			return cleanSlow(s)
		}
	}
	return true
}

func cleanSlow(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || r < 0x20 || r == 0x7f || unsafeRune(r) {
			return false
		}
	}
	return utf8.ValidString(s)
}

// Cut is s cut to at most max bytes, at a character's boundary, ending in
// "..." where it was cut.
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const more = "..."
	if max <= len(more) {
		return more[:max]
	}
	end := max - len(more)
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + more
}

// Bounded is String of s cut to at most max bytes: what the helper stores
// of a string a client chose.
func Bounded(s string, max int) string {
	// Escaping at most quadruples a byte (\xNN); a prefix of 4 max bytes
	// gives enough to cut from, and no more is looked at.
	if len(s) > 4*max {
		s = s[:4*max]
	}
	return Cut(String(s), max)
}
