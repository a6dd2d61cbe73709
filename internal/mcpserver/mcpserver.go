// Package mcpserver is airlock's Model Context Protocol server (airlock
// mcp): tools that run model-written code in one box per session, on the
// official MCP Go SDK.
//
// Tools: execute_python (a stateful Python context: variables persist
// between calls; matplotlib figures come back as image content),
// execute_command (sh -c), write_file, read_file and install_packages. The
// box is created on the first tool call and removed when the session ends.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/headtail"
)

// Limits on what a tool call returns or accepts.
const (
	// MaxReadBytes bounds read_file's content (1 MiB); longer files are
	// cut and say so.
	MaxReadBytes = 1 << 20
	// MaxOutputBytes bounds each text a call returns (stdout, stderr, a
	// value, a traceback), measured as JSON encodes it (a NUL byte takes
	// 6): past it the head and the tail are kept, with a note between.
	MaxOutputBytes = 256 << 10
	// MaxErrorBytes bounds the text of an error returned to the model, as
	// MaxOutputBytes does.
	MaxErrorBytes = 16 << 10
	// MaxImageBytes bounds the images (matplotlib figures) of one call,
	// in all; figures past it are left out with a note.
	MaxImageBytes = 4 << 20
	// DefaultTimeout bounds a tool call that names no timeout.
	DefaultTimeout = 5 * time.Minute
	// DefaultMaxTimeout is Options.MaxTimeout's default: the longest
	// timeout a model may ask for.
	DefaultMaxTimeout = time.Hour
	// DefaultMaxSessions is Options.MaxSessions's default.
	DefaultMaxSessions = 16
	// DefaultMaxCallsPerSession is Options.MaxCallsPerSession's default.
	DefaultMaxCallsPerSession = 4
	// MaxCheckpoints bounds the checkpoints the checkpoint tool keeps of a
	// session's box (each a copy of its memory and disk): one more is
	// refused, saying which exist.
	MaxCheckpoints = 8
)

// Options configure the session's box.
type Options struct {
	// Box describes the box made on the first tool call (default
	// python:slim).
	Box airlock.BoxOptions
	// Version is reported to clients.
	Version string
	// CheckBox, when set, is asked before a session makes its box, with
	// the options it would be made with; an error refuses the tool call,
	// its text going to the model. airlock serve applies its policy here,
	// as to a REST create (--max-boxes, --max-cpus, --max-memory, the
	// grants). release is called once the box is made or its making
	// failed.
	CheckBox func(ctx context.Context, opts *airlock.BoxOptions) (release func(), err error)
	// AcquireExec, when set, takes a slot for one tool call that runs
	// something in the box (airlock serve: one of --max-execs); release
	// gives it back. An error refuses the call.
	AcquireExec func(ctx context.Context) (release func(), err error)
	// MaxSessions bounds the sessions HTTPHandler serves at once (default
	// DefaultMaxSessions, 16; each may have a box): a new one past it gets
	// 503 until one ends.
	MaxSessions int
	// MaxCallsPerSession bounds the tool calls one session runs at once
	// (default DefaultMaxCallsPerSession, 4); one more is refused.
	MaxCallsPerSession int
	// MaxTimeout caps the timeout a model may ask of a call (default
	// DefaultMaxTimeout, 1 h).
	MaxTimeout time.Duration
	// CheckCheckpoint, when set, is asked before the checkpoint tool saves
	// the session's box (airlock serve: --min-free-disk, the box's memory
	// and disk counted in full); an error refuses the call.
	CheckCheckpoint func(ctx context.Context, b *airlock.Box) error
}

func (o Options) withDefaults() Options {
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.MaxCallsPerSession <= 0 {
		o.MaxCallsPerSession = DefaultMaxCallsPerSession
	}
	if o.MaxTimeout <= 0 {
		o.MaxTimeout = DefaultMaxTimeout
	}
	return o
}

// session is the state of one MCP session: its box and Python context.
type session struct {
	rt   *airlock.Runtime
	opts Options

	calls chan struct{} // one token per tool call running

	mu  sync.Mutex
	cb  *codebox.CodeBox
	ctx *codebox.Context
}

