package torchrun

import (
	"crypto/rand"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Plan is a job gpucr torchrun can run: a fixed number of nodes and of
// ranks on this one, where rank 0 hosts the store, and what each rank runs.
type Plan struct {
	Nproc      int // ranks on this node (LOCAL_WORLD_SIZE)
	Nnodes     int
	NodeRank   int
	MasterAddr string
	MasterPort int
	RunID      string
	Role       string
	Argv       []string // what every rank runs: python3 -u SCRIPT ARGS...
	// SetOMP: OMP_NUM_THREADS=1 for every rank, as torchrun sets it when
	// it is unset and a node runs more than one rank.
	SetOMP bool
	// Notes are what was accepted but means something else here, or
	// nothing: said on stderr before the ranks start.
	Notes []string
}

// Host is what a plan needs to know of this machine; tests give their own.
type Host struct {
	Getenv   func(string) string
	CPUs     func() int
	GPUs     func() (int, error)
	FreePort func() (int, error)
	Python   string // the interpreter of scripts and modules
}

// c10dDefaultPort is torchrun's port for a c10d endpoint that names none.
const c10dDefaultPort = 29400

// NewPlan checks the options against what gpucr torchrun runs (fixed-size
// jobs, no restarts, the ranks' output where the launcher's goes) and
// resolves what torchrun's agent would: the number of ranks, the master's
// address and port, the run's id.
func NewPlan(o Options, h Host) (*Plan, error) {
	p := &Plan{NodeRank: o.NodeRank, Role: o.Role}
	var err error
	if p.Nproc, err = nprocPerNode(o.NprocPerNode, h); err != nil {
		return nil, err
	}
	if p.Nnodes, err = fixedNnodes(o.Nnodes); err != nil {
		return nil, err
	}
	if o.Standalone && p.Nnodes != 1 {
		return nil, usagef("--standalone is a job of one node, not --nnodes %s", o.Nnodes)
	}
	if p.NodeRank < 0 || p.NodeRank >= p.Nnodes {
		return nil, usagef("--node-rank %d: want 0 to %d for --nnodes %d", p.NodeRank, p.Nnodes-1, p.Nnodes)
	}
	if o.MaxRestarts != 0 {
		// A restarted group would start from the script's beginning; with
		// gpucr the way back from a failure is the last checkpoint
		// (gpucr restore), not a restart, so none is pretended here.
		return nil, usagef("--max-restarts %d: gpucr torchrun restarts no rank; restore the job from its last `gpucr checkpoint` instead (pass --max-restarts 0 or leave it out)", o.MaxRestarts)
	}
	if o.MonitorInterval < 0 {
		return nil, usagef("--monitor-interval %g: want 0 or more seconds", o.MonitorInterval)
	}
	switch o.StartMethod {
	case "spawn", "fork", "forkserver":
		// every rank is a new program whatever the method: as spawn
	default:
		return nil, usagef("--start-method %s: want spawn, fork or forkserver", o.StartMethod)
	}
	if err := outputOptions(o, p); err != nil {
		return nil, err
	}
	if err := rendezvous(o, h, p); err != nil {
		return nil, err
	}
	if p.Argv, err = argv(o, h.Python); err != nil {
		return nil, err
	}
	if p.Nproc > 1 && h.Getenv("OMP_NUM_THREADS") == "" {
		p.SetOMP = true
		p.Notes = append(p.Notes, fmt.Sprintf("OMP_NUM_THREADS=1 for each of the %d ranks, as torchrun sets it (it was unset): "+
			"set it yourself to tune the threads of each rank", p.Nproc))
	}
	return p, nil
}

// nprocPerNode is --nproc-per-node as a number: gpu is the GPUs this
// process may use, cpu the CPUs, auto the GPUs if there are any, else the
// CPUs.
func nprocPerNode(v string, h Host) (int, error) {
	switch v {
	case "cpu":
		return h.CPUs(), nil
	case "gpu", "auto":
		n, err := h.GPUs()
		if err != nil {
			return 0, fmt.Errorf("--nproc-per-node %s: counting the GPUs: %w", v, err)
		}
		if n > 0 {
			return n, nil
		}
		if v == "auto" {
			return h.CPUs(), nil
		}
		return 0, usagef("--nproc-per-node gpu: this process sees no GPU (CUDA_VISIBLE_DEVICES, /dev/nvidia*)")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, usagef("--nproc-per-node %s: want a number of ranks (1 or more), gpu, cpu or auto", v)
	}
	return n, nil
}

// fixedNnodes is --nnodes N, or MIN:MAX with MIN = MAX: gpucr torchrun
// runs no elastic job, whose size changes as nodes come and go.
func fixedNnodes(v string) (int, error) {
	lo, hi, isRange := strings.Cut(v, ":")
	n, err := strconv.Atoi(lo)
	if err != nil || n < 1 {
		return 0, usagef("--nnodes %s: want a number of nodes, or MIN:MAX", v)
	}
	if isRange {
		m, err := strconv.Atoi(hi)
		if err != nil || m < n {
			return 0, usagef("--nnodes %s: want MIN:MAX with MIN <= MAX", v)
		}
		if m != n {
			return 0, usagef("--nnodes %s: an elastic job (its size between %d and %d nodes) is not supported by gpucr torchrun; give a fixed size: --nnodes N", v, n, m)
		}
	}
	return n, nil
}

// outputOptions accepts what leaves every rank's output where the
// launcher's goes (torchrun's default), and refuses the redirections to
// files and their filters.
func outputOptions(o Options, p *Plan) error {
	if o.Redirects != "0" && o.Redirects != "" {
		return usagef("--redirects %s: not supported; every rank writes to gpucr torchrun's stdout and stderr (redirect those)", o.Redirects)
	}
	if o.Tee != "0" && o.Tee != "" {
		return usagef("--tee %s: not supported; every rank writes to gpucr torchrun's stdout and stderr (pipe those through tee)", o.Tee)
	}
	if o.LocalRanksFilter != "" {
		return usagef("--local-ranks-filter %s: not supported; every rank writes to gpucr torchrun's stdout and stderr", o.LocalRanksFilter)
	}
	if o.LogDir != "" {
		p.Notes = append(p.Notes, fmt.Sprintf("--log-dir %s: nothing is written there; the ranks write to gpucr torchrun's stdout and stderr", o.LogDir))
	}
	return nil
}

// rendezvous sets where rank 0 hosts the store (MASTER_ADDR, MASTER_PORT)
// and the run's id. torchrun's agent hosts a store there and its ranks join
// it; here rank 0 hosts it itself (env://), at the address every node's
// ranks are given.
func rendezvous(o Options, h Host, p *Plan) error {
	if o.RdzvConf != "" {
		p.Notes = append(p.Notes, fmt.Sprintf("--rdzv-conf %s: ignored (rank 0 hosts the store; there is no rendezvous to configure)", o.RdzvConf))
	}
	p.RunID = o.RdzvID
	if o.Standalone {
		// torchrun gives its ranks this host's fully qualified name and a
		// free port. localhost is as good on one node, and resolves where
		// the host's own name does not (containers).
		p.MasterAddr = "localhost"
		if o.LocalAddr != "" {
			p.MasterAddr = o.LocalAddr
		}
		port, err := h.FreePort()
		if err != nil {
			return fmt.Errorf("--standalone: choosing a free port: %w", err)
		}
		p.MasterPort = port
		p.RunID = uuid()
		return nil
	}
	switch o.RdzvBackend {
	case "static", "c10d":
	default:
		return usagef("--rdzv-backend %s: gpucr torchrun runs static and c10d jobs of a fixed size", o.RdzvBackend)
	}
	p.MasterAddr, p.MasterPort = o.MasterAddr, o.MasterPort
	if o.RdzvEndpoint != "" {
		// The endpoint is node 0's: there rank 0 hosts the store.
		host, port, err := endpoint(o.RdzvEndpoint, o.RdzvBackend, o.MasterPort)
		if err != nil {
			return err
		}
		p.MasterAddr, p.MasterPort = host, port
	}
	if p.MasterPort == 0 {
		if p.Nnodes != 1 {
			return usagef("port 0 (any free port) needs --nnodes 1: the other nodes must know the port")
		}
		port, err := h.FreePort()
		if err != nil {
			return fmt.Errorf("choosing a free port: %w", err)
		}
		p.MasterPort = port
	}
	if p.MasterPort < 0 || p.MasterPort > 65535 {
		return usagef("master port %d: want 0 to 65535", p.MasterPort)
	}
	return nil
}

// endpoint splits --rdzv-endpoint HOST[:PORT]; a c10d endpoint without a
// port has torchrun's c10d port, a static one the master port.
func endpoint(v, backend string, masterPort int) (string, int, error) {
	def := masterPort
	if backend == "c10d" {
		def = c10dDefaultPort
	}
	if !strings.Contains(v, ":") || strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") {
		return strings.Trim(v, "[]"), def, nil // no port
	}
	host, portText, err := net.SplitHostPort(v)
	if err != nil {
		return "", 0, usagef("--rdzv-endpoint %s: want HOST[:PORT]", v)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || host == "" {
		return "", 0, usagef("--rdzv-endpoint %s: want HOST[:PORT]", v)
	}
	return host, port, nil
}

// argv is what each rank runs: the script as `python3 -u SCRIPT ARGS`
// (torchrun runs its own interpreter; gpucr is no Python program, so it is
// PATH's python3, the one of an activated virtual environment), a module
// as `python3 -u -m MODULE ARGS`, or the program itself (--no-python).
func argv(o Options, python string) ([]string, error) {
	if o.NoPython && o.Module {
		return nil, usagef("--no-python and -m/--module: a module is run by Python")
	}
	if o.NoPython && o.RunPath {
		return nil, usagef("--no-python and --run-path: a script's path is run by Python")
	}
	if o.NoPython {
		return append([]string{o.Program}, o.Args...), nil
	}
	// --run-path runs the script through runpy in torchrun's worker: the
	// script sees what it sees when run as python3 -u SCRIPT.
	a := []string{python, "-u"}
	if o.Module {
		a = append(a, "-m")
	}
	return append(append(a, o.Program), o.Args...), nil
}

// uuid is a random (version 4) UUID: the run id of a standalone job, as
// torchrun makes one.
func uuid() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (Go 1.24)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
