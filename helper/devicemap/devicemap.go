// Package devicemap reads a device map, "OLD=NEW[,OLD=NEW...]": which GPU of
// this machine each GPU of an image goes to at a restore (`gpucr restore
// --device-map`, $GPUCR_DEVICE_MAP). It knows the syntax only: the CLI checks
// a map before anything runs, and the helper, which knows the GPUs, resolves
// the names (helper/daemon's placeGPUs).
package devicemap

import (
	"fmt"
	"strings"
)

// Entry is one OLD=NEW of a device map, as written: each a GPU UUID, a
// unique start of one, or an ordinal.
type Entry struct{ Old, New string }

// Parse reads s (spaces around the parts are ignored; "" is no map).
func Parse(s string) ([]Entry, error) {
	var out []Entry
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		o, n, ok := strings.Cut(part, "=")
		o, n = strings.TrimSpace(o), strings.TrimSpace(n)
		if !ok || o == "" || n == "" || strings.Contains(n, "=") {
			return nil, fmt.Errorf("device-map %q: %q is not OLD=NEW (a GPU UUID, a unique start of one, or an ordinal on each side)", s, strings.TrimSpace(part))
		}
		out = append(out, Entry{o, n})
	}
	return out, nil
}
