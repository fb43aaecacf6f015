package torchrun

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func noEnv(string) string { return "" }

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

// testHost is a machine with 8 CPUs, 4 GPUs and port 40000 free.
func testHost(env map[string]string) Host {
	return Host{
		Getenv:   envOf(env),
		CPUs:     func() int { return 8 },
		GPUs:     func() (int, error) { return 4, nil },
		FreePort: func() (int, error) { return 40000, nil },
		Python:   "python3",
	}
}

func plan(t *testing.T, env map[string]string, args ...string) *Plan {
	t.Helper()
	o, err := Parse(args, envOf(env))
	if err != nil {
		t.Fatalf("Parse(%q): %v", args, err)
	}
	p, err := NewPlan(o, testHost(env))
	if err != nil {
		t.Fatalf("NewPlan(%q): %v", args, err)
	}
	return p
}

func TestParseBothSpellings(t *testing.T) {
	for _, args := range [][]string{
		{"--nproc-per-node", "2", "--master-port", "1234", "--node-rank=1", "--nnodes", "2", "train.py", "--lr", "0.1"},
		{"--nproc_per_node=2", "--master_port=1234", "--node_rank", "1", "--nnodes=2:2", "train.py", "--lr", "0.1"},
		{"-nproc_per_node", "2", "--master-port", "1234", "--node-rank", "1", "--nnodes", "2", "--", "train.py", "--lr", "0.1"},
	} {
		o, err := Parse(args, noEnv)
		if err != nil {
			t.Fatalf("Parse(%q): %v", args, err)
		}
		if o.NprocPerNode != "2" || o.MasterPort != 1234 || o.NodeRank != 1 || o.Program != "train.py" ||
			!slices.Equal(o.Args, []string{"--lr", "0.1"}) {
			t.Errorf("Parse(%q) = %+v", args, o)
		}
	}
}

func TestParseStopsAtTheScript(t *testing.T) {
	o, err := Parse([]string{"--standalone", "-m", "pkg.train", "--standalone", "-x"}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Standalone || !o.Module || o.Program != "pkg.train" || !slices.Equal(o.Args, []string{"--standalone", "-x"}) {
		t.Errorf("got %+v", o)
	}
}

func TestParseDefaultsFromPETEnvironment(t *testing.T) {
	env := map[string]string{"PET_NPROC_PER_NODE": "3", "PET_MASTER_ADDR": "node0", "PET_MASTER_PORT": "2222",
		"PET_STANDALONE": "0", "PET_NO_PYTHON": "1", "PET_RDZV_ID": "job7"}
	o, err := Parse([]string{"--master-port", "3333", "./prog"}, envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	// the command line wins over PET_
	if o.NprocPerNode != "3" || o.MasterAddr != "node0" || o.MasterPort != 3333 || o.Standalone || !o.NoPython || o.RdzvID != "job7" {
		t.Errorf("got %+v", o)
	}
	p := plan(t, env, "./prog", "a")
	if !slices.Equal(p.Argv, []string{"./prog", "a"}) || p.RunID != "job7" || p.Nproc != 3 {
		t.Errorf("plan %+v", p)
	}
}

func TestParseRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		says string
	}{
		{[]string{"--nproc-per-node"}, nil, "needs a value"},
		{[]string{"--no-such", "x.py"}, nil, "unknown option --no-such"},
		{[]string{"--standalone=1", "x.py"}, nil, "takes no value"},
		{[]string{"--master-port", "abc", "x.py"}, nil, "want an integer"},
		{[]string{"--standalone"}, nil, "no training script"},
		{[]string{"x.py"}, map[string]string{"PET_STANDALONE": "yes"}, "PET_STANDALONE=yes"},
	} {
		_, err := Parse(tc.args, envOf(tc.env))
		var ue UsageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Parse(%q): %v, want a usage error saying %q", tc.args, err, tc.says)
		}
	}
}

func TestPlanRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--nnodes", "1:4", "x.py"}, "elastic"},
		{[]string{"--max-restarts", "3", "x.py"}, "restarts no rank"},
		{[]string{"--redirects", "3", "x.py"}, "--redirects 3"},
		{[]string{"--tee", "1", "x.py"}, "--tee 1"},
		{[]string{"--rdzv-backend", "etcd", "x.py"}, "--rdzv-backend etcd"},
		{[]string{"--standalone", "--nnodes", "2", "x.py"}, "one node"},
		{[]string{"--nnodes", "2", "--node-rank", "2", "x.py"}, "--node-rank 2"},
		{[]string{"--nproc-per-node", "0", "x.py"}, "--nproc-per-node 0"},
		{[]string{"--no-python", "-m", "x"}, "--no-python and -m"},
		{[]string{"--nnodes", "2", "--master-port", "0", "x.py"}, "port 0"},
	} {
		o, err := Parse(tc.args, noEnv)
		if err == nil {
			_, err = NewPlan(o, testHost(nil))
		}
		var ue UsageError
		if err == nil || !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: %v, want a usage error saying %q", tc.args, err, tc.says)
		}
	}
}

