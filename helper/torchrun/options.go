// Package torchrun is `gpucr torchrun`'s own part: torchrun's command line
// read as torchrun reads it, the job it describes (Plan), the environment
// each rank gets, and the supervision of the ranks.
//
// torchrun's agent cannot be checkpointed (tests/gpu/README.md, "What in
// torchrun's agent CRIU cannot dump"): its two TCPStore servers run libuv
// loops that hold io_uring instances, and it initialises CUDA. gpucr
// torchrun takes the agent's place for fixed-size jobs: it starts the ranks
// itself, with the environment torchrun gives them, and rank 0 hosts the
// store as torch.multiprocessing.spawn jobs do (env://).
package torchrun

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Options is torchrun's command line as given, before it is checked
// against what gpucr torchrun can run (NewPlan). Fields hold the raw values
// where torchrun accepts several forms (NprocPerNode, Nnodes).
type Options struct {
	Standalone       bool
	NprocPerNode     string // N, gpu, cpu or auto
	Nnodes           string // N or MIN:MAX
	NodeRank         int
	MasterAddr       string
	MasterPort       int
	RdzvBackend      string
	RdzvEndpoint     string
	RdzvID           string
	RdzvConf         string
	MaxRestarts      int
	MonitorInterval  float64
	StartMethod      string
	Role             string
	LogDir           string
	Redirects        string
	Tee              string
	LocalAddr        string
	LocalRanksFilter string
	RunPath          bool
	Module           bool
	NoPython         bool

	Program string   // the script, the module (Module) or the program (NoPython)
	Args    []string // its arguments, everything after it
}

// kind is how an option takes its value.
type kind int

const (
	flag    kind = iota // no value: --standalone
	str                 // a string
	number              // an integer
	decimal             // a floating-point number
)

// option is one of torchrun's options: its name with underscores (argparse's
// dest, which PET_ upper-cased makes the environment variable of its
// default), its short forms, and where its value goes.
type option struct {
	dest   string
	short  string
	kind   kind
	target func(o *Options) any // *bool, *string, *int or *float64
}

// options are torchrun's options, each with its default (defaults). Every
// one can be spelt with dashes or underscores (--nproc-per-node,
// --nproc_per_node), as torchrun accepts both.
var options = []option{
	{dest: "standalone", kind: flag, target: func(o *Options) any { return &o.Standalone }},
	{dest: "nproc_per_node", kind: str, target: func(o *Options) any { return &o.NprocPerNode }},
	{dest: "nnodes", kind: str, target: func(o *Options) any { return &o.Nnodes }},
	{dest: "node_rank", kind: number, target: func(o *Options) any { return &o.NodeRank }},
	{dest: "master_addr", kind: str, target: func(o *Options) any { return &o.MasterAddr }},
	{dest: "master_port", kind: number, target: func(o *Options) any { return &o.MasterPort }},
	{dest: "rdzv_backend", kind: str, target: func(o *Options) any { return &o.RdzvBackend }},
	{dest: "rdzv_endpoint", kind: str, target: func(o *Options) any { return &o.RdzvEndpoint }},
	{dest: "rdzv_id", kind: str, target: func(o *Options) any { return &o.RdzvID }},
	{dest: "rdzv_conf", kind: str, target: func(o *Options) any { return &o.RdzvConf }},
	{dest: "max_restarts", kind: number, target: func(o *Options) any { return &o.MaxRestarts }},
	{dest: "monitor_interval", kind: decimal, target: func(o *Options) any { return &o.MonitorInterval }},
	{dest: "start_method", kind: str, target: func(o *Options) any { return &o.StartMethod }},
	{dest: "role", kind: str, target: func(o *Options) any { return &o.Role }},
	{dest: "log_dir", kind: str, target: func(o *Options) any { return &o.LogDir }},
	{dest: "redirects", short: "r", kind: str, target: func(o *Options) any { return &o.Redirects }},
	{dest: "tee", short: "t", kind: str, target: func(o *Options) any { return &o.Tee }},
	{dest: "local_addr", kind: str, target: func(o *Options) any { return &o.LocalAddr }},
	{dest: "local_ranks_filter", kind: str, target: func(o *Options) any { return &o.LocalRanksFilter }},
	{dest: "run_path", kind: flag, target: func(o *Options) any { return &o.RunPath }},
	{dest: "module", short: "m", kind: flag, target: func(o *Options) any { return &o.Module }},
	{dest: "no_python", kind: flag, target: func(o *Options) any { return &o.NoPython }},
}

