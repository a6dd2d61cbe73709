package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/danielgtaylor/huma/v2"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/headtail"
)

// Output encodings (ExecResult.StdoutEncoding, ExecRequest.StdinEncoding).
const (
	EncodingUTF8   = "utf-8"
	EncodingBase64 = "base64"
)

// ExecRequest is the body of POST /v1/boxes/{id}/exec and the first
// message of the exec WebSocket.
type ExecRequest struct {
	Cmd           []string `json:"cmd" minItems:"1" maxItems:"4096" doc:"argv; cmd[0] is looked up in the box's PATH."`
	Env           EnvList  `json:"env,omitempty" doc:"Variables for this exec only: [\"KEY=value\", ...] or {\"KEY\": \"value\"}."`
	User          string   `json:"user,omitempty" maxLength:"256"`
	WorkingDir    string   `json:"working_dir,omitempty" maxLength:"4096"`
	Timeout       float64  `json:"timeout,omitempty" minimum:"0" doc:"Seconds; the process tree is killed past it and timed_out is set. 0: none."`
	Stdin         string   `json:"stdin,omitempty" doc:"Standard input (buffered exec only); the process reads EOF after it."`
	StdinEncoding string   `json:"stdin_encoding,omitempty" enum:"utf-8,base64" doc:"Encoding of stdin (default utf-8)."`
	TTY           bool     `json:"tty,omitempty" doc:"Run on a terminal (PTY) in the box: all output arrives as stdout, with CRLF line ends; a 0x03 byte on stdin is Ctrl-C (SIGINT). Resize it with a resize frame on the WebSocket."`
	Rows          int      `json:"rows,omitempty" minimum:"0" maximum:"10000" doc:"Terminal rows of a tty exec (default 24)."`
	Cols          int      `json:"cols,omitempty" minimum:"0" maximum:"10000" doc:"Terminal columns of a tty exec (default 80)."`
}

// ExecResult is the result of a buffered exec. A non-zero exit code is a
// result, not an error.
type ExecResult struct {
	ExitCode       int     `json:"exit_code" doc:"Exit status; 128+N when killed by signal N; 127 command not found."`
	Signal         int     `json:"signal,omitempty" doc:"Signal that killed the process, 0 otherwise."`
	Stdout         string  `json:"stdout"`
	StdoutEncoding string  `json:"stdout_encoding" enum:"utf-8,base64" doc:"base64 when stdout is not valid UTF-8, or when escaping it for JSON would more than double it (control characters such as NUL); bytes are never mangled."`
	Stderr         string  `json:"stderr"`
	StderrEncoding string  `json:"stderr_encoding" enum:"utf-8,base64"`
	TimedOut       bool    `json:"timed_out"`
	Truncated      bool    `json:"truncated" doc:"Output was cut: past the server's limit (airlock serve --max-output, 16 MiB a stream by default) only the first and the last half of it are kept, and stdout_dropped / stderr_dropped bytes between them are left out."`
	StdoutDropped  int64   `json:"stdout_dropped,omitempty" doc:"Bytes of stdout left out between its kept head and tail."`
	StderrDropped  int64   `json:"stderr_dropped,omitempty" doc:"Bytes of stderr left out between its kept head and tail."`
	ErrorMessage   string  `json:"error_message,omitempty" doc:"Set when the process could not run or died for a reason not in its output."`
	DurationMS     float64 `json:"duration_ms" doc:"Host-side duration of the exec."`
}

// errEmptyCmd is the refusal of an exec whose cmd is empty or null
// (pointing at /cmd) or names no command (cmd[0] "": at /cmd/0).
func errEmptyCmd(cmd []string) *Problem {
	if len(cmd) == 0 {
		return invalidField("/cmd", "cmd must name a command: [\"ls\", \"-l\"]")
	}
	return invalidField("/cmd/0", "cmd[0] must name a command: [\"ls\", \"-l\"]")
}

// encode returns b as a UTF-8 string when it is valid UTF-8 and its JSON
// encoding is at most twice its size, else base64 (4/3 of it): output full
// of NULs, which JSON writes as \u0000, costs no more than twice its bytes
// in the response either way.
func encode(b []byte) (string, string) {
	if utf8.Valid(b) && headtail.JSONSize(string(b)) <= 2*len(b) {
		return string(b), EncodingUTF8
	}
	return base64.StdEncoding.EncodeToString(b), EncodingBase64
}

func decode(s, enc string) ([]byte, error) {
	if enc == EncodingBase64 {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, invalidField("/stdin", "stdin is not valid base64 (stdin_encoding base64): "+err.Error())
		}
		return b, nil
	}
	return []byte(s), nil
}

// maxMessage bounds, in bytes of JSON, an exec's error_message (which the
// guest's agent writes).
const maxMessage = 64 << 10

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func resultOf(r *airlock.ExecResult) ExecResult {
	out := ExecResult{ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, ErrorMessage: r.ErrorMessage, DurationMS: ms(r.Duration),
		Truncated: r.Truncated, StdoutDropped: r.StdoutDropped, StderrDropped: r.StderrDropped}
	// The agent's word on why the process failed: bounded like output.
	out.ErrorMessage, _ = clipText(r.ErrorMessage, maxMessage)
	out.Stdout, out.StdoutEncoding = encode(r.Stdout)
	out.Stderr, out.StderrEncoding = encode(r.Stderr)
	return out
}

