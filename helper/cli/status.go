package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpucr/gpucr/helper/checkpoint"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/internal/printable"
	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/image/level"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// statusJSON is `gpucr status --json`: a stable shape for scripts.
type statusJSON struct {
	Socket        string       `json:"socket"`
	HelperVersion string       `json:"helper_version"`
	Unavailable   string       `json:"unavailable,omitempty"`
	Devices       []deviceJSON `json:"devices"`
	Clients       []clientJSON `json:"clients"`
	// Resident: images whose GPU data the helper keeps on the device
	// (gpucr image load), within ResidentBudget bytes in all.
	Resident       []residentJSON `json:"resident_images"`
	ResidentBudget uint64         `json:"resident_budget"`
	// ClientsLeftOut: clients the helper did not list, its reply being
	// full (the caller's own come first).
	ClientsLeftOut uint32 `json:"clients_left_out"`
	// Served: served mode's workers (gpucr helper --served-pool); absent
	// where served mode is off.
	Served *servedJSON `json:"served,omitempty"`
	// Drains: the caller's pushes to an object store after a checkpoint
	// (gpucr checkpoint --drain), running or recently ended.
	Drains []level.Drain `json:"drains"`
}

// servedJSON is the pool: idle workers per device, how many serve
// processes, and those serving the caller's (root: all).
type servedJSON struct {
	Idle     []uint32           `json:"idle"`
	Assigned uint32             `json:"assigned"`
	Workers  []servedWorkerJSON `json:"workers"`
	// Templates: workers that ran a checkpoint's template script and wait
	// for its restore (gpucr image load --template).
	Templates []servedTemplateJSON `json:"templates"`
}

type servedTemplateJSON struct {
	Pid       int64   `json:"pid"`
	Device    uint32  `json:"device"`
	UID       uint32  `json:"uid"`
	ImagesDir string  `json:"images_dir"`
	ScriptSec float64 `json:"script_seconds"`
}

type servedWorkerJSON struct {
	Pid       int64   `json:"pid"`
	Device    uint32  `json:"device"`
	UID       uint32  `json:"uid"`
	ClientPid int64   `json:"client_pid"`
	WarmSec   float64 `json:"warm_seconds"`
}

type residentJSON struct {
	ImagesDir string `json:"images_dir"`
	Bytes     uint64 `json:"bytes"`
	Buffers   uint32 `json:"buffers"`
	OwnerUID  uint32 `json:"owner_uid"`
	LoadedMs  int64  `json:"loaded_unix_ms"`
	Restores  uint64 `json:"restores"`
	Templates uint32 `json:"templates"`
}

