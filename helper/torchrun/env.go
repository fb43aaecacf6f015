package torchrun

import (
	"strconv"
	"strings"
)

// Rank is one process of the job on this node.
type Rank struct {
	Rank      int // RANK: among all ranks of all nodes
	LocalRank int // LOCAL_RANK: among this node's
}

// Ranks are this node's ranks: node r runs ranks r*nproc to r*nproc+nproc-1,
// as torchrun numbers them for a job whose nodes all run nproc ranks.
func (p *Plan) Ranks() []Rank {
	r := make([]Rank, p.Nproc)
	for i := range r {
		r[i] = Rank{Rank: p.NodeRank*p.Nproc + i, LocalRank: i}
	}
	return r
}

// WorldSize is the number of ranks of the job.
func (p *Plan) WorldSize() int { return p.Nnodes * p.Nproc }

// Env is the environment rank r runs with: environ (the launcher's), with
// what torchrun gives its workers set over it.
func (p *Plan) Env(environ []string, r Rank) []string {
	getenv := func(k string) string {
		for _, kv := range environ {
			if name, v, _ := strings.Cut(kv, "="); name == k {
				return v
			}
		}
		return ""
	}
	world := strconv.Itoa(p.WorldSize())
	set := [][2]string{
		{"RANK", strconv.Itoa(r.Rank)},
		{"LOCAL_RANK", strconv.Itoa(r.LocalRank)},
		{"WORLD_SIZE", world},
		{"LOCAL_WORLD_SIZE", strconv.Itoa(p.Nproc)},
		{"GROUP_RANK", strconv.Itoa(p.NodeRank)},
		{"GROUP_WORLD_SIZE", strconv.Itoa(p.Nnodes)},
		// one role: its ranks are all the job's
		{"ROLE_RANK", strconv.Itoa(r.Rank)},
		{"ROLE_NAME", p.Role},
		{"ROLE_WORLD_SIZE", world},
		{"MASTER_ADDR", p.MasterAddr},
		{"MASTER_PORT", strconv.Itoa(p.MasterPort)},
		{"TORCHELASTIC_RESTART_COUNT", "0"},
		{"TORCHELASTIC_MAX_RESTARTS", "0"},
		{"TORCHELASTIC_RUN_ID", p.RunID},
		// There is no agent, so no agent's store: env:// makes rank 0 host
		// the store at MASTER_ADDR:MASTER_PORT and the others join it.
		{"TORCHELASTIC_USE_AGENT_STORE", "False"},
		// Rank 0's store on a libuv loop would hold an io_uring instance,
		// which CRIU cannot dump; env:// reads USE_LIBUV and, with 0,
		// serves the store without libuv (tests/gpu/README.md).
		{"USE_LIBUV", "0"},
	}
	// torchrun passes the caller's value on, or 1
	if v := getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"); v == "" {
		set = append(set, [2]string{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"})
	}
	if p.SetOMP {
		set = append(set, [2]string{"OMP_NUM_THREADS", "1"})
	}
	names := make(map[string]bool, len(set))
	for _, kv := range set {
		names[kv[0]] = true
	}
	env := make([]string, 0, len(environ)+len(set))
	for _, kv := range environ {
		if name, _, _ := strings.Cut(kv, "="); !names[name] {
			env = append(env, kv)
		}
	}
	for _, kv := range set {
		env = append(env, kv[0]+"="+kv[1])
	}
	return env
}
