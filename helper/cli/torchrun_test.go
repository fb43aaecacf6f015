package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestTorchrunRefusalsExit2: what gpucr torchrun does not run is a bad
// command line (exit 2), said before anything starts; --help is help.
func TestTorchrunRefusalsExit2(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--max-restarts", "2", "train.py"}, "restore the job from its last `gpucr checkpoint`"},
		{[]string{"--nnodes", "1:2", "train.py"}, "elastic"},
		{[]string{"--standalone"}, "no training script"},
		{[]string{"--socket"}, "--socket needs a path"},
	} {
		var out, errOut bytes.Buffer
		code := Run(append([]string{"gpucr", "torchrun"}, tc.args...), &out, &errOut)
		if code != ExitUsage || !strings.Contains(errOut.String(), tc.says) {
			t.Errorf("gpucr torchrun %q: exit %d, %q; want 2 and %q", tc.args, code, errOut.String(), tc.says)
		}
	}
	var out, errOut bytes.Buffer
	if code := Run([]string{"gpucr", "torchrun", "--help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "--nproc-per-node") {
		t.Errorf("gpucr torchrun --help: exit %d:\n%s%s", code, out.String(), errOut.String())
	}
}
