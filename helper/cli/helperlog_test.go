package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
)

// The helper's log goes to --log-file (appended, 0640 whatever the umask),
// in text or JSON, and an error carries no Go stack trace.
func TestHelperLogFile(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for _, format := range []string{"text", "json"} {
		p := filepath.Join(t.TempDir(), "helper.log")
		if err := os.WriteFile(p, []byte("earlier line\n"), 0o640); err != nil {
			t.Fatal(err)
		}
		log, err := helperLogger("info", format, p)
		if err != nil {
			t.Fatal(err)
		}
		log.Error("no usable GPU driver", errField(errors.New("libcuda.so.1: not found")))
		_ = log.Sync()
		b, _ := os.ReadFile(p)
		s := string(b)
		if !strings.HasPrefix(s, "earlier line\n") || !strings.Contains(s, "no usable GPU driver") {
			t.Errorf("%s: the log file holds %q, want the earlier line and the new one", format, s)
		}
		if strings.Contains(s, "stacktrace") || strings.Contains(s, ".go:") && strings.Count(s, "\n") > 2 {
			t.Errorf("%s: a stack trace in the log:\n%s", format, s)
		}
		if (format == "json") != strings.Contains(s, `"msg":`) {
			t.Errorf("%s: not that format:\n%s", format, s)
		}
		fresh := filepath.Join(t.TempDir(), "new.log")
		if _, err := helperLogger("info", format, fresh); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("a new log file: %v, %v; want mode 0640", fi, err)
		}
	}
	if _, err := helperLogger("info", "xml", ""); err == nil {
		t.Error("--log-format xml accepted")
	}
}

func errField(err error) zap.Field { return zap.Error(err) }
