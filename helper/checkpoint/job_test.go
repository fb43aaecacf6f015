package checkpoint

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A /proc/net/tcp excerpt: an established connection with 0x20 bytes not
// acknowledged, one drained, a listener and a TIME_WAIT remnant of the
// first's endpoints.
const jobNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 01D60E0A:7724 02D60E0A:D870 01 00000020:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 20 4 30 10 -1
   1: 01D60E0A:7725 02D60E0A:D871 01 00000000:00000010 00:00000000 00000000     0        0 1002 1 0000000000000000 20 4 30 10 -1
   2: 01D60E0A:7724 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 100 0 0 10 0
   3: 01D60E0A:7724 02D60E0A:D870 06 00000000:00000000 03:00001000 00000000     0        0 0 3 0000000000000000
`

func TestReadConnQueues(t *testing.T) {
	qs := readConnQueues(strings.NewReader(jobNetTCP), unix.AF_INET)
	busy := JobConn{Local: "10.14.214.1:30500", Remote: "10.14.214.2:55408"}
	idle := JobConn{Local: "10.14.214.1:30501", Remote: "10.14.214.2:55409"}
	if q, ok := qs[busy]; !ok || q.tx != 0x20 || q.state != tcpEstablishedState {
		t.Errorf("%s: %+v %v (all: %v)", busy, q, ok, qs)
	}
	if q, ok := qs[idle]; !ok || q.tx != 0 {
		t.Errorf("%s: %+v %v", idle, q, ok)
	}
	if len(qs) != 3 { // the listener is there, the TIME_WAIT remnant is not
		t.Errorf("%d connections: %v", len(qs), qs)
	}
}

func TestMatchJobConns(t *testing.T) {
	a := JobConn{Local: "10.0.0.1:29500", Remote: "10.0.0.2:40000"}
	parts := []JobPartResult{{Host: "h1", Pid: 10}, {Host: "h2", Pid: 20}}
	if err := matchJobConns(parts, [][]JobConn{{a}, {a.Peer()}}); err != nil {
		t.Errorf("a connection seen from both ends: %v", err)
	}
	stray := JobConn{Local: "10.0.0.2:40001", Remote: "10.0.0.9:6379"}
	err := matchJobConns(parts, [][]JobConn{{a}, {a.Peer(), stray}})
	if err == nil || !strings.Contains(err.Error(), "h2 (pid 20): 10.0.0.2:40001 -> 10.0.0.9:6379") {
		t.Errorf("a connection to a peer in no part: %v", err)
	}
	// the same connection in one part only, seen from its own end twice,
	// is not matched with itself
	if err := matchJobConns(parts, [][]JobConn{{a, a.Peer()}, nil}); err == nil {
		t.Error("a connection within one part was matched across parts")
	}
}

func TestSameCheckpoint(t *testing.T) {
	parts := []JobRestorePart{{Target: &SSHTarget{Host: "h1"}, Dir: "/d"}, {Target: &SSHTarget{Host: "h2"}, Dir: "/d"}}
	rec := func(id string, part, n int) jobMsg {
		return jobMsg{Event: evReady, Record: &JobRecord{ID: id, Part: part, Parts: make([]JobRecordPart, n)}}
	}
	if err := sameCheckpoint(parts, []jobMsg{rec("a", 0, 2), rec("a", 1, 2)}); err != nil {
		t.Errorf("one checkpoint's two parts: %v", err)
	}
	for _, c := range []struct {
		ready []jobMsg
		want  string
	}{
		{[]jobMsg{rec("a", 0, 2), rec("b", 1, 2)}, "of checkpoint b"},
		{[]jobMsg{rec("a", 0, 2), rec("a", 0, 2)}, "part 0 of checkpoint a again"},
		{[]jobMsg{rec("a", 0, 3), rec("a", 1, 3)}, "has 3 parts, 2 were named"},
	} {
		if err := sameCheckpoint(parts, c.ready); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.ready, err, c.want)
		}
	}
}

func TestJobMsgLines(t *testing.T) {
	var b bytes.Buffer
	l := &jobLine{w: &b}
	for _, m := range []jobMsg{{Op: opPrepare, Pid: 42}, {Event: evPrepared, Conns: []JobConn{{Local: "a:1", Remote: "b:2"}}}} {
		if err := l.send(m); err != nil {
			t.Fatal(err)
		}
	}
	b.WriteString("not json\n")
	ch := make(chan jobMsg, 4)
	err := readJobMsgs(&b, ch)
	close(ch)
	var got []jobMsg
	for m := range ch {
		got = append(got, m)
	}
	if len(got) != 2 || got[0].Pid != 42 || got[1].Conns[0].Remote != "b:2" || err == nil {
		t.Errorf("read %+v, %v", got, err)
	}
}

// A job checkpoint is taken again only when a part's dump met a connection
// in flight and every part runs on: the agent's flag survives the
// coordinator's wrapping (errAgents, JobError).
func TestJobInFlight(t *testing.T) {
	inflight := &agentFailure{host: "h2", msg: "criu dump failed: in-flight connection", inFlight: true}
	other := &agentFailure{host: "h2", msg: "criu dump failed: something else"}
	running := []JobPartResult{{Host: "h1", Running: true}, {Host: "h2", Running: true}}
	stopped := []JobPartResult{{Host: "h1", Running: true}, {Host: "h2"}}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"in flight, every part runs", &JobError{Step: "dump", Err: errAgents([]error{inflight}), Parts: running}, true},
		{"in flight, wrapped again", fmt.Errorf("x: %w", &JobError{Step: "dump", Err: errAgents([]error{other, inflight}), Parts: running}), true},
		{"in flight, a part does not run", &JobError{Step: "dump", Err: inflight, Parts: stopped}, false},
		{"another failure", &JobError{Step: "dump", Err: other, Parts: running}, false},
		{"no parts said", &JobError{Step: "dump", Err: inflight}, false},
		{"refused before anything stopped", fmt.Errorf("refused: %w", inflight), false},
	} {
		if got := jobInFlight(c.err); got != c.want {
			t.Errorf("%s: jobInFlight = %v, want %v", c.name, got, c.want)
		}
	}
}
