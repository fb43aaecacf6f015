// Package served is served mode's worker: the process that owns a GPU
// context and runs the driver calls of one application process that holds
// no driver state (docs/served-mode.md). The helper keeps a pool of them
// (Pool): each is started as root, makes its context on its device while no
// application waits for it, then, once assigned, takes the application's
// user and serves that process alone, through a shared-memory ring
// (protocol/c/served.h) that the executor (exec.c) runs.
package served

/*
#cgo CFLAGS: -I${SRCDIR}/../../include -I${SRCDIR}/../../protocol/c -O2 -Wall -Wextra
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "exec.h"
#include "blas.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// ControlFD is the descriptor a worker finds its control socket at (the
// helper's end is the pool's): the first of exec's ExtraFiles.
const ControlFD = 3

// WorkerCommand is the hidden subcommand that runs a worker.
const WorkerCommand = "served-worker"

// ErrNoTemplates: gpucr served-worker runs no template (its answer to a
// template's AssignWorker, and the pool's refusal of one when it runs it).
var ErrNoTemplates = errors.New("templates need gpucr-worker (gpucr served-worker runs none)")

// RunWorker is the worker's whole life: make the context of device ordinal
// (the driver at libcuda, "" for libcuda.so.1), say so on the control
// socket, wait to be assigned, take the user, and serve the socket that
// came with the assignment until its process closes it. The control socket
// closing before the assignment (the helper gone, or letting it go) ends
// it; after, the helper is out of the way.
func RunWorker(ordinal int, libcuda, cublasDir string, ctl *os.File) error {
	// The context is current on one thread: the executor runs there.
	runtime.LockOSThread()
	nc, err := net.FileConn(ctl)
	ctl.Close()
	if err != nil {
		return fmt.Errorf("served worker: control socket: %w", err)
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		nc.Close()
		return fmt.Errorf("served worker: control descriptor %d is not a unix socket", ControlFD)
	}
	w, err := wire.New(uc)
	if err != nil {
		uc.Close()
		return fmt.Errorf("served worker: control socket: %w", err)
	}
	defer w.Close()

	began := time.Now()
	if err := prepare(libcuda, ordinal); err != nil {
		_ = w.Write(&helperpb.Response{Error: &helperpb.Error{Code: helperpb.ErrorCode_ERROR_UNAVAILABLE, Message: err.Error()}}, nil)
		return err
	}
	if cublasDir != "" {
		// Not fatal: a process's first cuBLAS call loads what it names.
		if err := preloadBlas(cublasDir); err != nil {
			fmt.Fprintf(os.Stderr, "gpucr: served worker: %v\n", err)
		}
	}
	ready := &helperpb.WorkerReady{Pid: int64(os.Getpid()), Device: uint32(ordinal), WarmNs: uint64(time.Since(began))}
	if err := w.Write(&helperpb.Response{Body: &helperpb.Response_WorkerReady{WorkerReady: ready}}, nil); err != nil {
		return fmt.Errorf("served worker: telling the helper it is ready: %w", err)
	}

	req, fds, err := w.ReadRequest()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil // the helper let the worker go unassigned
		}
		return fmt.Errorf("served worker: waiting to be assigned: %w", err)
	}
	a := req.GetAssignWorker()
	if a == nil || len(fds) != 1 {
		wire.CloseFDs(fds)
		return fmt.Errorf("served worker: expected AssignWorker with one socket, got %T with %d descriptors", req.Body, len(fds))
	}
	if a.Template {
		// The script's file: gpucr-worker runs templates, this worker none.
		wire.CloseFDs(fds)
		_ = w.Write(&helperpb.Response{Id: req.Id, Error: &helperpb.Error{Code: helperpb.ErrorCode_ERROR_BAD_REQUEST, Message: ErrNoTemplates.Error()}}, nil)
		return ErrNoTemplates
	}
	sock := fds[0]
	defer unix.Close(sock)
	if err := takeUser(a.Uid, a.Gid, a.Groups); err != nil {
		_ = w.Write(&helperpb.Response{Id: req.Id, Error: &helperpb.Error{Code: helperpb.ErrorCode_ERROR_PERMISSION, Message: err.Error()}}, nil)
		return err
	}
	if err := w.Write(&helperpb.Response{Id: req.Id, Body: &helperpb.Response_WorkerReady{WorkerReady: ready}}, nil); err != nil {
		return fmt.Errorf("served worker: answering the assignment: %w", err)
	}
	// The helper says nothing more, and closes its end: the worker is the
	// served process's now, and serves on whether the helper runs or not.
	w.Close()
	return serve(sock, a.ClientPid)
}

func prepare(libcuda string, ordinal int) error {
	var cpath *C.char
	if libcuda != "" {
		cpath = C.CString(libcuda)
		defer C.free(unsafe.Pointer(cpath))
	}
	var buf [512]C.char
	if C.sv_prepare(cpath, C.int(ordinal), &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("served worker: device %d: %s", ordinal, C.GoString(&buf[0]))
	}
	return nil
}

// preloadBlas loads NVIDIA's cuBLAS and cuBLASLt from dir, as root and
// before any process is served: the files are the administrator's choice
// (the helper's --served-cublas), as the driver is.
func preloadBlas(dir string) error {
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	var buf [512]C.char
	if C.wblas_preload(cdir, &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("loading cuBLAS ahead from %s: %s", dir, C.GoString(&buf[0]))
	}
	return nil
}

func serve(sock int, clientPid int64) error {
	var buf [512]C.char
	if C.sv_serve(C.int(sock), &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("served worker: serving pid %d: %s", clientPid, C.GoString(&buf[0]))
	}
	return nil
}

// takeUser makes every thread of the worker the user uid, with gid and
// groups, for good: real, effective and saved ids all, so that nothing the
// served process can make the worker do runs with the helper's privileges.
// It checks that the ids took.
func takeUser(uid, gid uint32, groups []uint32) error {
	gs := make([]int, len(groups))
	for i, g := range groups {
		gs[i] = int(g)
	}
	if err := syscall.Setgroups(gs); err != nil {
		return fmt.Errorf("served worker: setgroups: %w", err)
	}
	if err := syscall.Setresgid(int(gid), int(gid), int(gid)); err != nil {
		return fmt.Errorf("served worker: setresgid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(int(uid), int(uid), int(uid)); err != nil {
		return fmt.Errorf("served worker: setresuid %d: %w", uid, err)
	}
	r, e, s := unix.Getresuid()
	if r != int(uid) || e != int(uid) || s != int(uid) {
		return fmt.Errorf("served worker: uids are %d/%d/%d after taking uid %d", r, e, s, uid)
	}
	r, e, s = unix.Getresgid()
	if r != int(gid) || e != int(gid) || s != int(gid) {
		return fmt.Errorf("served worker: gids are %d/%d/%d after taking gid %d", r, e, s, gid)
	}
	return nil
}
