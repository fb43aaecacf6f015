package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/helper/checkpoint"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = Run(append([]string{"gpucr"}, args...), &o, &e)
	return code, o.String(), e.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "version")
	if code != ExitOK || !strings.Contains(out, Version) {
		t.Fatalf("version: code %d, output %q", code, out)
	}
	code, out, _ = runCLI(t, "version", "--json")
	var v map[string]string
	if code != ExitOK || json.Unmarshal([]byte(out), &v) != nil || v["version"] != Version {
		t.Fatalf("version --json: code %d, output %q", code, out)
	}
}

func TestUsageErrorExitCode(t *testing.T) {
	code, _, errOut := runCLI(t, "version", "--no-such-flag")
	if code != ExitUsage {
		t.Fatalf("bad flag: exit code %d, want %d (stderr %q)", code, ExitUsage, errOut)
	}
}

// help works as a command, for a command, and as a flag, and exits 0.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"help", "checkpoint"}, {"checkpoint", "--help"},
		{"checkpoint", "42", "--help"}, {"restore", "--help"}, {"check", "--help"}, {"help", "image"}, {}} {
		code, out, errOut := runCLI(t, args...)
		if code != ExitOK || !strings.Contains(out, "USAGE:") {
			t.Errorf("gpucr %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	if _, out, _ := runCLI(t, "help", "checkpoint"); !strings.Contains(out, "--criu-timeout") || !strings.Contains(out, "--plugin-dir") {
		t.Errorf("help checkpoint does not list its flags: %q", out)
	}
	if _, out, _ := runCLI(t, "help", "checkpoint"); !strings.Contains(out, "--force") {
		t.Errorf("help checkpoint does not list --force: %q", out)
	}
	for _, args := range [][]string{{"help", "image"}, {"image", "--help"}} {
		_, out, _ := runCLI(t, args...)
		for _, sub := range []string{"inspect", "verify", "diff", "gc"} {
			if !strings.Contains(out, "   "+sub+" ") {
				t.Errorf("gpucr %s does not list %q:\n%s", strings.Join(args, " "), sub, out)
			}
		}
	}
	for _, args := range [][]string{{"help", "nosuch"}, {"nosuch"}} {
		if code, _, errOut := runCLI(t, args...); code != ExitUsage {
			t.Errorf("gpucr %v: exit %d (%q), want %d", args, code, errOut, ExitUsage)
		}
	}
}

// With --json a failure is one JSON object on stdout, on one line, as a
// success is; nothing on stderr, and the exit code stays.
func TestJSONErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"checkpoint", "x12", "-D", dir, "--json"}, ExitUsage, "is not a pid"},
		{[]string{"checkpoint", "--json", "-D", dir}, ExitUsage, "usage"},
		{[]string{"checkpoint", "1", "-D", dir, "--gpu-only", "--pre-copy", "2", "--json"}, ExitUsage, "--pre-copy is for a CRIU dump"},
		{[]string{"restore", "-D", filepath.Join(dir, "none"), "--json"}, ExitFailure, "does not exist"},
		{[]string{"restore", "-D", dir, "--device-map", "0=1,1", "--json"}, ExitUsage, `"1" is not OLD=NEW`},
		{[]string{"migrate", "1", "--to", "h", "--device-map", "=1", "--json"}, ExitUsage, `"=1" is not OLD=NEW`},
		{[]string{"status", "--socket", filepath.Join(dir, "none.sock"), "--json"}, ExitFailure, "no helper answers"},
		{[]string{"nosuch", "--json"}, ExitUsage, "unknown command"},
	} {
		code, out, errOut := runCLI(t, tc.args...)
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(out))
		if err := dec.Decode(&m); err != nil || dec.More() {
			t.Errorf("gpucr %v: stdout is not one JSON object (%v): %q", tc.args, err, out)
			continue
		}
		if code != tc.code || m["exit_code"] != float64(tc.code) || errOut != "" {
			t.Errorf("gpucr %v: exit %d, exit_code %v, stderr %q; want %d and nothing on stderr", tc.args, code, m["exit_code"], errOut, tc.code)
		}
		if e, _ := m["error"].(string); !strings.Contains(e, tc.want) {
			t.Errorf("gpucr %v: error %q does not say %q", tc.args, e, tc.want)
		}
	}
	// A pid that does not exist (a free one: the largest possible).
	code, out, _ := runCLI(t, "checkpoint", "4194304", "-D", dir, "--json")
	if code != ExitFailure || out != `{"error":"no process 4194304","exit_code":1}`+"\n" {
		t.Errorf("checkpoint of a missing pid: exit %d, %q", code, out)
	}
}

func TestWantsJSON(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"gpucr", "status", "--json"}, true},
		{[]string{"gpucr", "client", "1", "stats", "-json"}, true},
		{[]string{"gpucr", "status"}, false},
		{[]string{"gpucr", "run", "--", "prog", "--json"}, false},
		{[]string{"gpucr", "status", "--json=false"}, false},
	} {
		if got := wantsJSON(tc.args); got != tc.want {
			t.Errorf("wantsJSON(%q) = %v", tc.args, got)
		}
	}
}

