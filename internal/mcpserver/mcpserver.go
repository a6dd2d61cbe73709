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
)

// Limits on what a tool call returns or accepts.
const (
	// MaxReadBytes bounds read_file's content (1 MiB); longer files are
	// cut and say so.
	MaxReadBytes = 1 << 20
	// MaxOutputBytes bounds the stdout and stderr text returned by a call
	// (each); the rest is replaced by a note.
	MaxOutputBytes = 256 << 10
	// DefaultTimeout bounds a tool call that names no timeout.
	DefaultTimeout = 5 * time.Minute
)

// Options configure the session's box.
type Options struct {
	// Box describes the box made on the first tool call (default
	// python:slim).
	Box airlock.BoxOptions
	// Version is reported to clients.
	Version string
}

// session is the state of one MCP session: its box and Python context.
type session struct {
	rt   *airlock.Runtime
	opts Options

	mu  sync.Mutex
	cb  *codebox.CodeBox
	ctx *codebox.Context
}

func (s *session) box(ctx context.Context) (*codebox.CodeBox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cb == nil {
		cb, err := codebox.New(ctx, s.rt, codebox.Options{BoxOptions: s.opts.Box})
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
}

// New returns a Server; serve it with Serve (stdio) or HTTPHandler.
func New(rt *airlock.Runtime, opts Options) *Server {
	s := &Server{rt: rt, opts: opts, sessions: map[*mcp.ServerSession]*session{}}
	s.mcp = newServer(s.session, opts.Version)
	return s
}

// session returns the state of ss, made on its first tool call; it is
// removed, with its box, when ss ends.
func (s *Server) session(ss *mcp.ServerSession) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.sessions[ss]
	if st == nil {
		st = &session{rt: s.rt, opts: s.opts}
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
// removed.
func (s *Server) HTTPHandler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{SessionTimeout: 10 * time.Minute})
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
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{text("%v", err)}}
}

func clip(s string) string {
	if len(s) <= MaxOutputBytes {
		return s
	}
	return s[:MaxOutputBytes] + fmt.Sprintf("\n[... %d more bytes not shown]", len(s)-MaxOutputBytes)
}

func timeoutOf(secs float64) time.Duration {
	if secs <= 0 {
		return DefaultTimeout
	}
	return time.Duration(secs * float64(time.Second))
}

// PythonArgs are execute_python's arguments.
type PythonArgs struct {
	Code    string  `json:"code" jsonschema:"Python source to run; the value of a final expression is returned"`
	Timeout float64 `json:"timeout,omitempty" jsonschema:"seconds (default 300); the cell is interrupted past it"`
}

// CommandArgs are execute_command's arguments.
type CommandArgs struct {
	Command string  `json:"command" jsonschema:"shell command, run with sh -c in the box"`
	Timeout float64 `json:"timeout,omitempty" jsonschema:"seconds (default 300); the process tree is killed past it"`
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

func newServer(state sessionOf, version string) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "airlock", Version: version}, nil)

	mcp.AddTool(srv, &mcp.Tool{Name: "execute_python",
		Description: "Run Python code in an isolated microVM. State (variables, imports, functions) persists between calls. " +
			"Returns stdout, stderr, the value of the last expression, the exception if one was raised, and matplotlib figures as PNG images."},
		func(ctx context.Context, req *mcp.CallToolRequest, in PythonArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			x, err := s.pyContext(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			rctx, cancel := context.WithTimeout(ctx, timeoutOf(in.Timeout))
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
				fmt.Fprintf(&b, "error: %s: %s\n%s", r.Error.Name, r.Error.Value, clip(r.Error.Traceback))
				res.IsError = true
			}
			if b.Len() == 0 {
				b.WriteString("(no output)")
			}
			res.Content = append(res.Content, text("%s", strings.TrimRight(b.String(), "\n")))
			for _, im := range r.Images {
				res.Content = append(res.Content, &mcp.ImageContent{Data: im.Data, MIMEType: im.MIMEType})
			}
			return res, nil, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "execute_command",
		Description: "Run a shell command (sh -c) in the isolated microVM; returns the exit code, stdout and stderr."},
		func(ctx context.Context, req *mcp.CallToolRequest, in CommandArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			cb, err := s.box(ctx)
			if err != nil {
				return errResult(err), nil, nil
			}
			r, err := cb.Exec(ctx, "sh", []string{"-c", in.Command}, airlock.ExecOptions{Timeout: timeoutOf(in.Timeout)})
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
			return &mcp.CallToolResult{Content: []mcp.Content{text("%s%s", bytes.ToValidUTF8(data, []byte("\uFFFD")), note)}}, nil, nil
		})

	mcp.AddTool(srv, &mcp.Tool{Name: "install_packages", Description: "pip install Python packages in the microVM (needs the package index to be reachable from the box)."},
		func(ctx context.Context, req *mcp.CallToolRequest, in InstallArgs) (*mcp.CallToolResult, any, error) {
			s := state(req.Session)
			if len(in.Packages) == 0 {
				return errResult(errors.New("no packages given")), nil, nil
			}
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
	return srv
}
