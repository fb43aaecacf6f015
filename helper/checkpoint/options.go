// Package checkpoint checkpoints and restores whole process trees that use
// NVIDIA GPUs: CRIU's RPC (criu swrk, package swrk) with gpucr's plugin,
// which moves the GPU state through the helper. It is what `gpucr
// checkpoint`, `gpucr restore` and `gpucr migrate` run, and what any other
// program (a container runtime's hook, a test harness) can call: typed
// options, a context for deadlines and cancellation, events for progress,
// results as structs. It reads no flags and no process environment; the
// caller resolves those (which CRIU, which plugin directory, PATH) and says
// so in the options.
package checkpoint

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// CRIU says which CRIU runs and how.
type CRIU struct {
	// Binary is the criu executable.
	Binary string
	// PluginDir holds gpucr_plugin.so; "" runs CRIU without it, and
	// NoPlugin then says why (where it was looked for), for messages.
	PluginDir string
	NoPlugin  string
	// Timeout is the deadline of one CRIU run (0: DefaultTimeout); CRIU is
	// killed then, and a dump's processes run on.
	Timeout time.Duration

	// CRIU's own options, as its command line names them.
	ShellJob        bool     // --shell-job: the tree was started from a shell
	TCPEstablished  bool     // --tcp-established: checkpoint open TCP connections
	TCPClose        bool     // --tcp-close: restore open TCP connections closed
	TCPSkipInFlight bool     // --skip-in-flight: leave half-open connections out
	ExtUnixSockets  bool     // --ext-unix-sk: unix sockets connected outside the tree
	FileLocks       bool     // --file-locks
	LinkRemap       bool     // --link-remap: open files that were unlinked
	GhostLimit      uint32   // --ghost-limit: the largest file without a name left that a dump copies (0: CRIU's, 1 MiB)
	External        []string // --external RES, each
	ManageCgroups   string   // --manage-cgroups MODE: "", none, props, soft, full, strict, ignore
	NetworkLock     string   // --network-lock METHOD: "" (CRIU's default, iptables), iptables, nftables, skip
	LogLevel        int      // -v: 0 means 4 (everything gpucr needs to explain a failure)
	// Extra are further CRIU options, each as a line of CRIU's configuration
	// file ("tcp-established", "external mnt[]:m", "ghost-limit 10M"): CRIU
	// reads them as it reads its command line.
	Extra []string
}

// DefaultTimeout bounds a CRIU run: CRIU copies the process memory, and the
// plugin all GPU memory, within it.
const DefaultTimeout = 10 * time.Minute

func (c CRIU) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultTimeout
	}
	return c.Timeout
}

// manageCgroupsModes are CRIU's --manage-cgroups modes (rpc.CriuCgMode).
var manageCgroupsModes = map[string]rpc.CriuCgMode{
	"ignore": rpc.CriuCgMode_IGNORE, "none": rpc.CriuCgMode_CG_NONE, "props": rpc.CriuCgMode_PROPS,
	"soft": rpc.CriuCgMode_SOFT, "full": rpc.CriuCgMode_FULL, "strict": rpc.CriuCgMode_STRICT,
}

// networkLockMethods are CRIU's --network-lock methods
// (rpc.CriuNetworkLockMethod).
var networkLockMethods = map[string]rpc.CriuNetworkLockMethod{
	"iptables": rpc.CriuNetworkLockMethod_IPTABLES, "nftables": rpc.CriuNetworkLockMethod_NFTABLES,
	"skip": rpc.CriuNetworkLockMethod_SKIP,
}

