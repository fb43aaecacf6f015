package served

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/wire"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// Defaults of PoolConfig's zero fields.
const (
	DefaultStartTimeout    = 60 * time.Second
	DefaultTemplateTimeout = 5 * time.Minute
	DefaultMaxPerUID       = 16
)

// PoolConfig is how the helper keeps its workers.
type PoolConfig struct {
	// Exe is the gpucr binary the workers run ("": /proc/self/exe, the
	// helper's own, even if the file was replaced since it started), and
	// Args what comes before the worker's own arguments (a dynamic loader
	// that runs gpucr takes its library path and gpucr's file there).
	Exe  string
	Args []string
	// Native: Exe is gpucr-worker, which runs templates (gpucr's own
	// served-worker runs none).
	Native bool
	// Size is how many idle, pre-warmed workers each device keeps.
	Size int
	// Devices is how many devices there are (ordinals 0..Devices-1).
	Devices int
	// LibCUDA is the driver the workers load ("": libcuda.so.1).
	LibCUDA string
	// CublasDir holds NVIDIA's cuBLAS and cuBLASLt, which each worker loads
	// ahead of its assignment ("": none; a process's first cuBLAS call loads
	// them then).
	CublasDir string
	// Env is the workers' environment (nil: the helper's, narrowed by
	// WorkerEnv).
	Env []string
	// StartTimeout bounds a worker's start, its context included.
	StartTimeout time.Duration
	// TemplateTimeout bounds a template's script (its module loads).
	TemplateTimeout time.Duration
	// MaxPerUID bounds the workers assigned to one uid at a time (root's
	// are not bounded): each holds a context on a device, which the helper
	// made on the user's behalf.
	MaxPerUID int
	Log       *zap.Logger
}

// Pool is the helper's workers: idle ones per device, made ahead of time,
// and those serving a process. An assigned worker is the served process's
// alone: it runs as that user, and it ends when that process closes its
// socket, whether the helper still runs or not.
type Pool struct {
	cfg PoolConfig

	mu       sync.Mutex
	idle     map[int][]*Worker
	starting map[int]int
	assigned map[*Worker]struct{}
	perUID   map[uint32]int
	closed   bool
	// failing holds, per device, the last start's error while starts fail:
	// the pool does not start another in the background until a Take asks.
	failing map[int]error
	// templates: workers that ran a template's script and wait for its
	// process (template.go), by the script's token. Each is counted in
	// perUID.
	templates map[string]*Worker
}

// Worker is one worker process, as the pool sees it.
type Worker struct {
	pid    int
	device int
	cmd    *exec.Cmd
	ctl    *wire.Conn
	warm   time.Duration
	exited chan struct{}

	// set when assigned (under the pool's lock)
	uid       uint32
	clientPid int64
	since     time.Time
	// set while it is a template (under the pool's lock)
	tmpl *templateOf
}

// Pid is the worker's process id.
func (w *Worker) Pid() int { return w.pid }

// Device is the ordinal of the worker's device.
func (w *Worker) Device() int { return w.device }