// A CRIU failure's JSON carries what CRIU and the plugin said.
func TestCRIUFailureJSON(t *testing.T) {
	f := &checkpoint.Failure{Summary: "criu dump of pid 7 failed; see /d/dump.log", CRIU: []string{"unix: External socket is used."},
		Plugin: []string{"gpucr_plugin: no"}, Hints: []string{"h"}, Log: "/d/dump.log"}
	m := errorJSON(f, ExitFailure)
	if m["error"] != f.Summary || m["log"] != "/d/dump.log" || m["timed_out"] != false || m["exit_code"] != ExitFailure {
		t.Errorf("errorJSON: %v", m)
	}
	if c, _ := m["criu_errors"].([]string); len(c) != 1 || c[0] != f.CRIU[0] {
		t.Errorf("criu_errors: %v", m["criu_errors"])
	}
	if _, ok := m["go_criu_error"]; ok {
		t.Errorf("go-criu's error shown although the log says why: %v", m)
	}
	text := f.Error()
	for _, want := range []string{f.Summary, "\n  gpucr_plugin: no", "\n  criu: unix: External socket is used.", "\n  hint: h"} {
		if !strings.Contains(text, want) {
			t.Errorf("text %q lacks %q", text, want)
		}
	}
}

// -v is no version flag: `gpucr -v checkpoint PID -D DIR` printed the
// version and exited 0 without checkpointing. It is refused (exit 2), saying
// what to use, wherever it stands; --version still prints the version.
func TestNoVersionShorthand(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"-v", "checkpoint", "4194304", "-D", dir},
		{"-v4", "status"},
		{"--verbose", "status"},
		{"checkpoint", "-v", "4194304", "-D", dir},
		{"checkpoint", "4194304", "-D", dir, "-v"},
	} {
		code, out, errOut := runCLI(t, args...)
		if code != ExitUsage || strings.Contains(out, Version) || !strings.Contains(errOut, "`gpucr --version` prints its version") {
			t.Errorf("gpucr %v: exit %d, stdout %q, stderr %q; want %d and what to use instead", args, code, out, errOut, ExitUsage)
		}
	}
	if code, out, _ := runCLI(t, "--version"); code != ExitOK || out != "gpucr version "+Version+"\n" {
		t.Errorf("gpucr --version: exit %d, %q", code, out)
	}
	if _, out, _ := runCLI(t, "--help"); strings.Contains(out, "-v ") || strings.Contains(out, ", -v") {
		t.Errorf("gpucr --help still lists -v:\n%s", out)
	}
}

// `gpucr help image gc` is gc's help (urfave's help command read only its
// first word and showed image's), and a subcommand's usage line names its
// command.
func TestHelpOfSubcommand(t *testing.T) {
	code, out, errOut := runCLI(t, "help", "image", "gc")
	if code != ExitOK || !strings.Contains(out, "gpucr image gc - remove the chunks") || !strings.Contains(out, "--dry-run") ||
		strings.Contains(out, "inspect") {
		t.Errorf("gpucr help image gc: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut := runCLI(t, "help", "image", "nosuch"); code != ExitUsage || !strings.Contains(errOut, `no command "image nosuch"`) {
		t.Errorf("gpucr help image nosuch: exit %d, stderr %q", code, errOut)
	}
	for args, want := range map[string]string{
		"image diff":              "usage: gpucr image diff [flags] A B",
		"image inspect":           "usage: gpucr image inspect [flags] DIR",
		"image diff a b --nosuch": "image diff: flag provided but not defined: --nosuch",
	} {
		code, _, errOut := runCLI(t, strings.Fields(args)...)
		if code != ExitUsage || !strings.Contains(errOut, want) {
			t.Errorf("gpucr %s: exit %d, stderr %q; want %q", args, code, errOut, want)
		}
	}
}

// A misspelt GPUCR_FAULT stops `gpucr helper` and a job agent before they
// start, naming the faults there are, instead of running without the
// failure a test asked for.
func TestUnknownFaultRefused(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		fault string
		args  []string
		want  string
	}{
		{"stall-coppy", []string{"helper", "--socket", filepath.Join(dir, "h.sock")}, "GPUCR_FAULT=stall-coppy: no such fault here (these are: driver-lock,"},
		{"job-after-dump", []string{"helper", "--socket", filepath.Join(dir, "h.sock")}, "no such fault here"},
		{"slow-load@2", []string{"helper", "--socket", filepath.Join(dir, "h.sock")}, "limits only a checkpoint step"},
		{"stall-copy", []string{"job-agent"}, "GPUCR_FAULT=stall-copy: no such fault here (these are: job-after-dump,"},
	} {
		t.Setenv("GPUCR_FAULT", c.fault)
		code, _, errOut := runCLI(t, c.args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("GPUCR_FAULT=%s gpucr %v: exit %d, stderr %q; want %d and %q", c.fault, c.args, code, errOut, ExitUsage, c.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "h.sock")); err == nil {
			t.Fatalf("GPUCR_FAULT=%s: the helper started", c.fault)
		}
	}
}
