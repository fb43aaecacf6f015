package daemon

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/gpucr/gpucr/helper/proc"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// wantTransitions is the lifecycle, written out apart from lifeTable: the
// state each event takes a client in each state to; "-" means the event may
// not happen there (refused, the state left as it was). One row per state,
// one column per event, in the order of their constants.
var wantTransitions = [numLifeStates]string{
	//              control-up  quiesced  dropped  resumed  detach     detach-failed  parked    reattached  restored  armed      calls-closed  released
	lifeRegistered: "up         -         -        -        -          -              -         -           -         -          gone          -",
	lifeUp:         "up         quiesced  dropped  up       -          -              -         -           -         -          gone          -",
	lifeQuiesced:   "quiesced   quiesced  dropped  up       -          -              -         -           -         -          gone          -",
	lifeDropped:    "dropped    quiesced  dropped  up       detaching  -              -         -           -         -          gone          -",
	lifeDetaching:  "-          -         -        -        -          dropped        detached  -           -         detaching  -             -",
	lifeDetached:   "-          -         -        -        -          -              -         dropped     -         detached   -             gone",
	lifePrepared:   "-          -         -        -        -          -              -         -           restored  -          -             gone",
	lifeRestored:   "-          -         -        -        -          -              -         dropped     -         restored   -             gone",
	lifeGone:       "-          -         -        -        -          -              -         -           -         -          -             -",
}

func parseState(t *testing.T, name string) lifeState {
	t.Helper()
	for st := range numLifeStates {
		if st.String() == name {
			return st
		}
	}
	t.Fatalf("no state %q", name)
	return 0
}

// testClient is a client in state st, as far as its lifecycle goes.
func testClient(t *testing.T, st lifeState) *client {
	return &client{pid: 4242, allocs: map[uint64]*alloc{}, opSem: make(chan struct{}, 1),
		log: zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), life: newLife(st)}
}

// Every event from every state, the illegal ones included: the transition
// table, and what firing the event does to a client (the new state, or a
// refusal that leaves it as it was).
func TestLifecycleTransitions(t *testing.T) {
	legal := 0
	for from := range numLifeStates {
		cells := strings.Fields(wantTransitions[from])
		if len(cells) != int(numLifeEvents) {
			t.Fatalf("%s: %d cells for %d events", from, len(cells), numLifeEvents)
		}
		for ev := range numLifeEvents {
			want, wantOK := lifeState(0), cells[ev] != "-"
			if wantOK {
				want = parseState(t, cells[ev])
				legal++
			}
			got, ok := nextState(from, ev)
			if ok != wantOK || (ok && got != want) {
				t.Errorf("%s --%s--> %v (allowed %v), want %s", from, ev, got, ok, cells[ev])
			}

			cl := testClient(t, from)
			cl.life.shown = helperpb.ClientState(99) // what it showed before: kept when gone
			err := cl.fire(ev)
			switch {
			case wantOK && err != nil:
				t.Errorf("%s --%s--> refused: %v", from, ev, err)
			case wantOK && cl.lifeState() != want:
				t.Errorf("%s --%s--> %s, want %s", from, ev, cl.lifeState(), want)
			case !wantOK:
				var it *illegalTransition
				if !errors.As(err, &it) || it.from != from || it.ev != ev {
					t.Errorf("%s --%s--> not refused: %v", from, ev, err)
				}
				if cl.lifeState() != from || cl.life.shown != 99 {
					t.Errorf("refused %s --%s-- changed the client: %s, shows %v", from, ev, cl.lifeState(), cl.life.shown)
				}
			}
			if wantOK {
				wantShown := shownState(want)
				if want == lifeGone {
					wantShown = 99
				}
				if cl.life.shown != wantShown {
					t.Errorf("%s --%s--> %s shows %v, want %v", from, ev, want, cl.life.shown, wantShown)
				}
			}
		}
	}
	if n := countTransitions(); n != legal {
		t.Errorf("lifeTable has %d transitions, the table here %d", n, legal)
	}
	// Out of range: refused, never a panic.
	if _, ok := nextState(numLifeStates, evControlUp); ok {
		t.Error("a state out of range has transitions")
	}
	if _, ok := nextState(lifeUp, numLifeEvents); ok {
		t.Error("an event out of range is allowed")
	}
}

func countTransitions() int {
	n := 0
	for _, m := range lifeTable {
		n += len(m)
	}
	return n
}