type deviceJSON struct {
	Ordinal     int32  `json:"ordinal"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	TotalMemory uint64 `json:"total_memory"`
	FreeMemory  uint64 `json:"free_memory"`
	Granularity uint64 `json:"granularity"`
	PoolMemory  uint64 `json:"pool_memory"`
	// SnapshotMemory: held by concurrent checkpoints' snapshots until
	// their images are written.
	SnapshotMemory uint64 `json:"snapshot_memory"`
}

type clientJSON struct {
	PID               int64    `json:"pid"`
	UID               uint32   `json:"uid"`
	Program           string   `json:"program"`
	Allocations       uint64   `json:"allocations"`
	Bytes             uint64   `json:"bytes"`
	ControlConnected  bool     `json:"control_connected"`
	Checkpointable    bool     `json:"checkpointable"`
	NotCheckpointable []string `json:"not_checkpointable"`
	State             string   `json:"state"`
	// Container is the container the process runs in ("": none seen), and
	// NsPid its pid there (in its own pid namespace), as this command reads
	// them from /proc.
	Container string   `json:"container"`
	NsPid     proc.Pid `json:"ns_pid"`
	// WindowOpen: a concurrent checkpoint's copy-on-write window holds its
	// writes into memory not saved yet (WindowPendingBytes of it).
	WindowOpen         bool   `json:"window_open"`
	WindowPendingBytes uint64 `json:"window_pending_bytes"`
	// Rejoined: it reconnected to this helper after the one before ended,
	// and moved the memory that one held into this one's (absent if never).
	Rejoined *rejoinJSON `json:"rejoined,omitempty"`
}

// rejoinJSON is the last rejoin of a client: the allocations and bytes
// moved (copied on the GPU into this helper's memory), those left where
// they were (shared with other processes, or no room: not checkpointable),
// and how long the process waited for it.
type rejoinJSON struct {
	Count       uint64  `json:"count"`
	Allocations uint64  `json:"allocations"`
	Bytes       uint64  `json:"bytes"`
	Left        uint64  `json:"allocations_left"`
	Seconds     float64 `json:"seconds"`
}

func rejoinOf(r *helperpb.RejoinInfo) *rejoinJSON {
	if r == nil {
		return nil
	}
	return &rejoinJSON{r.Count, r.Allocations, r.Bytes, r.AllocationsLeft, float64(r.Micros) / 1e6}
}

// stateName: "running", "quiesced", "dropped" or "unknown".
func stateName(s helperpb.ClientState) string { return checkpoint.StateName(s) }

func toStatusJSON(socket string, st *helperpb.StatusReply) statusJSON {
	out := statusJSON{Socket: socket, HelperVersion: st.HelperVersion, Unavailable: st.Unavailable,
		Devices: []deviceJSON{}, Clients: []clientJSON{}, Resident: []residentJSON{}, ResidentBudget: st.ResidentBudget,
		ClientsLeftOut: st.ClientsLeftOut}
	if p := st.Served; p != nil {
		out.Served = &servedJSON{Idle: p.Idle, Assigned: p.Assigned, Workers: []servedWorkerJSON{}, Templates: []servedTemplateJSON{}}
		if out.Served.Idle == nil {
			out.Served.Idle = []uint32{}
		}
		for _, w := range p.Workers {
			out.Served.Workers = append(out.Served.Workers, servedWorkerJSON{w.Pid, w.Device, w.Uid, w.ClientPid, float64(w.WarmNs) / 1e9})
		}
		for _, t := range p.Templates {
			out.Served.Templates = append(out.Served.Templates, servedTemplateJSON{t.WorkerPid, t.Device, t.Uid, t.ImageDir, float64(t.MadeNs) / 1e9})
		}
	}
	for _, r := range st.ResidentImages {
		out.Resident = append(out.Resident, residentJSON{r.ImageDir, r.Bytes, r.Buffers, r.OwnerUid, r.LoadedUnixMs, r.Restores, r.Templates})
	}
	for _, d := range st.Devices {
		out.Devices = append(out.Devices, deviceJSON{d.Ordinal, d.Uuid, d.Name, d.TotalMemory, d.FreeMemory, d.Granularity, d.PoolMemory,
			d.SnapshotMemory})
	}
	for _, c := range st.Clients {
		r := c.NotCheckpointable
		if c.RunsAsAnother {
			r = append([]string{notOwnReason}, r...)
		}
		if r == nil {
			r = []string{}
		}
		out.Clients = append(out.Clients, clientJSON{c.Pid, c.Uid, c.Program, c.Allocations, c.Bytes,
			c.ControlConnected, c.Checkpointable, r, stateName(c.State), proc.Container(proc.Pid(c.Pid)), proc.NsPid(proc.Pid(c.Pid)),
			c.WindowOpen, c.WindowPendingBytes, rejoinOf(c.Rejoined)})
	}
	return out
}

// notOwnReason is why a client whose process no longer runs as its user
// alone is not checkpointable (ClientInfo.runs_as_another; the helper's
// refusal of that user's operations gives the details).
const notOwnReason = "runs as another user now (a set-user-ID program?): only root may act on it"

func statusCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "status",
		Usage:     "show the helper, its GPUs and the applications it serves (checkpointable or not, and why); with PID, that one only",
		ArgsUsage: "[PID]",
		Flags: []ucli.Flag{socketFlag(), &ucli.BoolFlag{Name: "json", Usage: "machine-readable output"},
			&ucli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "how long to wait for the helper"}},
		Action: func(c *ucli.Context) error {
			pos, err := flagsAnywhere(c)
			if err != nil {
				return helpOK(err)
			}
			if len(pos) > 1 {
				return usageError{fmt.Errorf("status: unexpected arguments %q (usage: gpucr status [PID])", pos)}
			}
			var only int64
			if len(pos) == 1 {
				p, err := parsePid("status", pos[0])
				if err != nil {
					return err
				}
				only = int64(p)
			}
			socket := client.SocketPath(c.String("socket"))
			ctx, cancel := context.WithTimeout(context.Background(), c.Duration("timeout"))
			defer cancel()
			conn, err := client.Dial(ctx, socket, helperpb.Role_ROLE_CLI, "gpucr")
			if err != nil {
				return fmt.Errorf("%v (is `gpucr helper` running? systemctl start gpucr-helper)", err)
			}
			defer conn.Close()
			// A client PID is shown alone. Another PID's tree: the clients
			// under a launcher that is none itself (gpucr torchrun, a
			// shell), which `gpucr checkpoint PID` dumps; never pid 1's,
			// which is every process of the system, not a job.
			var pids []int64
			var tree []proc.Pid
			if only != 0 {
				pids = []int64{only}
			}
			st, err := conn.StatusOfPids(ctx, pids)
			if err != nil {
				return fmt.Errorf("status from the helper on %s: %w", socket, err)
			}
			if only > 1 && !hasClient(st, only) {
				tree = proc.Tree(proc.Pid(only))
				pids = pids[:0]
				for _, p := range tree {
					pids = append(pids, int64(p))
				}
				if st, err = conn.StatusOfPids(ctx, pids); err != nil {
					return fmt.Errorf("status from the helper on %s: %w", socket, err)
				}
			}
			j := toStatusJSON(socket, st)
			if j.Drains, err = level.Drains(); err != nil || j.Drains == nil {
				j.Drains = []level.Drain{}
			}
			if only != 0 {
				var mine []clientJSON
				for _, cl := range j.Clients {
					if slices.Contains(pids, cl.PID) {
						mine = append(mine, cl)
					}
				}
				if len(mine) == 0 && len(tree) > 1 && proc.Exists(proc.Pid(only)) {
					// a tree's root with no client under it: what it is
					// matters to a checkpoint, not an error
					j.Clients = nil
					if c.Bool("json") {
						return writeJSON(c.App.Writer, j)
					}
					printStatus(c, j)
					fmt.Fprintf(c.App.Writer, "pid %d and the %d processes under it: none is a client of the helper (none holds GPU memory through gpucr)\n", only, len(tree)-1)
					return nil
				}
				if len(mine) == 0 {
					return fmt.Errorf("status: pid %d is no client of the helper on %s (not started with `gpucr run`, or gone)", only, socket)
				}
				j.Clients = mine
			}
			if c.Bool("json") {
				return writeJSON(c.App.Writer, j)
			}
			printStatus(c, j)
			return nil
		},
	}
}

// hasClient says whether the helper's status lists pid among its clients.
func hasClient(st *helperpb.StatusReply, pid int64) bool {
	for _, cl := range st.GetClients() {
		if cl.GetPid() == pid {
			return true
		}
	}
	return false
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printStatus writes j for a terminal. What other users chose (program
// names, the reasons their interposers give, image directories) is shown
// escaped (printable.String): a newline in a program name must not forge a
// line, nor an escape sequence act on the terminal.
func printStatus(c *ucli.Context, j statusJSON) {
	w := c.App.Writer
	fmt.Fprintf(w, "helper %s on %s\n", j.HelperVersion, j.Socket)
	if j.Unavailable != "" {
		fmt.Fprintf(w, "unavailable: %s\n", j.Unavailable)
	}
	fmt.Fprintf(w, "devices: %d\n", len(j.Devices))
	for _, d := range j.Devices {
		pool := ""
		if d.PoolMemory > 0 {
			pool = fmt.Sprintf(", %s ready in the allocation pool", humanBytes(d.PoolMemory))
		}
		if d.SnapshotMemory > 0 {
			pool += fmt.Sprintf(", %s held by checkpoint snapshots until their images are written", humanBytes(d.SnapshotMemory))
		}
		fmt.Fprintf(w, "  %d  %s  %s  %s (%s free%s)\n", d.Ordinal, d.UUID, d.Name, humanBytes(d.TotalMemory), humanBytes(d.FreeMemory), pool)
	}
	if j.ResidentBudget > 0 || len(j.Resident) > 0 {
		var held uint64
		for _, r := range j.Resident {
			held += r.Bytes
		}
		fmt.Fprintf(w, "resident images: %d, %s of %s\n", len(j.Resident), humanBytes(held), humanBytes(j.ResidentBudget))
		for _, r := range j.Resident {
			tmpl := ""
			if r.Templates > 0 {
				tmpl = fmt.Sprintf(", %d templates waiting", r.Templates)
			}
			fmt.Fprintf(w, "  %s  %s in %d buffers, uid %d, %d restores served%s\n", printable.String(r.ImagesDir), humanBytes(r.Bytes), r.Buffers,
				r.OwnerUID, r.Restores, tmpl)
		}
	}
	if len(j.Drains) > 0 {
		fmt.Fprintf(w, "drains to object stores: %d\n", len(j.Drains))
		for _, d := range j.Drains {
			fmt.Fprintln(w, drainLine(d))
		}
	}
	if p := j.Served; p != nil {
		fmt.Fprintf(w, "served mode: idle workers per device %v, %d serving processes\n", p.Idle, p.Assigned)
		for _, sw := range p.Workers {
			fmt.Fprintf(w, "  worker %d on device %d serves pid %d (uid %d); its context took %.3f s\n", sw.Pid, sw.Device, sw.ClientPid,
				sw.UID, sw.WarmSec)
		}
		for _, t := range p.Templates {
			fmt.Fprintf(w, "  template %d on device %d (uid %d) for a restore of %s; its script took %.3f s\n", t.Pid, t.Device, t.UID,
				printable.String(t.ImagesDir), t.ScriptSec)
		}
	}
	leftOut := ""
	if j.ClientsLeftOut > 0 {
		leftOut = fmt.Sprintf(" (and %d more the helper did not list: its answer was full; `gpucr status PID` shows one)", j.ClientsLeftOut)
	}
	if len(j.Clients) == 0 {
		fmt.Fprintf(w, "clients: none%s\n", leftOut)
		return
	}
	fmt.Fprintf(w, "clients: %d%s\n", len(j.Clients), leftOut)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  PID\tUID\tPROGRAM\tCONTAINER\tALLOCS\tBYTES\tCONTROL\tCHECKPOINTABLE\tSTATE")
	for _, cl := range j.Clients {
		ck := yesNo(cl.Checkpointable)
		if !cl.Checkpointable {
			ck = "no: " + printable.String(strings.Join(cl.NotCheckpointable, "; "))
		}
		ctl := "down"
		if cl.ControlConnected {
			ctl = "up"
		}
		ctr := "-"
		if cl.Container != "" {
			ctr = printable.String(cl.Container)
			if cl.NsPid != 0 && int64(cl.NsPid) != cl.PID {
				ctr += fmt.Sprintf(" (pid %d)", cl.NsPid)
			}
		}
		state := cl.State
		if cl.WindowOpen {
			state += fmt.Sprintf(", copy-on-write window (%s to save)", humanBytes(cl.WindowPendingBytes))
		}
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", cl.PID, cl.UID, printable.String(cl.Program), ctr, cl.Allocations,
			humanBytes(cl.Bytes), ctl, ck, state)
	}
	tw.Flush()
	for _, cl := range j.Clients {
		if r := cl.Rejoined; r != nil {
			fmt.Fprintf(w, "  pid %d rejoined this helper after the one before it ended: %s\n", cl.PID, rejoinText(r))
		}
	}
}

// rejoinText says what a client's last rejoin did with its memory.
func rejoinText(r *rejoinJSON) string {
	s := fmt.Sprintf("%d allocations (%s) copied into this helper's memory on the GPU, the process held %.3f s",
		r.Allocations, humanBytes(r.Bytes), r.Seconds)
	if r.Left > 0 {
		s += fmt.Sprintf("; %d allocations of the helper that ended stay where they were (not checkpointable until it restarts)", r.Left)
	}
	return s
}
