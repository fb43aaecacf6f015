package cuda

/*
#include <stdlib.h>
#include "probe.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// ProbeResult is what Probe saw of a driver library.
type ProbeResult struct {
	Path                 string   // the file loaded ("" if unknown)
	Version              int      // cuDriverGetVersion; 0 if unknown
	MissingCheckpointAPI []string // entry points of CheckpointAPI it lacks
}

// Probe opens the driver library at path on its own (whether or not Load
// could use it: a driver without the checkpoint API fails Load) and says
// which file it is, its version and which checkpoint entry points it lacks.
// An error: it does not open.
func Probe(path string) (ProbeResult, error) {
	var r ProbeResult
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	names := make([]*C.char, len(CheckpointAPI))
	for i, n := range CheckpointAPI {
		names[i] = C.CString(n)
		defer C.free(unsafe.Pointer(names[i]))
	}
	cnames := (**C.char)(C.malloc(C.size_t(len(names)) * C.size_t(unsafe.Sizeof(names[0]))))
	defer C.free(unsafe.Pointer(cnames))
	copy(unsafe.Slice(cnames, len(names)), names)
	present := make([]C.int, len(names))
	var file, errBuf [1024]C.char
	var v C.int
	if C.gs_probe(cpath, &file[0], C.size_t(len(file)), &v, cnames, C.int(len(names)), &present[0],
		&errBuf[0], C.size_t(len(errBuf))) != 0 {
		return r, errors.New(C.GoString(&errBuf[0]))
	}
	r.Path = C.GoString(&file[0])
	r.Version = int(v)
	for i, ok := range present {
		if ok == 0 {
			r.MissingCheckpointAPI = append(r.MissingCheckpointAPI, CheckpointAPI[i])
		}
	}
	return r, nil
}
