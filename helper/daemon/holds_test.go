package daemon

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/protocol/helperpb"
)

// TestClientOpSyncHoldsEndWithTheConnection: OP_HOLD_SYNC answers the
// client's count, OP_REACH_SYNC passes its target on; when the CLI
// connection that held the client and closed its gate goes away (a job
// checkpoint's agent that died), the helper releases the hold and resumes
// the client (scoped operations). A hold released on the same connection,
// and a gate opened there, are not undone twice; an unscoped quiesce
// outlives its connection.
func TestClientOpSyncHoldsEndWithTheConnection(t *testing.T) {
	dev := newFake()
	_, sock := startServer(t, dev)
	app := dial(t, sock)
	token := app.register()
	fc := startControl(t, sock, token)
	waitFor(t, func() bool { return status(t, sock).Clients[0].ControlConnected })
	asked := func() string {
		fc.mu.Lock()
		defer fc.mu.Unlock()
		var out []string
		for _, a := range fc.asked {
			if a != "stats" && a != "snapshot" { // status asks these
				out = append(out, a)
			}
		}
		fc.asked = nil
		return strings.Join(out, ",")
	}
	asked()
	cli := dial(t, sock)
	cli.hello(helperpb.Role_ROLE_CLI, 0)
	op := func(c *tclient, o helperpb.ClientOp_Op, target uint64) *helperpb.Response {
		r, _ := c.mustCall(&helperpb.Request{Body: &helperpb.Request_ClientOp{ClientOp: &helperpb.ClientOp{
			Pid: int64(os.Getpid()), Op: o, TimeoutMs: 2000, SyncTarget: target, Scoped: true}}})
		return r
	}
	if r := op(cli, helperpb.ClientOp_OP_HOLD_SYNC, 0); r.Error != nil || r.GetClientOp().GetSyncCount() != 7 {
		t.Fatalf("hold: %v", r)
	}
	if r := op(cli, helperpb.ClientOp_OP_REACH_SYNC, 9); r.Error != nil {
		t.Fatalf("reach: %v", r)
	}
	if r := op(cli, helperpb.ClientOp_OP_QUIESCE, 0); r.Error != nil {
		t.Fatalf("quiesce: %v", r)
	}
	if got := asked(); got != "hold,reach-9,quiesce" {
		t.Fatalf("asked %s", got)
	}
	_ = cli.w.Close()
	waitFor(t, func() bool {
		fc.mu.Lock()
		defer fc.mu.Unlock()
		return len(fc.asked) >= 2
	})
	if got := asked(); got != "release,resume" {
		t.Fatalf("after the holding connection closed, asked %s, want release,resume", got)
	}
	if st := status(t, sock).Clients[0].State; st != helperpb.ClientState_CLIENT_STATE_RUNNING {
		t.Fatalf("state %s after the gate was opened", st)
	}

	// Released and resumed on the connection itself: nothing is left to undo.
	cli = dial(t, sock)
	cli.hello(helperpb.Role_ROLE_CLI, 0)
	for _, o := range []helperpb.ClientOp_Op{helperpb.ClientOp_OP_HOLD_SYNC, helperpb.ClientOp_OP_QUIESCE,
		helperpb.ClientOp_OP_RELEASE_SYNC, helperpb.ClientOp_OP_RESUME} {
		if r := op(cli, o, 0); r.Error != nil {
			t.Fatalf("%s: %v", o, r)
		}
	}
	_ = cli.w.Close()
	time.Sleep(300 * time.Millisecond) // an undo would have asked by now
	if got := asked(); got != "hold,quiesce,release,resume" {
		t.Fatalf("asked %s, want hold,quiesce,release,resume and nothing after the close", got)
	}

	// Not scoped (`gpucr client PID quiesce`, one command, then `drop`
	// from the next): the gate stays closed after the connection.
	cli = dial(t, sock)
	cli.hello(helperpb.Role_ROLE_CLI, 0)
	r, _ := cli.mustCall(&helperpb.Request{Body: &helperpb.Request_ClientOp{ClientOp: &helperpb.ClientOp{
		Pid: int64(os.Getpid()), Op: helperpb.ClientOp_OP_QUIESCE, TimeoutMs: 2000}}})
	if r.Error != nil {
		t.Fatalf("quiesce: %v", r)
	}
	_ = cli.w.Close()
	time.Sleep(300 * time.Millisecond)
	if got := asked(); got != "quiesce" {
		t.Fatalf("asked %s after an unscoped quiesce's connection closed, want quiesce alone", got)
	}
}