// begin admits one tool call of the session (MaxCallsPerSession), and,
// when it runs something in the box (exec), takes an exec slot
// (AcquireExec); end returns what it took.
func (s *session) begin(ctx context.Context, exec bool) (end func(), err error) {
	select {
	case s.calls <- struct{}{}:
	default:
		return nil, fmt.Errorf("this session already runs %d tool calls at once, the server's limit: wait for one to finish", cap(s.calls))
	}
	release := func() {}
	if exec && s.opts.AcquireExec != nil {
		if release, err = s.opts.AcquireExec(ctx); err != nil {
			<-s.calls
			return nil, err
		}
	}
	return func() { release(); <-s.calls }, nil
}

// startTimeout bounds making a session's box and starting its Python.
const startTimeout = 5 * time.Minute

func (s *session) box(ctx context.Context) (*codebox.CodeBox, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cb == nil {
		bo := s.opts.Box
		release := func() {}
		if s.opts.CheckBox != nil {
			r, err := s.opts.CheckBox(ctx, &bo)
			if err != nil {
				return nil, err
			}
			release = r
		}
		cb, err := codebox.New(ctx, s.rt, codebox.Options{BoxOptions: bo})
		release()
		if err != nil {
			return nil, err
		}
		s.cb = cb
	}
	return s.cb, nil
}

func (s *session) pyContext(ctx context.Context) (*codebox.Context, error) {
	cb, err := s.box(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx == nil {
		x, err := cb.NewContext(ctx)
		if err != nil {
			return nil, err
		}
		s.ctx = x
	}
	return s.ctx, nil
}

// close removes the session's box.
func (s *session) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cb == nil {
		return nil
	}
	err := s.cb.Close()
	s.cb, s.ctx = nil, nil
	return err
}

// Server is an MCP server whose sessions each get their own box.
type Server struct {
	rt   *airlock.Runtime
	opts Options
	mcp  *mcp.Server

	mu       sync.Mutex
	sessions map[*mcp.ServerSession]*session
	closed   bool
	opening  map[*opener]bool // new sessions being initialized (HTTPHandler)
}

// opener is one initialize request in flight: id is the session id its
// response carries, once the MCP handler has set it.
type opener struct{ id string }

// openerWriter records the session id of an initialize response in op
// before the client can see it.
type openerWriter struct {
	http.ResponseWriter
	s  *Server
	op *opener
}

func (w *openerWriter) note() {
	if id := w.Header().Get("Mcp-Session-Id"); id != "" {
		w.s.mu.Lock()
		w.op.id = id
		w.s.mu.Unlock()
	}
}

func (w *openerWriter) WriteHeader(code int) { w.note(); w.ResponseWriter.WriteHeader(code) }

func (w *openerWriter) Write(b []byte) (int, error) { w.note(); return w.ResponseWriter.Write(b) }

func (w *openerWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *openerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// New returns a Server; serve it with Serve (stdio) or HTTPHandler.
func New(rt *airlock.Runtime, opts Options) *Server {
	opts = opts.withDefaults()
	s := &Server{rt: rt, opts: opts, sessions: map[*mcp.ServerSession]*session{}, opening: map[*opener]bool{}}
	s.mcp = newServer(s.session, opts)
	return s
}

// session returns the state of ss, made on its first tool call; it is
// removed, with its box, when ss ends.
func (s *Server) session(ss *mcp.ServerSession) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.sessions[ss]
	if st == nil {
		st = &session{rt: s.rt, opts: s.opts, calls: make(chan struct{}, s.opts.MaxCallsPerSession)}
		s.sessions[ss] = st
		go func() {
			ss.Wait()
			s.mu.Lock()
			delete(s.sessions, ss)
			s.mu.Unlock()
			st.close()
		}()
	}
	return st
}

// Close removes the boxes of every session.
func (s *Server) Close() error {
	s.mu.Lock()
	sts := make([]*session, 0, len(s.sessions))
	for _, st := range s.sessions {
		sts = append(sts, st)
	}
	s.mu.Unlock()
	var err error
	for _, st := range sts {
		if e := st.close(); e != nil {
			err = e
		}
	}
	return err
}

