package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Every visible command gets a manual page of its own, made from its flags.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	if code, out, errOut := runCLI(t, "man", dir); code != 0 {
		t.Fatalf("gpucr man: %d %s %s", code, out, errOut)
	}
	for page, want := range map[string][]string{
		"gpucr.1":            {".TH gpucr 1", "checkpoint", "migrate"},
		"gpucr-checkpoint.1": {".TH gpucr-checkpoint", "leave-running", "tcp-established", "criu-opt"},
		"gpucr-migrate.1":    {".TH gpucr-migrate", "target-gpucr", "shared"},
		"gpucr-image.1":      {"inspect", "verify"},
	} {
		b, err := os.ReadFile(filepath.Join(dir, page))
		if err != nil {
			t.Errorf("%s: %v", page, err)
			continue
		}
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s lacks %q", page, w)
			}
		}
	}
	// A command's options are its OPTIONS, not GLOBAL OPTIONS; every page
	// has EXAMPLES and EXIT STATUS.
	pages, _ := filepath.Glob(filepath.Join(dir, "*.1"))
	if len(pages) < 13 {
		t.Errorf("only %d pages: %v", len(pages), pages)
	}
	for _, p := range pages {
		b, _ := os.ReadFile(p)
		page := string(b)
		for _, sec := range []string{".SH EXAMPLES", ".SH EXIT STATUS"} {
			if !strings.Contains(page, sec) {
				t.Errorf("%s has no %s section", filepath.Base(p), sec)
			}
		}
		if filepath.Base(p) != "gpucr.1" && strings.Contains(page, "GLOBAL OPTIONS") {
			t.Errorf("%s puts the command's options under GLOBAL OPTIONS", filepath.Base(p))
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "gpucr-checkpoint.1"))
	if opts := strings.Index(string(b), ".SH OPTIONS"); opts < 0 || strings.Index(string(b), "leave-running") < opts {
		t.Errorf("gpucr-checkpoint.1 does not list --leave-running under OPTIONS")
	}
	for page, want := range map[string]string{"gpucr.1": "130", "gpucr-checkpoint.1": "143", "gpucr-run.1": "127"} {
		if b, _ := os.ReadFile(filepath.Join(dir, page)); !strings.Contains(string(b), want) {
			t.Errorf("%s's EXIT STATUS lacks %s", page, want)
		}
	}
	// man is a command like the others: listed by --help, with a page.
	if _, out, _ := runCLI(t, "--help"); !strings.Contains(out, "   man ") {
		t.Errorf("gpucr --help does not list man:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "gpucr-man.1")); err != nil {
		t.Errorf("man has no page: %v", err)
	}
	if man, err := exec.LookPath("man"); err == nil {
		out, err := exec.Command(man, "-l", "-P", "cat", filepath.Join(dir, "gpucr-restore.1")).CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("images-dir")) {
			t.Errorf("man -l gpucr-restore.1: %v\n%s", err, out)
		}
	}
}

// The bash completion completes commands, then the command's flags and
// subcommands.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	code, script, _ := runCLI(t, "completion", "bash")
	if code != 0 {
		t.Fatalf("gpucr completion bash: %d", code)
	}
	complete := func(words ...string) string {
		t.Helper()
		prog := script + "\nCOMP_WORDS=(" + strings.Join(words, " ") + "); COMP_CWORD=" + strconv.Itoa(len(words)-1) +
			"; _gpucr_complete; echo \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command(bash, "-c", prog).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"gpucr", "chec"}, "check checkpoint"},
		{[]string{"gpucr", "mig"}, "migrate"},
		{[]string{"gpucr", "checkpoint", "42", "--lea"}, "--leave-running"},
		{[]string{"gpucr", "image", "ve"}, "verify"},
		{[]string{"gpucr", "restore", "--tcp-e"}, "--tcp-established"},
	} {
		if got := complete(tc.words...); got != tc.want {
			t.Errorf("completion of %q: %q, want %q", tc.words, got, tc.want)
		}
	}
	if code, _, _ := runCLI(t, "completion", "fish"); code != ExitUsage {
		t.Errorf("completion fish: exit %d, want %d", code, ExitUsage)
	}
	if code, out, _ := runCLI(t, "completion", "zsh"); code != 0 || !strings.Contains(out, "bashcompinit") {
		t.Errorf("completion zsh: %d %q", code, out)
	}
}