// NewPool starts the idle workers of every device in the background.
func NewPool(cfg PoolConfig) *Pool {
	if cfg.Exe == "" {
		cfg.Exe = "/proc/self/exe"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.TemplateTimeout <= 0 {
		cfg.TemplateTimeout = DefaultTemplateTimeout
	}
	if cfg.MaxPerUID <= 0 {
		cfg.MaxPerUID = DefaultMaxPerUID
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Env == nil {
		cfg.Env = WorkerEnv(os.Environ())
	}
	p := &Pool{cfg: cfg, idle: map[int][]*Worker{}, starting: map[int]int{}, assigned: map[*Worker]struct{}{},
		perUID: map[uint32]int{}, failing: map[int]error{}, templates: map[string]*Worker{}}
	p.mu.Lock()
	for d := 0; d < cfg.Devices; d++ {
		p.fillLocked(d)
	}
	p.mu.Unlock()
	return p
}

// fillLocked starts workers in the background until device d has Size
// idle or starting ones.
func (p *Pool) fillLocked(d int) {
	if p.closed || p.failing[d] != nil {
		return
	}
	for len(p.idle[d])+p.starting[d] < p.cfg.Size {
		p.starting[d]++
		go func() {
			w, err := p.start(d)
			p.mu.Lock()
			defer p.mu.Unlock()
			p.starting[d]--
			if err != nil {
				p.failing[d] = err
				p.cfg.Log.Warn("served mode: starting a worker", zap.Int("device", d), zap.Error(err))
				return
			}
			if p.closed {
				w.ctl.Close() // it ends unassigned
				return
			}
			p.idle[d] = append(p.idle[d], w)
		}()
	}
}

// addrNoRandomize is personality(2)'s ADDR_NO_RANDOMIZE.
const addrNoRandomize = 0x0040000

// startUnrandomized starts cmd with its address space laid out without
// randomization. A process moved to another worker keeps its device
// addresses, which the first worker's driver chose in that worker's address
// space: with every worker laid out alike, the addresses one worker's
// driver gave out are free in the next (with randomization a new worker's
// libraries can sit where the process's memory was). The personality is a
// thread's, inherited by what it forks: set on this locked thread around
// the fork alone.
func startUnrandomized(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	old, _, errno := syscall.RawSyscall(syscall.SYS_PERSONALITY, 0xffffffff, 0, 0)
	if errno != 0 {
		return cmd.Start() // no personality to set: randomized as before
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PERSONALITY, old|addrNoRandomize, 0, 0); errno != 0 {
		return cmd.Start()
	}
	err := cmd.Start()
	syscall.RawSyscall(syscall.SYS_PERSONALITY, old, 0, 0) //nolint:errcheck // restoring what was read back just now
	return err
}

// start runs one worker and waits until it has made its context.
func (p *Pool) start(d int) (*Worker, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("worker for device %d: socketpair: %w", d, err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "served-control"), os.NewFile(uintptr(fds[1]), "served-control-worker")
	defer theirs.Close()
	args := append(append([]string{}, p.cfg.Args...), WorkerCommand, "--device", fmt.Sprint(d))
	if p.cfg.LibCUDA != "" {
		args = append(args, "--libcuda", p.cfg.LibCUDA)
	}
	if p.cfg.CublasDir != "" {
		args = append(args, "--cublas", p.cfg.CublasDir)
	}
	cmd := exec.Command(p.cfg.Exe, args...)
	cmd.Env = p.cfg.Env
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{theirs} // ControlFD
	// A session of its own: a signal to the helper's process group (a
	// terminal's ^C) is not one to the processes it serves.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := startUnrandomized(cmd); err != nil {
		mine.Close()
		return nil, fmt.Errorf("worker for device %d: %w", d, err)
	}
	w := &Worker{pid: cmd.Process.Pid, device: d, cmd: cmd, exited: make(chan struct{})}
	go p.reap(w)
	nc, err := net.FileConn(mine)
	mine.Close()
	if err == nil {
		w.ctl, err = wire.New(nc.(*net.UnixConn))
	}
	if err != nil {
		w.kill()
		return nil, fmt.Errorf("worker for device %d: control socket: %w", d, err)
	}
	ready, err := w.answer(p.cfg.StartTimeout)
	if err != nil {
		w.kill()
		return nil, fmt.Errorf("worker %d for device %d: %w", w.pid, d, err)
	}
	w.warm = time.Duration(ready.WarmNs)
	p.cfg.Log.Debug("served mode: worker ready", zap.Int("pid", w.pid), zap.Int("device", d), zap.Duration("warm", w.warm))
	return w, nil
}

// answer reads the worker's WorkerReady (or its error) within timeout.
func (w *Worker) answer(timeout time.Duration) (*helperpb.WorkerReady, error) {
	uc := w.ctl.UnixConn()
	_ = uc.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = uc.SetReadDeadline(time.Time{}) }()
	resp, fds, err := w.ctl.ReadResponse()
	wire.CloseFDs(fds)
	if err != nil {
		return nil, fmt.Errorf("no answer: %w", err)
	}
	if resp.Error != nil {
		return nil, errors.New(resp.Error.Message)
	}
	r := resp.GetWorkerReady()
	if r == nil || r.Pid != int64(w.pid) {
		return nil, fmt.Errorf("unexpected answer %T", resp.Body)
	}
	return r, nil
}