// HTTPHandler serves MCP's streamable HTTP transport (airlock serve mounts
// it at /mcp). A session idle for 10 minutes is closed, and its box
// removed. Past Options.MaxSessions sessions a new one gets 503.
func (s *Server) HTTPHandler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{SessionTimeout: 10 * time.Minute})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" || !isInitialize(r) {
			h.ServeHTTP(w, r)
			return
		}
		// A new session: counted while it initializes, then as one of
		// the MCP server's initialized sessions (a client's probe of a
		// newer protocol makes a session that is never initialized). The
		// client may send its next request before this handler has
		// returned: a session whose opener is still here counts once.
		s.mu.Lock()
		n := len(s.opening)
		ids := make(map[string]bool, len(s.opening))
		for op := range s.opening {
			if op.id != "" {
				ids[op.id] = true
			}
		}
		for ss := range s.mcp.Sessions() {
			if ss.InitializeParams() != nil && !ids[ss.ID()] {
				n++
			}
		}
		if n >= s.opts.MaxSessions {
			s.mu.Unlock()
			w.Header().Set("Retry-After", "30")
			http.Error(w, fmt.Sprintf("%d MCP sessions are open, the server's limit: close one (its box goes with it), or retry later", s.opts.MaxSessions),
				http.StatusServiceUnavailable)
			return
		}
		op := &opener{}
		s.opening[op] = true
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.opening, op)
			s.mu.Unlock()
		}()
		h.ServeHTTP(&openerWriter{ResponseWriter: w, s: s, op: op}, r)
	})
}

// isInitialize reports whether r's body is an initialize request (the
// one that opens a session); the body is kept for the MCP handler, which
// bounds its size.
func isInitialize(r *http.Request) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, mcp.DefaultMaxRequestBodyBytes+1))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	var msg struct {
		Method string `json:"method"`
	}
	return err == nil && json.Unmarshal(body, &msg) == nil && msg.Method == "initialize"
}

// Serve runs one MCP session over t (mcp.StdioTransport for airlock mcp)
// until the client disconnects or ctx ends, then removes the box.
func Serve(ctx context.Context, rt *airlock.Runtime, t mcp.Transport, opts Options) error {
	s := New(rt, opts)
	defer s.Close()
	return s.mcp.Run(ctx, t)
}

func text(format string, a ...any) *mcp.TextContent {
	return &mcp.TextContent{Text: fmt.Sprintf(format, a...)}
}

func errResult(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{text("%s", clipTo(err.Error(), MaxErrorBytes))}}
}

// clipTo cuts s so that its JSON encoding fits in max bytes: the head and
// the tail are kept, with a note between saying how many bytes were left
// out.
func clipTo(s string, max int) string {
	const room = 64 // the note
	head, tail, dropped := headtail.ClipText(s, max-room)
	if dropped == 0 {
		return s
	}
	return head + fmt.Sprintf("\n[... %d bytes not shown ...]\n", dropped) + tail
}

func clip(s string) string { return clipTo(s, MaxOutputBytes) }

// timeoutOf is the timeout of a call that asked for secs seconds: the
// default for none, at most max (a huge or overflowing value included).
func timeoutOf(secs float64, max time.Duration) time.Duration {
	switch {
	case secs <= 0 || secs != secs:
		return min(DefaultTimeout, max)
	case secs >= max.Seconds():
		return max
	}
	return time.Duration(secs * float64(time.Second))
}

// PythonArgs are execute_python's arguments.
type PythonArgs struct {
	Code    string  `json:"code" jsonschema:"Python source to run; the value of a final expression is returned"`
	Timeout float64 `json:"timeout,omitempty" jsonschema:"seconds (default 300, at most the server's limit, 3600 by default); the cell is interrupted past it"`
}

// CommandArgs are execute_command's arguments.
type CommandArgs struct {
	Command string  `json:"command" jsonschema:"shell command, run with sh -c in the box"`
	Timeout float64 `json:"timeout,omitempty" jsonschema:"seconds (default 300, at most the server's limit, 3600 by default); the process tree is killed past it"`
}

// WriteArgs are write_file's arguments.
type WriteArgs struct {
	Path    string `json:"path" jsonschema:"absolute path in the box (a relative one is taken from /); parent directories are created; an existing file is replaced atomically"`
	Content string `json:"content" jsonschema:"text to write"`
}

// ReadArgs are read_file's arguments.
type ReadArgs struct {
	Path string `json:"path" jsonschema:"absolute path in the box (a relative one is taken from /)"`
}

// InstallArgs are install_packages' arguments.
type InstallArgs struct {
	Packages []string `json:"packages" jsonschema:"pip requirements, e.g. requests or numpy==1.26.4"`
}

