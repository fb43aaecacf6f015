package checkpoint

// A concurrent checkpoint whose copy-on-write window finds a chunk changed
// behind its back (a kernel that wrote through a pointer it loaded from
// memory, which no launch parameter names) makes no image: the helper
// refuses to write bytes other than those of the stop. The checkpoint is
// then taken again the stop-the-world way, which is exact by construction,
// and the result says so (Redone). The helper keeps the chunks the window
// did save in the image directory, so the second stop copies only the
// chunks that changed (or were not saved yet).

import (
	"errors"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// changedErr is the helper's report of such a window, as the background
// copy's failure.
type changedErr struct{ msg string }

func (e changedErr) Error() string { return e.msg }

// IsChanged says whether err is a concurrent checkpoint's copy-on-write
// window that found memory changed behind its back.
func IsChanged(err error) bool {
	if errors.As(err, &changedErr{}) {
		return true
	}
	var he *client.Error
	return errors.As(err, &he) && he.Code == helperpb.ErrorCode_ERROR_CHANGED
}

// redoReason is what a redone checkpoint's result says.
func redoReason(err error) string {
	return "the concurrent checkpoint's copy-on-write window found GPU memory changed behind its back, so it was " +
		"taken again with the process stopped while the changed chunks were copied: " + err.Error()
}