// Status shows, for each state, the ClientState it showed before the
// lifecycle had states of its own: RUNNING for a connected client whose gate
// is open, QUIESCED, and DROPPED for every client whose memory the process
// does not hold.
func TestLifecycleShownState(t *testing.T) {
	want := map[lifeState]helperpb.ClientState{
		lifeRegistered: helperpb.ClientState_CLIENT_STATE_RUNNING,
		lifeUp:         helperpb.ClientState_CLIENT_STATE_RUNNING,
		lifeQuiesced:   helperpb.ClientState_CLIENT_STATE_QUIESCED,
		lifeDropped:    helperpb.ClientState_CLIENT_STATE_DROPPED,
		lifeDetaching:  helperpb.ClientState_CLIENT_STATE_DROPPED,
		lifeDetached:   helperpb.ClientState_CLIENT_STATE_DROPPED,
		lifePrepared:   helperpb.ClientState_CLIENT_STATE_DROPPED,
		lifeRestored:   helperpb.ClientState_CLIENT_STATE_DROPPED,
		lifeGone:       helperpb.ClientState_CLIENT_STATE_UNSPECIFIED,
	}
	for st := range numLifeStates {
		if got := shownState(st); got != want[st] {
			t.Errorf("%s shows %v, want %v", st, got, want[st])
		}
		if got := newLife(st).shown; got != want[st] {
			t.Errorf("a new client %s shows %v, want %v", st, got, want[st])
		}
	}
}

// What a client reports of its gate (a Snapshot's state) moves it like the
// helper's own requests; an unknown state is refused.
func TestLifecycleReported(t *testing.T) {
	for _, c := range []struct {
		from lifeState
		st   helperpb.ClientState
		want lifeState
		ok   bool
	}{
		{lifeUp, helperpb.ClientState_CLIENT_STATE_UNSPECIFIED, lifeUp, true},
		{lifeUp, helperpb.ClientState_CLIENT_STATE_QUIESCED, lifeQuiesced, true},
		{lifeQuiesced, helperpb.ClientState_CLIENT_STATE_DROPPED, lifeDropped, true},
		{lifeDropped, helperpb.ClientState_CLIENT_STATE_RUNNING, lifeUp, true},
		{lifeUp, helperpb.ClientState(7), lifeUp, false},
		{lifeDetaching, helperpb.ClientState_CLIENT_STATE_RUNNING, lifeDetaching, false},
		{lifeGone, helperpb.ClientState_CLIENT_STATE_QUIESCED, lifeGone, false},
	} {
		cl := testClient(t, c.from)
		err := cl.reported(c.st)
		if (err == nil) != c.ok || cl.lifeState() != c.want {
			t.Errorf("%s reports %v: %s, %v; want %s (ok %v)", c.from, c.st, cl.lifeState(), err, c.want, c.ok)
		}
	}
}

// The transitions that move a client between the helper's lists: a
// detaching client whose calls connection closes is parked, comes back only
// with its own token, and is then connected and dropped; a restored one comes
// back with any token and gets a new one; one that is not detaching is gone.
func TestLifecycleRegistry(t *testing.T) {
	dir := t.TempDir()
	s := New(Config{Socket: filepath.Join(dir, "helper.sock"), Log: zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))})
	pid := proc.Pid(os.Getpid())
	ctl := &control{}
	self := func() *proc.Process {
		p, err := proc.Open(pid)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	cl := newClient(s.log, self(), uint32(os.Getuid()), uint32(os.Getgid()), "test")
	s.reg.connect(cl)
	if cl.lifeState() != lifeRegistered || s.reg.byPID[pid] != cl || s.reg.byToken[cl.token] != cl {
		t.Fatalf("registered: %s, listed %v", cl.lifeState(), s.reg.byPID[pid] == cl)
	}
	if err := cl.arm(func() {}); err == nil {
		t.Error("a registered client was armed")
	}
	if err := cl.controlUp(ctl); err != nil || cl.lifeState() != lifeUp {
		t.Fatalf("control up: %s, %v", cl.lifeState(), err)
	}
	if err := cl.controlUp(ctl); !errors.Is(err, errHasControl) {
		t.Errorf("a second control connection: %v", err)
	}
	for _, ev := range []lifeEvent{evQuiesced, evDropped, evDetach} {
		if err := cl.fire(ev); err != nil {
			t.Fatal(err)
		}
	}
	if !s.reg.callsClosed(cl) || cl.lifeState() != lifeDetached || s.reg.waiting[pid] != cl || s.reg.byPID[pid] != nil ||
		s.reg.byToken[cl.token] != nil {
		t.Fatalf("a detaching client's calls closed: %s, parked %v", cl.lifeState(), s.reg.waiting[pid] == cl)
	}
	if cl.process() == nil || !cl.process().Running() {
		t.Error("parked without its process")
	}
	if err := cl.arm(func() {}); err != nil {
		t.Errorf("arming a detached client: %v", err)
	}
	if s.reg.reattach(self(), cl.token+1) != nil || cl.lifeState() != lifeDetached {
		t.Fatal("a detached client came back with another token")
	}
	token := cl.token
	if s.reg.reattach(self(), token) != cl || cl.lifeState() != lifeDropped || s.reg.byPID[pid] != cl || s.reg.waiting[pid] != nil ||
		cl.token != token {
		t.Fatalf("reattached: %s", cl.lifeState())
	}
	if f := cl.takeOnAttach(); f == nil || cl.takeOnAttach() != nil {
		t.Error("what to do once back is not taken exactly once")
	}
	cl.ctrl = nil // its old control connection closed
	if err := cl.controlUp(ctl); err != nil || cl.lifeState() != lifeDropped {
		t.Fatalf("a reattached client's control up: %s, %v", cl.lifeState(), err)
	}
	if err := cl.fire(evResumed); err != nil || cl.lifeState() != lifeUp {
		t.Fatalf("resumed: %s, %v", cl.lifeState(), err)
	}
	if s.reg.callsClosed(cl) || cl.lifeState() != lifeGone {
		t.Fatalf("a running client's calls closed: %s", cl.lifeState())
	}
	s.reg.disconnect(cl)
	if s.reg.byPID[pid] != nil || s.reg.byToken[cl.token] != nil {
		t.Error("a gone client is still listed")
	}
	if err := cl.controlUp(&control{}); err == nil {
		t.Error("a gone client got a control connection")
	}

	// A restored process: prepared, restored under its pid, back with any token.
	out := newOutcomes()
	rc := newPreparedClient(s.log, 77, 7, 0, nil, out)
	if rc.lifeState() != lifePrepared || !rc.preparedFor(77, true, 0) || !rc.preparedFor(1234, false, 7) ||
		rc.preparedFor(78, true, 0) || rc.wakesAs() != 77 || rc.outcomes() != out {
		t.Fatalf("prepared client: %s", rc.lifeState())
	}
	if stale, err := s.reg.parkRestored(rc, self()); err != nil || stale != nil || rc.lifeState() != lifeRestored || s.reg.waiting[pid] != rc || rc.pid != pid {
		t.Fatalf("restored: %s, %v", rc.lifeState(), err)
	}
	if rc.preparedFor(pid, true, 0) {
		t.Error("a restored client is still claimable")
	}
	old := rc.token
	if s.reg.reattach(self(), 12345) != rc || rc.lifeState() != lifeDropped || rc.token == old || s.reg.byToken[rc.token] != rc {
		t.Fatalf("restored client reattached: %s", rc.lifeState())
	}
	if rc.wakesAs() != 0 || rc.restoreLoad() != nil {
		t.Error("a reattached client keeps what it had for its restore")
	}
	if rc.takeOutcomes() != out || rc.outcomes() != nil {
		t.Error("a restore's outcome is not given once")
	}
	// Released from a waiting state only: a connected client keeps its memory.
	s.mem.release(rc)
	if rc.lifeState() != lifeDropped {
		t.Errorf("a connected client was released: %s", rc.lifeState())
	}
	pc := newPreparedClient(s.log, 78, 0, 0, nil, newOutcomes())
	s.mem.release(pc)
	if pc.lifeState() != lifeGone {
		t.Errorf("a prepared client released: %s", pc.lifeState())
	}
}

