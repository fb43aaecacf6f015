// Package testroot finds the repository's top directory for tests: the
// directory of go.mod, looked for upward from the directory the test binary
// started in (go test runs a package's tests in that package's directory).
package testroot

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// start is the working directory when the test binary started, before any
// test could change it.
var start, startErr = os.Getwd()

// Dir returns the repository's top directory, absolute; it fails the test
// when there is no go.mod above the package's directory.
func Dir(t testing.TB) string {
	t.Helper()
	d, err := find(start, startErr)
	if err != nil {
		t.Fatalf("cannot locate the repository: %v", err)
	}
	return d
}

func find(dir string, err error) (string, error) {
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("no go.mod in " + dir + " or above it")
		}
	}
}
