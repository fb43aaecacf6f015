package cli

import (
	"strings"
	"testing"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/daemon"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"unlimited": 0, "none": 0, "0": 0, "4096": 4096, "512M": 512 << 20, "512MiB": 512 << 20, "512mb": 512 << 20,
		"40G": 40 << 30, "1.5G": 3 << 29, "2T": 2 << 40, "1K": 1024, " 8 GiB ": 8 << 30,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1G", "1X", "G", "1e30T", "NaN"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}

// helperLimitsOf parses args as `gpucr helper`'s flags and returns the
// limits they give.
func helperLimitsOf(t *testing.T, args ...string) (daemon.Limits, error) {
	t.Helper()
	var got daemon.Limits
	var err error
	app := &ucli.App{Commands: []*ucli.Command{{Name: "helper", Flags: helperCommand().Flags,
		Action: func(c *ucli.Context) error { got, err = helperLimits(c); return nil }}}}
	if rerr := app.Run(append([]string{"gpucr", "helper"}, args...)); rerr != nil {
		t.Fatal(rerr)
	}
	return got, err
}

func TestHelperLimitFlags(t *testing.T) {
	l, err := helperLimitsOf(t)
	if err != nil || l.FrameTimeout != daemon.DefaultFrameTimeout || l.MaxConnsPerUID != daemon.DefaultMaxConnsPerUID ||
		l.MaxPending != daemon.DefaultMaxPending || l.GPUMemoryPerUID != 0 || len(l.GPUMemoryByUID) != 0 ||
		l.ExportsPerUID != daemon.DefaultExportsPerUID || l.AnalysisBytes != daemon.DefaultAnalysisBytes ||
		l.AnalysisBytesPerUID != daemon.DefaultAnalysisBytesPerUID {
		t.Fatalf("defaults: %+v, %v", l, err)
	}
	l, err = helperLimitsOf(t, "--frame-timeout", "3s", "--max-connections-per-uid", "0", "--max-pending-connections", "32",
		"--max-gpu-memory-per-uid", "40G", "--max-gpu-memory-for", "root=8G", "--max-gpu-memory-for", "1234=unlimited",
		"--max-exports-per-uid", "64", "--module-analysis-memory", "1G", "--module-analysis-memory-per-uid", "200M")
	if err != nil || l.FrameTimeout != 3*time.Second || l.MaxConnsPerUID >= 0 || l.MaxPending != 32 || l.ExportsPerUID != 64 ||
		l.AnalysisBytes != 1<<30 || l.AnalysisBytesPerUID != 200<<20 ||
		l.GPUMemoryPerUID != 40<<30 || len(l.GPUMemoryByUID) != 2 || l.GPUMemoryByUID[0] != 8<<30 {
		t.Fatalf("set: %+v, %v", l, err)
	}
	if v, ok := l.GPUMemoryByUID[1234]; !ok || v != 0 {
		t.Fatalf("uid 1234: %d, %v", v, ok)
	}
	for _, args := range [][]string{
		{"--max-gpu-memory-per-uid", "lots"},
		{"--max-gpu-memory-for", "root"},
		{"--max-gpu-memory-for", "no-such-user-here=1G"},
		{"--max-gpu-memory-for", "root=1Q"},
		{"--max-connections-per-uid", "-1"},
		{"--max-exports-per-uid", "-1"},
		{"--module-analysis-memory", "0"},
		{"--module-analysis-memory-per-uid", "unlimited"},
		{"--frame-timeout", "0s"},
	} {
		if _, err := helperLimitsOf(t, args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	// And through the command: a usage error, before anything starts.
	code, _, errOut := runCLI(t, "helper", "--socket", t.TempDir()+"/s", "--max-gpu-memory-per-uid", "lots")
	if code != ExitUsage || !strings.Contains(errOut, "--max-gpu-memory-per-uid") {
		t.Fatalf("a bad size: exit %d, %q", code, errOut)
	}
}