// defaults are torchrun's defaults (facts of its command line).
func defaults() Options {
	return Options{
		NprocPerNode:    "1",
		Nnodes:          "1:1",
		MasterAddr:      "127.0.0.1",
		MasterPort:      29500,
		RdzvBackend:     "static",
		RdzvID:          "none",
		MonitorInterval: 0.1,
		StartMethod:     "spawn",
		Role:            "default",
		Redirects:       "0",
		Tee:             "0",
	}
}

// UsageError is a command line gpucr torchrun refuses: the caller exits 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

func usagef(format string, a ...any) error { return UsageError{fmt.Errorf(format, a...)} }

// Parse reads torchrun's command line (without "torchrun" itself): options
// up to the first argument that is none, which is the script (or module,
// or program), and everything after it is the script's. An option's
// default comes from PET_<DEST> in the environment (getenv), as torchrun
// takes it, then from torchrun's own default.
func Parse(args []string, getenv func(string) string) (Options, error) {
	o := defaults()
	for _, opt := range options {
		v := getenv("PET_" + strings.ToUpper(opt.dest))
		if v == "" {
			continue
		}
		if opt.kind == flag {
			// torchrun reads a flag's variable as an integer: 1 sets it
			n, err := strconv.Atoi(v)
			if err != nil {
				return o, usagef("PET_%s=%s: want 0 or 1", strings.ToUpper(opt.dest), v)
			}
			*opt.target(&o).(*bool) = n != 0
			continue
		}
		if err := set(&o, opt, v); err != nil {
			return o, usagef("PET_%s=%s: %w", strings.ToUpper(opt.dest), v, err)
		}
	}
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if a == "-" || !strings.HasPrefix(a, "-") {
			break
		}
		name, value, hasValue := strings.Cut(a, "=")
		opt, ok := lookup(name)
		if !ok {
			return o, usagef("unknown option %s (torchrun's options are taken; `gpucr torchrun --help` lists them)", name)
		}
		if opt.kind == flag {
			if hasValue {
				return o, usagef("%s takes no value", name)
			}
			*opt.target(&o).(*bool) = true
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return o, usagef("%s needs a value", name)
			}
			i++
			value = args[i]
		}
		if err := set(&o, opt, value); err != nil {
			return o, usagef("%s %s: %w", name, value, err)
		}
	}
	if i >= len(args) {
		return o, usagef("no training script given: gpucr torchrun [OPTIONS] SCRIPT [ARGS...]")
	}
	o.Program, o.Args = args[i], append([]string{}, args[i+1:]...)
	return o, nil
}

// lookup finds an option by how it is written: --dashed-name,
// --underscored_name, or its short form (-m).
func lookup(written string) (option, bool) {
	var name string
	switch {
	case strings.HasPrefix(written, "--"):
		name = strings.ReplaceAll(written[2:], "-", "_")
	case len(written) == 2:
		for _, opt := range options {
			if opt.short != "" && "-"+opt.short == written {
				return opt, true
			}
		}
		return option{}, false
	default:
		// argparse takes -nproc_per_node too (one dash, a long name)
		name = strings.ReplaceAll(written[1:], "-", "_")
	}
	for _, opt := range options {
		if opt.dest == name {
			return opt, true
		}
	}
	return option{}, false
}

// set stores value in the option's field, converted to its kind.
func set(o *Options, opt option, value string) error {
	switch p := opt.target(o).(type) {
	case *string:
		*p = value
	case *int:
		n, err := strconv.Atoi(value)
		if err != nil {
			return errors.New("want an integer")
		}
		*p = n
	case *float64:
		f, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return errors.New("want a number")
		}
		*p = f
	case *bool:
		return errors.New("takes no value")
	}
	return nil
}
