package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The coordinator's side of one agent: its ssh session, the requests it
// sends and the events it reads back.

// agentConn is one host's agent.
type agentConn struct {
	host   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	line   *jobLine
	events chan jobMsg
	// readErr says why events ended (after it is closed)
	readErr error
	stderr  *lockedBuffer
}

// lockedBuffer is the agent's stderr, written by exec's copier and read
// for messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startAgent starts `gpucr job-agent ARGS` at t (checked already: its
// shared connection open). Its session outlives ctx's cancellation: an
// interrupted coordinator still tells the agents to give their parts back.
func startAgent(ctx context.Context, t *SSHTarget, args []string) (*agentConn, error) {
	stderr := &lockedBuffer{}
	cmd, in, out, err := t.start(context.WithoutCancel(ctx), t.gpucr(append([]string{"job-agent"}, args...)...), stderr)
	if err != nil {
		return nil, err
	}
	a := &agentConn{host: t.Host, cmd: cmd, stdin: in, line: &jobLine{w: in}, events: make(chan jobMsg, 8), stderr: stderr}
	go func() { a.readErr = readJobMsgs(out, a.events); close(a.events) }()
	return a, nil
}

// send sends a request.
func (a *agentConn) send(m jobMsg) error {
	if err := a.line.send(m); err != nil {
		return fmt.Errorf("%s: the agent does not listen: %w%s", a.host, err, a.stderrTail())
	}
	return nil
}

// next reads the agent's next event, within timeout. An error event is
// returned as an error (with the message), as is the session's end.
func (a *agentConn) next(timeout time.Duration) (jobMsg, error) {
	select {
	case m, ok := <-a.events:
		if !ok {
			why := "its session ended"
			if a.readErr != nil {
				why = a.readErr.Error()
			}
			return jobMsg{}, fmt.Errorf("%s: the agent is gone (%s)%s", a.host, why, a.stderrTail())
		}
		if m.Event == evError {
			return m, &agentFailure{host: a.host, msg: m.Error, inFlight: m.InFlight}
		}
		return m, nil
	case <-time.After(timeout):
		return jobMsg{}, fmt.Errorf("%s: no answer from the agent in %v", a.host, timeout)
	}
}

// expect reads the next event and wants it to be want.
func (a *agentConn) expect(want string, timeout time.Duration) (jobMsg, error) {
	m, err := a.next(timeout)
	if err == nil && m.Event != want {
		err = fmt.Errorf("%s: the agent answered %q, not %q", a.host, m.Event, want)
	}
	return m, err
}

// stderrTail is the last lines the agent wrote to stderr, for a message.
func (a *agentConn) stderrTail() string {
	s := strings.TrimSpace(a.stderr.String())
	if s == "" {
		return ""
	}
	if len(s) > 1500 {
		s = "..." + s[len(s)-1500:]
	}
	return "; its stderr: " + s
}

// close ends the session: the agent reads the end of its input (and gives
// back a part it still holds stopped) and exits.
func (a *agentConn) close() {
	_ = a.stdin.Close()
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
}

// errAgents joins the errors of several agents.
func errAgents(errs []error) error { return errors.Join(errs...) }

// agentFailure is a request an agent answered with an error.
type agentFailure struct {
	host, msg string
	// inFlight: its dump met a TCP connection in flight (the job is
	// taken again)
	inFlight bool
}

func (e *agentFailure) Error() string { return e.host + ": " + e.msg }

// errPartInFlight is what an agentFailure of a dump that met a connection
// in flight is (errors.Is finds it among the failures of several parts).
var errPartInFlight = errors.New("a part's dump met a TCP connection in flight")

func (e *agentFailure) Is(target error) bool { return target == errPartInFlight && e.inFlight }
