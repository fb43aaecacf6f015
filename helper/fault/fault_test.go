package fault

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in    string
		known []Name
		want  Injected
	}{
		{"", Helper, Injected{}},
		{"stall-copy", Helper, Injected{Name: StallCopy}},
		{"driver-lock@2", Helper, Injected{Name: DriverLock, Nth: 2}},
		{"job-after-dump", Job, Injected{Name: JobAfterDump}},
	} {
		got, err := Parse(c.in, c.known)
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if got.String() != c.in {
			t.Errorf("Parse(%q).String() = %q", c.in, got.String())
		}
	}
	for _, c := range []struct {
		in    string
		known []Name
		want  string
	}{
		{"stall-coppy", Helper, "no such fault here"},
		{"job-after-dump", Helper, "no such fault here"},
		{"stall-copy", Job, "no such fault here"},
		{"slow-load@1", Helper, "limits only a checkpoint step"},
		{"driver-lock@0", Helper, "N from 1"},
		{"driver-lock@x", Helper, "N from 1"},
	} {
		if got, err := Parse(c.in, c.known); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %+v, %v; want an error with %q", c.in, got, err, c.want)
		}
	}
}

func TestAt(t *testing.T) {
	any := Injected{Name: StallCopy}
	second := Injected{Name: StallCopy, Nth: 2}
	if !any.At(StallCopy, 1) || !any.At(StallCopy, 7) || any.At(StallDropped, 1) {
		t.Errorf("a fault without @N: At wrong")
	}
	if second.At(StallCopy, 1) || !second.At(StallCopy, 2) {
		t.Errorf("a fault @2: At wrong")
	}
	if (Injected{}).Is(StallCopy) || !any.Is(StallCopy) {
		t.Errorf("Is wrong")
	}
}
