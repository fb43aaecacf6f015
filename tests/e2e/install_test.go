package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testroot"
)

// TestMakeInstall: `make install DESTDIR=...` stages CRIU's plugin, the gpucr
// binary, the interposer, the helper's systemd unit and the document the
// unit names, for the default PREFIX and another. The unit's ExecStart names
// the installed binary, nothing else of the unit changes on the way, its
// sandbox lets the helper write images wherever they are asked for, and
// systemd-analyze verify (where it exists; systemd need not run) accepts it.
func TestMakeInstall(t *testing.T) {
	mk := needTool(t, "make")
	build, root := buildDir(t), testroot.Dir(t)
	if !filepath.IsAbs(build) {
		t.Fatalf("GPUCR_BUILD must be absolute here, got %s", build)
	}
	plugin := filepath.Join(build, "lib", "criu", "gpucr_plugin.so")
	gpucr := filepath.Join(build, "bin", "gpucr")
	interposer := filepath.Join(build, "lib", "libgpucr.so")
	source, err := os.ReadFile(filepath.Join(root, "scripts", "gpucr-helper.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"", "/opt/gpucr"} {
		name := "default-prefix"
		if prefix != "" {
			name = "prefix" + strings.ReplaceAll(prefix, "/", "-")
		}
		t.Run(name, func(t *testing.T) {
			destdir := t.TempDir()
			// a directory that was there before install, empty: uninstall
			// leaves it
			want := "/usr/local"
			if prefix != "" {
				want = prefix
			}
			before := want + "/share/man"
			if err := os.MkdirAll(destdir+before, 0o755); err != nil {
				t.Fatal(err)
			}
			// -o: install what `make` built, never rebuild it here.
			args := []string{"-C", root, "--no-print-directory", "install", "BUILD=" + build, "DESTDIR=" + destdir,
				"-o", plugin, "-o", gpucr, "-o", interposer}
			if prefix != "" {
				args = append(args, "PREFIX="+prefix)
			}
			run(t, 2*time.Minute, makeEnv(), mk, args...)

			unitPath := want + "/lib/systemd/system/gpucr-helper.service"
			for path, f := range map[string]struct {
				src  string
				mode os.FileMode
			}{
				"/usr/lib/criu/gpucr_plugin.so":                   {plugin, 0o755},
				want + "/bin/gpucr":                               {gpucr, 0o755},
				want + "/bin/gpucr-worker":                        {binPath(t, "gpucr-worker"), 0o755},
				"/usr/lib/gpucr/libgpucr.so":                      {interposer, 0o755},
				"/usr/lib/gpucr/served/libcuda.so.1":              {filepath.Join(build, "lib", "served", "libcuda.so.1"), 0o755},
				"/usr/lib/gpucr/served/libcudart.so.13":           {filepath.Join(build, "lib", "served", "libcudart.so.13"), 0o755},
				"/usr/lib/gpucr/served/libnvidia-ml.so.1":         {filepath.Join(build, "lib", "served", "libnvidia-ml.so.1"), 0o755},
				"/usr/lib/gpucr/served/libcublas.so.13":           {filepath.Join(build, "lib", "served", "libcublas.so.13"), 0o755},
				"/usr/lib/gpucr/served/libcublasLt.so.13":         {filepath.Join(build, "lib", "served", "libcublasLt.so.13"), 0o755},
				want + "/share/doc/gpucr/helper-protocol.md":      {filepath.Join(root, "docs", "helper-protocol.md"), 0o644},
				want + "/share/man/man1/gpucr-checkpoint.1":       {"", 0o644},
				want + "/share/man/man1/gpucr.1":                  {"", 0o644},
				want + "/share/bash-completion/completions/gpucr": {"", 0o644},
				want + "/share/zsh/site-functions/_gpucr":         {"", 0o644},
				unitPath: {"", 0o644},
				want + "/lib/systemd/system/gpucr-job@.service": {"", 0o644},
			} {
				fi, err := os.Stat(destdir + path)
				if err != nil {
					t.Errorf("not installed: %v", err)
					continue
				}
				if !fi.Mode().IsRegular() || fi.Mode().Perm() != f.mode {
					t.Errorf("%s: mode %v, want a file with %v", path, fi.Mode(), f.mode)
				}
				if f.src == "" {
					continue
				}
				got, err1 := os.ReadFile(destdir + path)
				src, err2 := os.ReadFile(f.src)
				if err1 != nil || err2 != nil || !bytes.Equal(got, src) {
					t.Errorf("%s is not a copy of %s (%v, %v)", path, f.src, err1, err2)
				}
			}
			job, err := os.ReadFile(destdir + want + "/lib/systemd/system/gpucr-job@.service")
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range []string{"ExecStart=" + want + "/bin/gpucr run -- $JOB\n",
				"ExecStop=" + want + "/bin/gpucr checkpoint $MAINPID -D ${GPUCR_FINAL_DIR} --force --drain ${GPUCR_FINAL_URL} --wait --deadline ${GPUCR_DEADLINE}\n"} {
				if !strings.Contains(string(job), l) {
					t.Errorf("the installed job unit has no line %q:\n%s", l, job)
				}
			}
			unit, err := os.ReadFile(destdir + unitPath)
			if err != nil {
				t.Fatal(err)
			}

			// ExecStart and Documentation name the installed files; every
			// other line is the unit in scripts/ unchanged.
			gotLines, srcLines := strings.Split(string(unit), "\n"), strings.Split(string(source), "\n")
			if len(gotLines) != len(srcLines) {
				t.Fatalf("the installed unit has %d lines, scripts/gpucr-helper.service %d", len(gotLines), len(srcLines))
			}
			var execStart []string
			for i, line := range gotLines {
				switch {
				case strings.HasPrefix(line, "ExecStart="):
					execStart = strings.Fields(strings.TrimPrefix(line, "ExecStart="))
				case strings.HasPrefix(line, "Documentation="):
					doc := strings.TrimPrefix(line, "Documentation=file://")
					if _, err := os.Stat(destdir + doc); err != nil || !strings.HasPrefix(doc, want+"/") {
						t.Errorf("the unit's %s does not name the installed document: %v", line, err)
					}
				case line != srcLines[i]:
					t.Errorf("installed unit line %d: %q, scripts/gpucr-helper.service has %q", i+1, line, srcLines[i])
				}
			}
			if len(execStart) < 2 || execStart[0] != want+"/bin/gpucr" || execStart[1] != "helper" {
				t.Fatalf("the unit's ExecStart is %q, want %s/bin/gpucr helper ...", execStart, want)
			}
			checkUnitSandbox(t, string(unit))

			// make uninstall removes every file install put there, and
			// nothing else of DESTDIR (a file of another package stays);
			// of the directories, those install made, once empty: not one
			// that was there before, nor one holding another's file
			other := destdir + "/usr/lib/criu/other_plugin.so"
			if err := os.WriteFile(other, []byte("not ours"), 0o644); err != nil {
				t.Fatal(err)
			}
			defer func() {
				uargs := append([]string{}, args...)
				uargs[3] = "uninstall"
				run(t, 2*time.Minute, makeEnv(), mk, uargs...)
				var left []string
				_ = filepath.Walk(destdir, func(p string, fi os.FileInfo, err error) error {
					if err == nil && !fi.IsDir() {
						left = append(left, strings.TrimPrefix(p, destdir))
					}
					return nil
				})
				if len(left) != 1 || left[0] != "/usr/lib/criu/other_plugin.so" {
					t.Errorf("after make uninstall DESTDIR holds %v, want only the other package's plugin", left)
				}
				var dirs []string
				_ = filepath.Walk(destdir, func(p string, fi os.FileInfo, err error) error {
					if err == nil && fi.IsDir() && p != destdir {
						dirs = append(dirs, strings.TrimPrefix(p, destdir))
					}
					return nil
				})
				wantDirs := []string{"/usr", "/usr/lib", "/usr/lib/criu"}
				for d := before; d != "/"; d = filepath.Dir(d) {
					wantDirs = append(wantDirs, d)
				}
				slices.Sort(wantDirs)
				if wantDirs = slices.Compact(wantDirs); !slices.Equal(dirs, wantDirs) {
					t.Errorf("after make uninstall DESTDIR has the directories %v, want %v (those before install, and the other package's)",
						dirs, wantDirs)
				}
			}()

			sa, err := exec.LookPath("systemd-analyze")
			if err != nil {
				t.Logf("systemd-analyze not found: the unit's syntax is not verified")
				return
			}
			// verify checks that ExecStart's program exists and is executable:
			// a copy of the unit whose ExecStart points into DESTDIR.
			vdir := t.TempDir()
			staged := strings.Replace(string(unit), "ExecStart="+execStart[0]+" ", "ExecStart="+destdir+execStart[0]+" ", 1)
			if err := os.WriteFile(filepath.Join(vdir, "gpucr-helper.service"), []byte(staged), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := runErr(time.Minute, nil, sa, "verify", "--man=no", filepath.Join(vdir, "gpucr-helper.service"))
			if err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("systemd-analyze verify of the installed unit: %v\n%s", err, out)
			}
		})
	}
}

// checkUnitSandbox: nothing in the unit hides or freezes a part of the file
// system the helper may be asked to write a GPU image into.
func checkUnitSandbox(t *testing.T, unit string) {
	t.Helper()
	allowed := map[string][]string{
		"ProtectSystem":       {"no", "false", "yes", "true", "full"}, // not strict
		"ProtectHome":         {"no", "false"},
		"PrivateTmp":          {"no", "false"},
		"ReadOnlyPaths":       {},
		"InaccessiblePaths":   {},
		"TemporaryFileSystem": {},
	}
	for _, line := range strings.Split(unit, "\n") {
		key, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		values, listed := allowed[key]
		if !listed {
			continue
		}
		fine := false
		for _, v := range values {
			fine = fine || value == v
		}
		if !fine {
			t.Errorf("the unit sets %s: the helper writes GPU images into whatever directory it is asked to", line)
		}
	}
}

// makeEnv is this process's environment without what would change make's
// variables: the flags of a make this test runs under (make test), and the
// install directories the Makefile takes from the environment (?=).
func makeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "GNUMAKEFLAGS", "MAKEFILES",
			"DESTDIR", "PREFIX", "CRIU_PLUGIN_DIR", "GPUCR_LIB_DIR", "SYSTEMD_UNIT_DIR", "DOC_DIR", "BUILD":
			continue
		}
		env = append(env, kv)
	}
	return env
}