// CheckpointArgs are checkpoint's and rollback's arguments.
type CheckpointArgs struct {
	Name string `json:"name" jsonschema:"the checkpoint's name: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"`
}

// boxPath makes a tool's path absolute: a relative one is taken from the
// box's root.
func boxPath(p string) string {
	if strings.HasPrefix(p, "/") {
		return p
	}
	return "/" + p
}

// sessionOf finds the state of the session a request came on.
type sessionOf func(*mcp.ServerSession) *session

func newServer(state sessionOf, opts Options) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "airlock", Version: opts.Version}, nil)

	mcp.AddTool(srv, &mcp.Tool{Name: "execute_python",
		Description: "Run Python code in an isolated microVM. State (variables, imports, functions) persists between calls. " +
			"Returns stdout, stderr, the value of the last expression, the exception if one was raised, and matplotlib figures as PNG images."},
		func(ctx context.Context, req *mcp.CallToolRequest, in PythonArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			end, err := s.begin(ctx, true)
			if err != nil {
				return errResult(err), nil, nil
			}
			defer end()
			x, err := s.pyContext(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			rctx, cancel := context.WithTimeout(ctx, timeoutOf(in.Timeout, opts.MaxTimeout))
			defer cancel()
			defer cancel()
			r, err := x.Run(rctx, in.Code)
			if r == nil {
				return errResult(err), nil, nil
			}
			res := &mcp.CallToolResult{}
			var b strings.Builder
			if r.Stdout != "" {
				fmt.Fprintf(&b, "stdout:\n%s\n", clip(r.Stdout))
			}
			if r.Stderr != "" {
				fmt.Fprintf(&b, "stderr:\n%s\n", clip(r.Stderr))
			}
			if r.Value != "" {
				fmt.Fprintf(&b, "value: %s\n", clip(r.Value))
			}
			if r.TimedOut || errors.Is(err, context.DeadlineExceeded) {
				b.WriteString("timed out: the cell was interrupted\n")
				res.IsError = true
			}
			if r.StateLost {
				b.WriteString("note: the interpreter was restarted; earlier variables are gone\n")
			}
			if r.Error != nil {
				fmt.Fprintf(&b, "error: %s: %s\n%s", clipTo(r.Error.Name, 1<<10), clip(r.Error.Value), clip(r.Error.Traceback))
				res.IsError = true
			}
			if b.Len() == 0 {
				b.WriteString("(no output)")
			}
			images, left := 0, 0
			for _, im := range r.Images {
				if images+len(im.Data) > MaxImageBytes || im.MIMEType != "image/png" {
					left++
					continue
				}
				images += len(im.Data)
				res.Content = append(res.Content, &mcp.ImageContent{Data: im.Data, MIMEType: im.MIMEType})
			}
			if left > 0 {
				fmt.Fprintf(&b, "\nnote: %d figure(s) left out: a call returns at most %d bytes of PNG", left, MaxImageBytes)
			}
			res.Content = append([]mcp.Content{text("%s", strings.TrimRight(b.String(), "\n"))}, res.Content...)
			return res, nil, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "execute_command",
		Description: "Run a shell command (sh -c) in the isolated microVM; returns the exit code, stdout and stderr."},
		func(ctx context.Context, req *mcp.CallToolRequest, in CommandArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			end, err := s.begin(ctx, true)
			if err != nil {
				return errResult(err), nil, nil
			}
			defer end()
			cb, err := s.box(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			// Each stream's head and tail within what the model sees.
			r, err := cb.Exec(ctx, "sh", []string{"-c", in.Command}, airlock.ExecOptions{Timeout: timeoutOf(in.Timeout, opts.MaxTimeout), MaxOutput: 4 * MaxOutputBytes})
			if err != nil {
				return errResult(err), nil, nil
			}
			msg := fmt.Sprintf("exit code: %d\nstdout:\n%s\nstderr:\n%s", r.ExitCode, clip(string(r.Stdout)), clip(string(r.Stderr)))
			if r.TimedOut {
				msg += "\ntimed out: the process tree was killed"
			}
			return &mcp.CallToolResult{IsError: r.ExitCode != 0, Content: []mcp.Content{text("%s", msg)}}, nil, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "write_file", Description: "Write a text file in the microVM (parent directories are created)."},
		func(ctx context.Context, req *mcp.CallToolRequest, in WriteArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			end, err := s.begin(ctx, false)
			if err != nil {
				return errResult(err), nil, nil
			}
			defer end()
			ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
			defer cancel()
			cb, err := s.box(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			if err := cb.WriteFile(ctx, boxPath(in.Path), []byte(in.Content), 0); err != nil {
				return errResult(err), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{text("wrote %d bytes to %s", len(in.Content), in.Path)}}, nil, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "read_file", Description: fmt.Sprintf("Read a text file in the microVM (at most %d bytes).", MaxReadBytes)},
		func(ctx context.Context, req *mcp.CallToolRequest, in ReadArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			end, err := s.begin(ctx, false)
			if err != nil {
				return errResult(err), nil, nil
			}
			defer end()
			ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
			defer cancel()
			cb, err := s.box(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			rc, _, err := cb.Box().OpenFile(ctx, boxPath(in.Path))
			if err != nil {
				return errResult(err), nil, nil
			}
			data, err := io.ReadAll(io.LimitReader(rc, MaxReadBytes+1))
			rc.Close()
			if err != nil {
				return errResult(err), nil, nil
			}
			note := ""
			if len(data) > MaxReadBytes {
				data = data[:MaxReadBytes]
				note = fmt.Sprintf("\n[cut at %d bytes]", MaxReadBytes)
			}
			// NULs and the like cost up to 6 bytes each once JSON-encoded.
			content := clipTo(string(bytes.ToValidUTF8(data, []byte("\uFFFD"))), 2*MaxReadBytes)
			return &mcp.CallToolResult{Content: []mcp.Content{text("%s%s", content, note)}}, nil, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "install_packages", Description: "pip install Python packages in the microVM (needs the package index to be reachable from the box)."},
		func(ctx context.Context, req *mcp.CallToolRequest, in InstallArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			if len(in.Packages) == 0 {
				return errResult(errors.New("no packages given")), nil, nil
			}
			end, err := s.begin(ctx, true)
			if err != nil {
				return errResult(err), nil, nil
			}
			defer end()
			ctx, cancel := context.WithTimeout(ctx, opts.MaxTimeout)
			defer cancel()
			cb, err := s.box(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			out, err := cb.InstallPackages(ctx, in.Packages...)
			res := &mcp.CallToolResult{Content: []mcp.Content{text("%s", clip(out))}}
			if err != nil {
				res.IsError = true
				if out == "" {
					res.Content = []mcp.Content{text("%v", err)}
				}
			}
			return res, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "checkpoint",
		Description: "Save the microVM's whole state (Python variables, files, running processes) as a named checkpoint, " +
			"to return to with rollback. Take one before a risky step."},
		func(ctx context.Context, req *mcp.CallToolRequest, in CheckpointArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			end, err := s.begin(ctx, true)
			if err != nil {
				return errResult(err), nil, nil
			}
			defer end()
			ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
			defer cancel()
			cb, err := s.box(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			if list, err := cb.Box().Checkpoints(); err != nil {
				return errResult(err), nil, nil
			} else if len(list) >= MaxCheckpoints {
				names := make([]string, len(list))
				for i, c := range list {
					names[i] = c.Name
				}
				return errResult(fmt.Errorf("this session keeps at most %d checkpoints (%s): roll back to one of them instead", MaxCheckpoints, strings.Join(names, ", "))), nil, nil
			}
			if opts.CheckCheckpoint != nil {
				if err := opts.CheckCheckpoint(ctx, cb.Box()); err != nil {
					return errResult(err), nil, nil
				}
			}
			c, err := cb.Box().Checkpoint(ctx, in.Name)
			if err != nil {
				return errResult(err), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{text("checkpoint %s saved", c.Name)}}, nil, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "rollback",
		Description: "Undo: return the microVM to a checkpoint. Python variables, files and processes are as they were when it was taken; " +
			"everything done since is gone. The checkpoint stays, to roll back to again."},
		func(ctx context.Context, req *mcp.CallToolRequest, in CheckpointArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			end, err := s.begin(ctx, true)
			if err != nil {
				return errResult(err), nil, nil
			}
			defer end()
			ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
			defer cancel()
			cb, err := s.box(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			if err := cb.Rollback(ctx, in.Name); err != nil {
				return errResult(err), nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{text("rolled back to checkpoint %s", in.Name)}}, nil, nil
		})
	return srv
}