// reap waits for the worker's end and forgets it.
func (p *Pool) reap(w *Worker) {
	err := w.cmd.Wait()
	close(w.exited)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.assigned[w]; ok {
		delete(p.assigned, w)
		p.releaseUIDLocked(w.uid)
		p.cfg.Log.Debug("served mode: worker ended", zap.Int("pid", w.pid), zap.Int64("client_pid", w.clientPid), zap.Error(err))
		return
	}
	if t := w.tmpl; t != nil && p.templates[t.token] == w {
		delete(p.templates, t.token)
		p.releaseUIDLocked(t.uid)
		p.cfg.Log.Info("served mode: a template ended", zap.Int("pid", w.pid), zap.String("image", t.image), zap.Error(err))
		return
	}
	idle := p.idle[w.device]
	for i, x := range idle {
		if x == w {
			p.idle[w.device] = append(idle[:i:i], idle[i+1:]...)
			p.cfg.Log.Warn("served mode: an idle worker ended", zap.Int("pid", w.pid), zap.Int("device", w.device), zap.Error(err))
			break
		}
	}
}

func (w *Worker) kill() {
	_ = w.cmd.Process.Kill()
	if w.ctl != nil {
		w.ctl.Close()
	}
	<-w.exited
}

// WorkerEnv is what of the helper's environment a worker gets: what finds
// and sets up the driver (PATH, LD_LIBRARY_PATH, CUDA_*, NVIDIA_*, GPUCR_*,
// the NVLink multicast switches of NCCL and NVSHMEM) and nothing else. A
// worker runs as its user with the helper's environment in its memory, so
// the rest (credentials a unit file sets, say) stays with the helper.
func WorkerEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "LD_LIBRARY_PATH", k == "TMPDIR",
			strings.HasPrefix(k, "CUDA_"), strings.HasPrefix(k, "NVIDIA_"), strings.HasPrefix(k, "GPUCR_"),
			strings.HasPrefix(k, "NCCL_"), strings.HasPrefix(k, "NVSHMEM_"):
			out = append(out, kv)
		}
	}
	return out
}

// releaseUIDLocked gives back one of uid's workers counted against
// MaxPerUID.
func (p *Pool) releaseUIDLocked(uid uint32) {
	if p.perUID[uid]--; p.perUID[uid] <= 0 {
		delete(p.perUID, uid)
	}
}

// ErrPerUID is the refusal of a worker past PoolConfig.MaxPerUID.
var ErrPerUID = errors.New("too many served processes for this user")

// Serve assigns a worker of device d to the process pid of uid (gid,
// groups) and gives it sock, the worker's end of that process's socket:
// from the pool's idle workers, or one started now if there is none. The
// pool then starts another in the background.
//
// token (may be empty) names a template's script: the template that ran
// it is assigned instead, if it is of this device, user, group and groups
// (template says so); a template of anything else is left alone.
func (p *Pool) Serve(d int, uid, gid uint32, groups []uint32, pid int64, sock int, token []byte) (w *Worker, template bool, err error) {
	if d < 0 || d >= p.cfg.Devices {
		return nil, false, fmt.Errorf("no device %d (the helper has %d)", d, p.cfg.Devices)
	}
	if w := p.takeTemplate(token, d, uid, gid, groups); w != nil {
		if err := w.assign(uid, gid, groups, pid, sock, false, p.cfg.StartTimeout); err == nil {
			p.keepAssigned(w, uid, pid)
			return w, true, nil
		} else {
			p.drop(w, uid) // and the template's count, which takeTemplate left
			p.cfg.Log.Warn("served mode: a template did not take its process; a worker from the pool does", zap.Error(err))
		}
	}
	if w, err = p.takeWorker(d, uid); err != nil {
		return nil, false, err
	}
	if err := w.assign(uid, gid, groups, pid, sock, false, p.cfg.StartTimeout); err != nil {
		p.drop(w, uid)
		return nil, false, err
	}
	p.keepAssigned(w, uid, pid)
	return w, false, nil
}