func (req *ExecRequest) options() airlock.ExecOptions {
	return airlock.ExecOptions{Env: req.Env, User: req.User, WorkingDir: req.WorkingDir,
		Timeout: seconds(req.Timeout), TTY: req.TTY, Rows: req.Rows, Cols: req.Cols}
}

func (s *Server) registerExec() {
	huma.Register(s.api, huma.Operation{
		OperationID: "exec", Method: http.MethodPost, Path: "/v1/boxes/{id}/exec", Tags: []string{"exec"},
		Summary: "Run a command and wait for it",
		Description: "Runs cmd in the box and returns its exit code and output. For output as it happens, stdin " +
			"while it runs, or signals, use the WebSocket at /v1/boxes/{id}/exec/ws.",
		Errors: []int{http.StatusNotFound, http.StatusConflict, http.StatusTooManyRequests, http.StatusBadGateway},
	}, func(ctx context.Context, in *struct {
		ID   string `path:"id" maxLength:"128"`
		Body ExecRequest
	}) (*struct{ Body ExecResult }, error) {
		if len(in.Body.Cmd) == 0 || in.Body.Cmd[0] == "" {
			return nil, errEmptyCmd(in.Body.Cmd)
		}
		b, err := s.callBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		release, err := s.acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
		opts := in.Body.options()
		if in.Body.Stdin != "" {
			data, err := decode(in.Body.Stdin, in.Body.StdinEncoding)
			if err != nil {
				return nil, err
			}
			opts.Stdin = bytes.NewReader(data)
		}
		t0 := time.Now()
		res, err := s.execBuffered(ctx, b, in.Body.Cmd, opts)
		e := AuditEntry{Kind: "exec", BoxID: b.ID(), Cmd: in.Body.Cmd}
		if res != nil {
			e.ExitCode, e.TimedOut = intp(res.ExitCode), res.TimedOut
		}
		s.audit(ctx, e, t0, err)
		if err != nil {
			return nil, problem(err)
		}
		return &struct{ Body ExecResult }{resultOf(res)}, nil
	})
}

// execBuffered is Box.Exec, with the process listed in s.execs (so that
// it can be killed by id) while it runs. Each stream keeps at most
// Config.MaxOutputBytes (its head and tail past that), as Box.Exec does.
func (s *Server) execBuffered(ctx context.Context, b *airlock.Box, cmd []string, opts airlock.ExecOptions) (*airlock.ExecResult, error) {
	opts.MaxOutput = s.cfg.MaxOutputBytes
	p, err := b.ExecStart(ctx, cmd[0], cmd[1:], opts)
	if err != nil {
		return nil, err
	}
	_, forget := s.register(ctx, "exec", b.ID(), cmd, p)
	defer forget()
	return p.Wait()
}

// seconds converts a client's timeout in seconds to a Duration; one past
// what a Duration holds (about 292 years) saturates rather than wrapping to
// a negative value.
func seconds(secs float64) time.Duration {
	if secs <= 0 || secs != secs {
		return 0
	}
	if secs >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(secs * float64(time.Second))
}

// wsOperation documents the exec WebSocket in the OpenAPI document; it is
// served by handleExecWS, not by huma.
func wsOperation() *huma.Operation {
	return &huma.Operation{
		OperationID: "exec-stream", Method: http.MethodGet, Path: "/v1/boxes/{id}/exec/ws", Tags: []string{"exec"},
		Summary: "Run a command over a WebSocket (streaming)",
		Description: fmt.Sprintf("Upgrade to a WebSocket. The client's first message is a text frame with an ExecRequest "+
			"(JSON; stdin fields ignored). Then: binary frames from the server are output, first byte %d = stdout, %d = stderr, "+
			"the rest the bytes; binary frames from the client are stdin, first byte %d, the rest the bytes. Text frames are "+
			"JSON control messages: client→server {\"type\":\"close_stdin\"}, {\"type\":\"signal\",\"signal\":\"SIGINT\"}, "+
			"{\"type\":\"kill\"}, {\"type\":\"resize\",\"rows\":R,\"cols\":C} (tty execs: the terminal's new size; the process gets SIGWINCH); server→client "+
			"{\"type\":\"started\",\"exec_id\":ID}, then at the end {\"type\":\"exit\",\"exit_code\":N,\"signal\":S,\"timed_out\":B,"+
			"\"error_message\":M,\"duration_ms\":D} or {\"type\":\"error\",\"problem\":{...}}, after which the server closes "+
			"the socket normally. Closing the socket early kills the process tree. See docs/server.md.",
			frameStdout, frameStderr, frameStdin),
		Parameters: []*huma.Param{{Name: "id", In: "path", Required: true, Schema: &huma.Schema{Type: "string"}, Description: "Box id, id prefix or name."}},
		Responses: map[string]*huma.Response{
			"101": {Description: "Switching to the WebSocket protocol."},
			"404": {Description: "No such box.", Content: map[string]*huma.MediaType{"application/problem+json": {Schema: &huma.Schema{Ref: "#/components/schemas/Problem"}}}},
		},
	}
}
