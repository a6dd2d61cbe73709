package mcpserver_test

import (
	"context"
	"errors"
	"math"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/mcpserver"
	"github.com/airlock-run/airlock/internal/server"
)

// noImage is an image no box can be made of without a pull, and whose pull
// fails at once on loopback (nothing leaves the host).
const noImage = "127.0.0.1:1/nosuch:1"

// mcpOn serves ms the way airlock serve does (behind server's handler at
// /mcp) and returns a connected client session.
func mcpOn(t *testing.T, srvCfg server.Config, opts mcpserver.Options) (*mcpserver.Server, *server.Server, func() (*mcp.ClientSession, error)) {
	t.Helper()
	var srv *server.Server
	if opts.CheckBox == nil {
		opts.CheckBox = func(ctx context.Context, o *airlock.BoxOptions) (func(), error) { return srv.CheckBox(ctx, o) }
	}
	// The server's exec slots, then the test's AcquireExec if it has one.
	also := opts.AcquireExec
	opts.AcquireExec = func(ctx context.Context) (func(), error) {
		release, err := srv.AcquireExec(ctx, server.MCPClient)
		if err != nil || also == nil {
			return release, err
		}
		more, err := also(ctx)
		if err != nil {
			release()
			return nil, err
		}
		return func() { more(); release() }, nil
	}
	opts.Box.Image = noImage
	ms := mcpserver.New(srvCfg.Runtime, opts)
	t.Cleanup(func() { ms.Close() })
	srvCfg.MCP = ms.HTTPHandler()
	srv = server.New(srvCfg)
	ts := httptest.NewServer(srv.Handler(false))
	t.Cleanup(ts.Close)
	connect := func() (*mcp.ClientSession, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL + "/mcp", MaxRetries: -1}, nil)
		if err == nil {
			t.Cleanup(func() { cs.Close() })
		}
		return cs, err
	}
	return ms, srv, connect
}

func openRT(t *testing.T) *airlock.Runtime {
	t.Helper()
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: t.TempDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return r
}

// TestHostileClientMCPObeysPolicy: the MCP endpoint of airlock serve makes
// its session box only as the server's policy allows (here --max-memory),
// and its tool calls take the server's exec slots (--max-execs).
func TestHostileClientMCPObeysPolicy(t *testing.T) {
	rt := openRT(t)
	_, srv, connect := mcpOn(t, server.Config{Runtime: rt, Policy: server.Policy{MaxMemoryMiB: 64}, MaxExecsPerClient: 1}, mcpserver.Options{})
	cs, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	r := call(t, cs, "execute_command", map[string]any{"command": "true"})
	if !r.IsError || !strings.Contains(textOf(r), "--max-memory") {
		t.Errorf("a session box past --max-memory 64: error %v %q, want the policy's refusal", r.IsError, textOf(r))
	}
	release, err := srv.AcquireExec(context.Background(), server.MCPClient)
	if err != nil {
		t.Fatal(err)
	}
	r = call(t, cs, "execute_python", map[string]any{"code": "1"})
	release()
	if !r.IsError || !strings.Contains(textOf(r), "--max-execs") {
		t.Errorf("a call with --max-execs 1 taken: error %v %q, want the exec limit", r.IsError, textOf(r))
	}
	if boxes, _ := rt.List(context.Background()); len(boxes) != 0 {
		t.Errorf("boxes made: %+v", boxes)
	}
}

// TestHostileClientMCPSessionsAndCallsLimited: sessions past MaxSessions
// are refused, and so are a session's tool calls past MaxCallsPerSession.
func TestHostileClientMCPSessionsAndCallsLimited(t *testing.T) {
	rt := openRT(t)
	block := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(block) }) }
	defer unblock()
	// An exec call asks AcquireExec once it holds its place among the
	// session's calls: the test knows then that the call counts.
	admitted := make(chan struct{}, 8)
	_, _, connect := mcpOn(t, server.Config{Runtime: rt}, mcpserver.Options{MaxSessions: 2, MaxCallsPerSession: 2,
		AcquireExec: func(context.Context) (func(), error) {
			admitted <- struct{}{}
			return func() {}, nil
		},
		CheckBox: func(ctx context.Context, _ *airlock.BoxOptions) (func(), error) {
			select {
			case <-block:
			case <-ctx.Done():
			}
			return nil, errors.New("refused by the test")
		}})
	cs, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := connect(); err != nil {
		t.Fatalf("second session: %v", err)
	}
	if _, err := connect(); err == nil {
		t.Error("a third session was opened with MaxSessions 2")
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "execute_command", Arguments: map[string]any{"command": "true"}})
		}()
	}
	// Both calls are admitted, and stay: one waits in CheckBox, the other
	// for the session's box.
	for i := 0; i < 2; i++ {
		select {
		case <-admitted:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of the 2 calls were admitted within 10 s", i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "/etc/hostname"}})
	cancel()
	if err != nil || !r.IsError || !strings.Contains(textOf(r), "tool calls at once") {
		t.Errorf("a third call at once with MaxCallsPerSession 2: %v %v", r, err)
	}
	unblock()
	wg.Wait()
}

// TestHostileClientMCPErrorsClipped: an error going back to the model (a
// box's console tail, a hostile guest's message) is cut with a note.
func TestHostileClientMCPErrorsClipped(t *testing.T) {
	rt := openRT(t)
	_, _, connect := mcpOn(t, server.Config{Runtime: rt}, mcpserver.Options{
		CheckBox: func(context.Context, *airlock.BoxOptions) (func(), error) {
			return nil, errors.New(strings.Repeat("\x00", 4<<20))
		}})
	cs, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	r := call(t, cs, "execute_command", map[string]any{"command": "true"})
	if got := textOf(r); !r.IsError || len(got) > mcpserver.MaxErrorBytes || !strings.Contains(got, "bytes not shown") {
		t.Errorf("an error of 4 MiB of NULs came back as %d bytes (want at most %d, with a note)", len(got), mcpserver.MaxErrorBytes)
	}
}

// TestHostileClientMCPTimeoutCapped: a model-chosen timeout is capped, and
// one past what a Duration holds does not wrap to a negative (none).
func TestHostileClientMCPTimeoutCapped(t *testing.T) {
	for _, secs := range []float64{1e10, 1e300, 7200, math.NaN()} {
		d := mcpserver.TimeoutOf(secs, time.Hour)
		if d <= 0 || d > time.Hour {
			t.Errorf("timeout %g s: %v, want within (0, 1h]", secs, d)
		}
	}
	if d := mcpserver.TimeoutOf(30, time.Hour); d != 30*time.Second {
		t.Errorf("timeout 30 s: %v", d)
	}
	if d := mcpserver.TimeoutOf(0, time.Hour); d != mcpserver.DefaultTimeout {
		t.Errorf("no timeout: %v, want the default", d)
	}
}