// check says what is wrong with the options, before anything runs.
func (c CRIU) check() error {
	if c.Binary == "" {
		return fmt.Errorf("no CRIU binary named")
	}
	if c.Timeout < 0 {
		return fmt.Errorf("CRIU timeout %v: must be positive", c.Timeout)
	}
	if _, ok := manageCgroupsModes[c.ManageCgroups]; c.ManageCgroups != "" && !ok {
		modes := make([]string, 0, len(manageCgroupsModes))
		for m := range manageCgroupsModes {
			modes = append(modes, m)
		}
		slices.Sort(modes)
		return fmt.Errorf("--manage-cgroups %q: CRIU's modes are %s", c.ManageCgroups, strings.Join(modes, ", "))
	}
	if _, ok := networkLockMethods[c.NetworkLock]; c.NetworkLock != "" && !ok {
		return fmt.Errorf("--network-lock %q: CRIU's methods are iptables, nftables, skip", c.NetworkLock)
	}
	if c.NetworkLock != "" && extraHas(c.Extra, "network-lock") {
		return fmt.Errorf("--network-lock %s and --criu-opt network-lock: name the method once", c.NetworkLock)
	}
	if c.GhostLimit > 0 && extraHas(c.Extra, "ghost-limit") {
		return fmt.Errorf("a ghost limit of %d bytes and --criu-opt ghost-limit: name the limit once", c.GhostLimit)
	}
	if c.LogLevel < 0 || c.LogLevel > 4 {
		return fmt.Errorf("CRIU log level %d: 0 to 4", c.LogLevel)
	}
	for _, l := range c.Extra {
		if strings.ContainsAny(l, "\n\r") || strings.TrimSpace(l) == "" {
			return fmt.Errorf("CRIU option %q: one option per entry, not empty", l)
		}
		switch strings.Fields(strings.TrimLeft(l, "-"))[0] {
		case "images-dir", "D", "work-dir", "W", "log-file", "o", "pid", "t", "config", "libdir", "L":
			return fmt.Errorf("CRIU option %q: gpucr sets that one itself", l)
		}
	}
	return nil
}

// fill sets the RPC's fields for the typed options.
func (c CRIU) fill(o *rpc.CriuOpts) {
	o.ShellJob = proto.Bool(c.ShellJob)
	if c.TCPEstablished {
		o.TcpEstablished = proto.Bool(true)
	}
	if c.TCPClose {
		o.TcpClose = proto.Bool(true)
	}
	if c.TCPSkipInFlight {
		o.TcpSkipInFlight = proto.Bool(true)
	}
	if c.ExtUnixSockets {
		o.ExtUnixSk = proto.Bool(true)
	}
	if c.FileLocks {
		o.FileLocks = proto.Bool(true)
	}
	if c.GhostLimit > 0 {
		o.GhostLimit = proto.Uint32(c.GhostLimit)
	}
	if c.LinkRemap {
		o.LinkRemap = proto.Bool(true)
	}
	o.External = append(o.External, c.External...)
	if m, ok := manageCgroupsModes[c.ManageCgroups]; ok {
		o.ManageCgroups = proto.Bool(true)
		o.ManageCgroupsMode = m.Enum()
	}
	if m, ok := networkLockMethods[c.NetworkLock]; ok {
		o.NetworkLock = m.Enum()
	}
	level := int32(4)
	if c.LogLevel > 0 {
		level = int32(c.LogLevel)
	}
	o.LogLevel = proto.Int32(level)
}

// Environment is what of the caller's world reaches CRIU and the plugin:
// nothing else of the process environment does.
type Environment struct {
	// Socket is the helper's socket.
	Socket string
	// Path is PATH for the programs CRIU runs itself (as root: the
	// system's directories).
	Path string
	// TempDir is where private directories are made (as root: one that
	// root alone can change).
	TempDir string
	// PluginEnv are NAME=VALUE settings that tune the plugin (GPUCR_LOG,
	// GPUCR_PLUGIN_TIMEOUT_S).
	PluginEnv []string
}

// EventKind is what an Event tells.
type EventKind int

const (
	// Phase: CRIU reached a phase (dumping, dumped, restoring, restored).
	Phase EventKind = iota + 1
	// Progress: the helper's GPU copy advanced (Event.Transfer).
	Progress
	// Warning: something the caller should tell the user; the operation
	// goes on.
	Warning
	// Note: information (the parent image chosen).
	Note
)

// Event is one step of a checkpoint or a restore, as it happens.
type Event struct {
	Kind    EventKind
	Elapsed time.Duration // since the operation began
	Text    string
	// Pid is the restored root's pid (Phase "restored").
	Pid proc.Pid
	// Transfer is the GPU copy so far (Progress), all processes together.
	Transfer *helperpb.Transfer
}

// Events receives a checkpoint's or a restore's events, in order, on the
// goroutine that runs it (Progress from the watcher's); nil drops them.
type Events func(Event)

func (e Events) send(ev Event) {
	if e != nil {
		e(ev)
	}
}