// No file but lifecycle.go reads or writes a client's lifecycle (client.life).
func TestLifecycleOwnedByLifecycleGo(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "lifecycle.go" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if n.Sel.Name == "life" {
					t.Errorf("%s: a client's lifecycle (.life) used outside lifecycle.go; ask or tell it there", fset.Position(n.Pos()))
				}
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok && id.Name == "life" {
					t.Errorf("%s: a client made with its lifecycle outside lifecycle.go", fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
}

// maxServerMethods bounds Server: it dispatches requests to the parts that
// own what the helper holds (registry, allocator, groupRuns, ...), and a
// new feature adds a part, not methods on Server.
const maxServerMethods = 45

// Server stays a dispatcher: a few dozen methods at most, its own lock
// taken only in server.go (it guards the open connections alone), and no
// code outside the registry's methods reaching into the registry's maps or
// lock.
func TestServerStaysADispatcher(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	regFields := map[string]bool{"mu": true, "byToken": true, "byPID": true, "waiting": true, "owner": true, "sh": true, "plans": true}
	var methods []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			recvType, recvName := receiverOf(fd)
			if recvType == "Server" {
				methods = append(methods, f+": "+fd.Name.Name)
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				// s.mu of a Server method outside server.go.
				if id, ok := sel.X.(*ast.Ident); ok && recvType == "Server" && id.Name == recvName && sel.Sel.Name == "mu" && f != "server.go" {
					t.Errorf("%s: Server.mu taken outside server.go; it guards the open connections only", fset.Position(sel.Pos()))
				}
				// X.reg.<a field of the registry> outside the registry's methods.
				if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "reg" && regFields[sel.Sel.Name] && recvType != "registry" {
					t.Errorf("%s: the registry's %s used outside its methods", fset.Position(sel.Pos()), sel.Sel.Name)
				}
				return true
			})
		}
	}
	if len(methods) > maxServerMethods {
		t.Errorf("Server has %d methods, more than %d: give what they own to a part of its own\n%s", len(methods), maxServerMethods,
			strings.Join(methods, "\n"))
	}
}

// receiverOf is fd's receiver type (without the pointer) and name; "" if
// it is a function.
func receiverOf(fd *ast.FuncDecl) (typ, name string) {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return "", ""
	}
	r := fd.Recv.List[0]
	e := r.Type
	if st, ok := e.(*ast.StarExpr); ok {
		e = st.X
	}
	if id, ok := e.(*ast.Ident); ok {
		typ = id.Name
	}
	if len(r.Names) > 0 {
		name = r.Names[0].Name
	}
	return typ, name
}