func TestPlanNprocAndRendezvous(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		nproc      int
		addr       string
		port       int
		runID      string
		noteAbout  string
		argvPrefix []string
	}{
		{[]string{"x.py"}, 1, "127.0.0.1", 29500, "none", "", []string{"python3", "-u", "x.py"}},
		{[]string{"--nproc-per-node", "gpu", "x.py"}, 4, "127.0.0.1", 29500, "none", "OMP_NUM_THREADS", nil},
		{[]string{"--nproc-per-node", "cpu", "x.py"}, 8, "", 0, "", "", nil},
		{[]string{"--nproc-per-node", "auto", "-m", "pkg"}, 4, "", 0, "", "", []string{"python3", "-u", "-m", "pkg"}},
		{[]string{"--standalone", "--rdzv-conf", "use_libuv=0", "x.py"}, 1, "localhost", 40000, "", "--rdzv-conf", nil},
		{[]string{"--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400", "--nnodes", "2", "--rdzv-id", "j", "x.py"}, 1, "node0", 29400, "j", "", nil},
		{[]string{"--rdzv-backend", "c10d", "--rdzv-endpoint", "node0", "x.py"}, 1, "node0", 29400, "", "", nil},
		{[]string{"--rdzv-endpoint", "[::1]:5000", "x.py"}, 1, "::1", 5000, "", "", nil},
		{[]string{"--master-port", "0", "--log-dir", "/tmp/l", "x.py"}, 1, "", 40000, "", "--log-dir", nil},
	} {
		p := plan(t, nil, tc.args...)
		if p.Nproc != tc.nproc || (tc.addr != "" && p.MasterAddr != tc.addr) || (tc.port != 0 && p.MasterPort != tc.port) ||
			(tc.runID != "" && p.RunID != tc.runID) || (tc.argvPrefix != nil && !slices.Equal(p.Argv[:len(tc.argvPrefix)], tc.argvPrefix)) {
			t.Errorf("%q: %+v", tc.args, p)
		}
		if tc.noteAbout != "" && !strings.Contains(strings.Join(p.Notes, "\n"), tc.noteAbout) {
			t.Errorf("%q: notes %q say nothing of %s", tc.args, p.Notes, tc.noteAbout)
		}
	}
	if p := plan(t, nil, "--standalone", "x.py"); len(p.RunID) != 36 || p.RunID == plan(t, nil, "--standalone", "x.py").RunID {
		t.Errorf("standalone run ids: %q, want a new UUID each", p.RunID)
	}
}

func TestRankEnvironment(t *testing.T) {
	p := plan(t, nil, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "node0", "--role", "trainer", "x.py")
	ranks := p.Ranks()
	if !slices.Equal(ranks, []Rank{{2, 0}, {3, 1}}) {
		t.Fatalf("ranks %v, want 2 and 3", ranks)
	}
	base := []string{"PATH=/bin", "RANK=99", "USE_LIBUV=1", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3"}
	env := p.Env(base, ranks[1])
	want := map[string]string{
		"PATH": "/bin", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
		"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_NAME": "trainer", "ROLE_WORLD_SIZE": "4",
		"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
		"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "False", "USE_LIBUV": "0",
		"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "OMP_NUM_THREADS": "1",
	}
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := got[k]; dup {
			t.Errorf("%s twice in %q", k, env)
		}
		got[k] = v
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("environment %q, want exactly %v", env, want)
	}
	// the caller's OMP_NUM_THREADS stays; torchrun's 1 only where unset;
	// TORCH_NCCL_ASYNC_ERROR_HANDLING is 1 where unset
	p = plan(t, map[string]string{"OMP_NUM_THREADS": "4"}, "--nproc-per-node", "2", "x.py")
	env = p.Env([]string{"OMP_NUM_THREADS=4"}, p.Ranks()[0])
	if !slices.Contains(env, "OMP_NUM_THREADS=4") || slices.Contains(env, "OMP_NUM_THREADS=1") || !slices.Contains(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING=1") {
		t.Errorf("environment %q", env)
	}
}

func TestCountVisible(t *testing.T) {
	for v, n := range map[string]int{"": 0, "0": 1, "0,1,2": 3, "GPU-abc,GPU-def": 2, "0,-1,2": 1, "-1": 0} {
		if got := countVisible(v); got != n {
			t.Errorf("countVisible(%q) = %d, want %d", v, got, n)
		}
	}
}

func TestFreePort(t *testing.T) {
	p, err := FreePort()
	if err != nil || p <= 0 || p > 65535 {
		t.Fatalf("FreePort() = %d, %v", p, err)
	}
}
