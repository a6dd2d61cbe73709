package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// First byte of binary WebSocket frames.
const (
	frameStdin  = 0
	frameStdout = 1
	frameStderr = 2
)

// wsControl is a JSON text frame of the exec WebSocket.
type wsControl struct {
	Type   string          `json:"type"`
	Signal json.RawMessage `json:"signal,omitempty"`
	Rows   int             `json:"rows,omitempty"`
	Cols   int             `json:"cols,omitempty"`
}

// wsExit is the server's last text frame.
type wsExit struct {
	Type         string   `json:"type"`
	ExitCode     int      `json:"exit_code"`
	Signal       int      `json:"signal"`
	TimedOut     bool     `json:"timed_out"`
	ErrorMessage string   `json:"error_message,omitempty"`
	DurationMS   float64  `json:"duration_ms"`
	Problem      *Problem `json:"problem,omitempty"`
}

type wsConn struct{ c *websocket.Conn }

var signals = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT, "SIGKILL": syscall.SIGKILL,
	"SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGTERM": syscall.SIGTERM, "SIGCONT": syscall.SIGCONT,
	"SIGSTOP": syscall.SIGSTOP, "SIGWINCH": syscall.SIGWINCH,
}

// parseSignal accepts "SIGINT", "INT" or a number 1..64.
func parseSignal(raw json.RawMessage) (syscall.Signal, error) {
	var n int
	if err := json.Unmarshal(raw, &n); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("signal %d out of range", n)
		}
		return syscall.Signal(n), nil
	}
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return 0, errors.New("signal must be a name (\"SIGINT\") or a number")
	}
	name = strings.ToUpper(name)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig, ok := signals[name]; ok {
		return sig, nil
	}
	if n, err := strconv.Atoi(name[3:]); err == nil && n >= 1 && n <= 64 {
		return syscall.Signal(n), nil
	}
	return 0, fmt.Errorf("unknown signal %q", name)
}

func (s *Server) trackStream(c *wsConn) func() {
	s.streams.Add(1)
	s.inflight.Add(1)
	s.mu.Lock()
	s.wsConns[c] = struct{}{}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.wsConns, c)
		s.mu.Unlock()
		s.lastBusy.Store(time.Now().UnixNano())
		s.inflight.Add(-1)
		s.streams.Done()
	}
}

// closeStreams cuts every open exec stream (at the end of a drain).
func (s *Server) closeStreams() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.wsConns {
		c.c.Close(websocket.StatusGoingAway, "server shutting down")
	}
}

// wsWrite writes one message, waiting at most Config.WriteStall for the
// client to take it: past that the connection is closed (coder/websocket
// closes it when a write's context ends), so a client that stops reading
// holds no goroutine, exec or buffer beyond it.
func (s *Server) wsWrite(ctx context.Context, c *websocket.Conn, typ websocket.MessageType, msg []byte) error {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.WriteStall)
	defer cancel()
	return c.Write(wctx, typ, msg)
}

// handleExecWS serves GET /v1/boxes/{id}/exec/ws (see wsOperation).
func (s *Server) handleExecWS(w http.ResponseWriter, r *http.Request) {
	b, err := s.callBox(r.Context(), r.PathValue("id"))
	if err != nil {
		writeProblem(w, err.(*Problem))
		return
	}
	release, err := s.acquire(r.Context())
	if err != nil {
		writeProblem(w, err.(*Problem))
		return
	}
	defer release()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept wrote the response
	}
	wc := &wsConn{c}
	defer s.trackStream(wc)()
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()

	fail := func(p *Problem) {
		msg, _ := json.Marshal(wsExit{Type: "error", Problem: p})
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		c.Write(wctx, websocket.MessageText, msg)
		wcancel()
		c.Close(websocket.StatusNormalClosure, "")
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	typ, first, err := c.Read(rctx)
	rcancel()
	if err != nil {
		return
	}
	var req ExecRequest
	if typ != websocket.MessageText || json.Unmarshal(first, &req) != nil || len(req.Cmd) == 0 || req.Cmd[0] == "" {
		fail(invalidField("/cmd", "the first message must be a text frame with an ExecRequest (JSON, cmd not empty)"))
		return
	}
	t0 := time.Now()
	audit := AuditEntry{Kind: "exec_stream", BoxID: b.ID(), Cmd: req.Cmd}
	p, err := b.ExecStream(ctx, req.Cmd[0], req.Cmd[1:], req.options())
	if err != nil {
		s.audit(r.Context(), audit, t0, err)
		fail(problem(err).(*Problem))
		return
	}
	execID, forget := s.register(r.Context(), "exec_stream", b.ID(), req.Cmd, p)
	defer forget()
	started, _ := json.Marshal(map[string]string{"type": "started", "exec_id": execID})
	if err := s.wsWrite(ctx, c, websocket.MessageText, started); err != nil {
		p.Kill()
		p.Wait()
		return
	}

	var wg sync.WaitGroup
	pump := func(tag byte, rd io.Reader) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		buf[0] = tag
		for {
			n, err := rd.Read(buf[1:])
			if n > 0 {
				if werr := s.wsWrite(ctx, c, websocket.MessageBinary, buf[:1+n]); werr != nil {
					p.Kill()
					io.Copy(io.Discard, rd)
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(frameStdout, p.Stdout())
	go pump(frameStderr, p.Stderr())

	// Client messages: stdin, control. A read error (client gone) kills
	// the process.
	go func() {
		stdin := p.Stdin()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				select {
				case <-p.Done():
				default:
					p.Kill()
				}
				return
			}
			if typ == websocket.MessageBinary {
				if len(msg) > 0 && msg[0] == frameStdin {
					stdin.Write(msg[1:])
				}
				continue
			}
			var ctl wsControl
			if json.Unmarshal(msg, &ctl) != nil {
				continue
			}
			switch ctl.Type {
			case "close_stdin":
				stdin.Close()
			case "kill":
				p.Kill()
			case "signal":
				if sig, err := parseSignal(ctl.Signal); err == nil {
					p.Signal(sig)
				}
			case "resize":
				// Only for tty execs; a bad size or a pipe exec is
				// ignored (the stream carries no replies).
				if req.TTY && ctl.Rows > 0 && ctl.Cols > 0 && ctl.Rows <= 10000 && ctl.Cols <= 10000 {
					p.Resize(ctl.Rows, ctl.Cols)
				}
			}
		}
	}()

	wg.Wait()
	res, err := p.Wait()
	if res != nil {
		audit.ExitCode, audit.TimedOut = intp(res.ExitCode), res.TimedOut
	}
	s.audit(r.Context(), audit, t0, err)
	if err != nil {
		fail(problem(err).(*Problem))
		return
	}
	msg, _ := json.Marshal(wsExit{Type: "exit", ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut,
		ErrorMessage: resultOf(res).ErrorMessage, DurationMS: ms(res.Duration)})
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if c.Write(wctx, websocket.MessageText, msg) == nil {
		c.Close(websocket.StatusNormalClosure, "")
	}
}