// takeWorker counts one of uid's workers against MaxPerUID and takes an
// idle worker of device d, or one started now; the pool starts another in
// the background. The count is the caller's to give back (drop,
// releaseUIDLocked) or to keep with the worker.
func (p *Pool) takeWorker(d int, uid uint32) (*Worker, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("the helper is stopping")
	}
	if uid != 0 && p.perUID[uid] >= p.cfg.MaxPerUID { // root is not limited
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: uid %d has %d (the helper's --served-max-per-uid)", ErrPerUID, uid, p.cfg.MaxPerUID)
	}
	p.perUID[uid]++ // held while this assignment is under way
	var w *Worker
	if idle := p.idle[d]; len(idle) > 0 {
		w = idle[0]
		p.idle[d] = idle[1:]
	}
	delete(p.failing, d) // asked for: starts may try again
	p.fillLocked(d)
	p.mu.Unlock()
	if w != nil {
		return w, nil
	}
	w, err := p.start(d)
	if err != nil {
		p.mu.Lock()
		p.releaseUIDLocked(uid)
		p.mu.Unlock()
		return nil, err
	}
	return w, nil
}

// drop ends w, which took no process, and gives back uid's count of it.
func (p *Pool) drop(w *Worker, uid uint32) {
	w.kill() // outside the lock: its reaper takes it
	p.mu.Lock()
	p.releaseUIDLocked(uid)
	p.mu.Unlock()
}

// keepAssigned records w as serving process pid of uid, unless it has served
// and ended already.
func (p *Pool) keepAssigned(w *Worker, uid uint32, pid int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w.uid, w.clientPid, w.since = uid, pid, time.Now()
	select {
	case <-w.exited:
		p.releaseUIDLocked(uid)
	default:
		p.assigned[w] = struct{}{}
	}
}

// assign gives w the user and fd: the served process's socket, or with
// template a template's script (the worker's control socket stays open
// then, for the assignment of its process).
func (w *Worker) assign(uid, gid uint32, groups []uint32, pid int64, fd int, template bool, timeout time.Duration) error {
	_, err := w.assignFor(uid, gid, groups, pid, fd, template, timeout)
	return err
}

func (w *Worker) assignFor(uid, gid uint32, groups []uint32, pid int64, fd int, template bool, timeout time.Duration) (*helperpb.WorkerReady, error) {
	req := &helperpb.Request{Id: 1, Body: &helperpb.Request_AssignWorker{AssignWorker: &helperpb.AssignWorker{
		Uid: uid, Gid: gid, Groups: groups, ClientPid: pid, Template: template}}}
	if err := w.ctl.Write(req, []int{fd}); err != nil {
		return nil, fmt.Errorf("worker %d: assigning: %w", w.pid, err)
	}
	ready, err := w.answer(timeout)
	if err != nil {
		if template {
			return nil, fmt.Errorf("worker %d: the template's script as uid %d: %w", w.pid, uid, err)
		}
		return nil, fmt.Errorf("worker %d: taking uid %d: %w", w.pid, uid, err)
	}
	if !template {
		// The worker needs nothing more from the helper; it ends with its process.
		w.ctl.Close()
	}
	return ready, nil
}

// WorkerInfo is one worker, for Status.
type WorkerInfo struct {
	Pid       int
	Device    int
	Assigned  bool
	UID       uint32
	ClientPid int64
	Warm      time.Duration
	Since     time.Time
}

// Workers lists the pool's workers, idle ones first, by device then pid.
func (p *Pool) Workers() []WorkerInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []WorkerInfo
	for d, ws := range p.idle {
		for _, w := range ws {
			out = append(out, WorkerInfo{Pid: w.pid, Device: d, Warm: w.warm})
		}
	}
	for w := range p.assigned {
		out = append(out, WorkerInfo{Pid: w.pid, Device: w.device, Assigned: true, UID: w.uid, ClientPid: w.clientPid,
			Warm: w.warm, Since: w.since})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Assigned != b.Assigned {
			return !a.Assigned
		}
		if a.Device != b.Device {
			return a.Device < b.Device
		}
		return a.Pid < b.Pid
	})
	return out
}

// Close ends the idle workers (their control sockets close, and they end
// unassigned) and waits up to timeout for them. Assigned workers serve on:
// each belongs to its process now.
func (p *Pool) Close(timeout time.Duration) {
	p.mu.Lock()
	p.closed = true
	var idle []*Worker
	for _, ws := range p.idle {
		idle = append(idle, ws...)
	}
	p.idle = map[int][]*Worker{}
	p.mu.Unlock()
	for _, w := range idle {
		w.ctl.Close()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	expired := false
	for _, w := range idle {
		if !expired {
			select {
			case <-w.exited:
				continue
			case <-timer.C:
				expired = true
			}
		}
		_ = w.cmd.Process.Kill()
		<-w.exited
	}
}
