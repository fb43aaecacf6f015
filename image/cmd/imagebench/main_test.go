package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// imagebench must work end to end on a small size: every case written, read
// back, compared and tabulated. No timing is asserted: CI machines vary.
func TestImagebenchSmall(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"-dir", t.TempDir(), "-size", "16", "-runs", "2", "-buffers", "3"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	s := out.String()
	for _, want := range []string{"CPU cores", "| case ", "raw write GB/s", "dedup ratio", "targets:"} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	for _, c := range allCases {
		if !strings.Contains(s, "| "+c.name+" ") {
			t.Errorf("table lacks case %s:\n%s", c.name, s)
		}
	}
}

func TestImagebenchJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"-dir", t.TempDir(), "-size", "10", "-chunk", "1", "-runs", "1", "-cases", "dup50,zero30", "-json"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	if len(rep.Results) != 2 || rep.CPUs <= 0 || rep.Filesystem == "" {
		t.Fatalf("report: %+v", rep)
	}
	for _, r := range rep.Results {
		if r.WriteGBps <= 0 || r.ReadGBps <= 0 || r.RawWriteGBps <= 0 || r.RawReadGBps <= 0 || r.StoredBytes <= 0 {
			t.Errorf("%s: %+v", r.Case, r)
		}
	}
	// 10 chunks of 1 MiB: 5 are duplicates, or 3 are zero, so 2x and 10/7
	// less is stored. These depend only on the data, not on timing.
	if d := rep.Results[0].DedupRatio; d < 1.9 || d > 2.1 {
		t.Errorf("dup50 dedup ratio %.2f, want about 2", d)
	}
	if d := rep.Results[1].DedupRatio; d < 1.35 || d > 1.5 {
		t.Errorf("zero30 dedup ratio %.2f, want about 1.43", d)
	}
}

func TestImagebenchUsage(t *testing.T) {
	for _, args := range [][]string{{"-size", "0"}, {"-cases", "nope"}, {"extra"}, {"-bogus"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"-dir", "/nonexistent/dir"}, &out, &errOut); code != 1 {
		t.Errorf("missing -dir: exit %d, want 1", code)
	}
}
