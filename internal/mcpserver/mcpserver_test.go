package mcpserver_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/mcpserver"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/vmtest"
)

func TestMain(m *testing.M) { os.Exit(vmtest.Main(m)) }

// dataImage has matplotlib; the image test uses it when hack/setup.sh built it.
const dataImage = "airlock/python-data:latest"

func buildAirlock(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(t.TempDir(), "airlock")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/airlock")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build airlock: %v\n%s", err, out)
	}
	return bin
}

func textOf(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestMCPStdio runs the built `airlock mcp` under the MCP Go SDK's own
// client over stdio (CommandTransport) and calls every tool; the session's
// box must be gone after the client closes.
func TestMCPStdio(t *testing.T) {
	vmtest.Require(t)
	img := vmtest.DefaultImage
	haveData := false
	if s, err := vmtest.OpenImages(); err == nil {
		if _, err := s.Resolve(dataImage); err == nil {
			img, haveData = dataImage, true
		}
	}
	bin := buildAirlock(t)
	home := t.TempDir()
	// The session's box gets a secret: the model's code sees a placeholder.
	// (The allowlist is empty but for the secret's host; nothing is sent.)
	const value = "sk-mcp-test-4f1d9c"
	cmd := exec.Command(bin, "mcp", "--image", img, "--network", "allowlist", "--secret", "TOKEN=api.example.com")
	cmd.Env = append(os.Environ(), "AIRLOCK_HOME="+home, "AIRLOCK_IMAGES="+vmtest.ImagesDir(), "TOKEN="+value)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			cs.Close()
		}
	}()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	if got := strings.Join(names, ","); !strings.Contains(got, "execute_python") || !strings.Contains(got, "execute_command") ||
		!strings.Contains(got, "write_file") || !strings.Contains(got, "read_file") || !strings.Contains(got, "install_packages") ||
		!strings.Contains(got, "checkpoint") || !strings.Contains(got, "rollback") {
		t.Fatalf("tools: %s", got)
	}
	call := func(name string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v (server stderr: %s)", name, err, stderr.String())
		}
		return r
	}

	r := call("execute_python", map[string]any{"code": "x = 6\nprint('hi')\nx * 7"})
	if r.IsError || !strings.Contains(textOf(r), "stdout:\nhi") || !strings.Contains(textOf(r), "value: 42") {
		t.Errorf("execute_python: %v %q", r.IsError, textOf(r))
	}
	r = call("execute_python", map[string]any{"code": "x + 1"})
	if !strings.Contains(textOf(r), "value: 7") {
		t.Errorf("state not kept: %q", textOf(r))
	}
	// Undo: a checkpoint, a change of x and of a file, a rollback.
	if r = call("checkpoint", map[string]any{"name": "before"}); r.IsError {
		t.Errorf("checkpoint: %q", textOf(r))
	}
	call("execute_python", map[string]any{"code": "x = 100\nopen('/tmp/undo', 'w').write('gone')"})
	if r = call("checkpoint", map[string]any{"name": "../bad"}); !r.IsError || !strings.Contains(textOf(r), "checkpoint name") {
		t.Errorf("checkpoint with a bad name: %v %q", r.IsError, textOf(r))
	}
	if r = call("rollback", map[string]any{"name": "before"}); r.IsError {
		t.Errorf("rollback: %q", textOf(r))
	}
	if r = call("execute_python", map[string]any{"code": "import os\n(x + 1, os.path.exists('/tmp/undo'))"}); !strings.Contains(textOf(r), "value: (7, False)") {
		t.Errorf("after rollback: %q", textOf(r))
	}
	if r = call("rollback", map[string]any{"name": "nope"}); !r.IsError || !strings.Contains(textOf(r), "checkpoint not found") {
		t.Errorf("rollback to a missing checkpoint: %v %q", r.IsError, textOf(r))
	}
	r = call("execute_python", map[string]any{"code": "1/0"})
	if !r.IsError || !strings.Contains(textOf(r), "ZeroDivisionError") {
		t.Errorf("exception: %v %q", r.IsError, textOf(r))
	}
	r = call("execute_command", map[string]any{"command": "echo out; echo err >&2; exit 3"})
	if !r.IsError || !strings.Contains(textOf(r), "exit code: 3") || !strings.Contains(textOf(r), "out") || !strings.Contains(textOf(r), "err") {
		t.Errorf("execute_command: %v %q", r.IsError, textOf(r))
	}
	r = call("execute_command", map[string]any{"command": "echo \"$TOKEN\""})
	if got := textOf(r); r.IsError || !strings.Contains(got, "airlock-secret-") || strings.Contains(got, value) {
		t.Errorf("the secret in the session's box: %v %q, want a placeholder", r.IsError, got)
	}
	r = call("write_file", map[string]any{"path": "/tmp/d/hello.txt", "content": "héllo\n"})
	if r.IsError {
		t.Errorf("write_file: %q", textOf(r))
	}
	r = call("read_file", map[string]any{"path": "/tmp/d/hello.txt"})
	if r.IsError || textOf(r) != "héllo\n" {
		t.Errorf("read_file: %v %q", r.IsError, textOf(r))
	}
	r = call("read_file", map[string]any{"path": "/nonexistent"})
	if !r.IsError {
		t.Errorf("read_file of a missing file: %q", textOf(r))
	}
	// Over MaxReadBytes: cut and said so; a directory is an error.
	call("execute_command", map[string]any{"command": "head -c 1200000 /dev/zero | tr '\\0' a > /tmp/d/big.txt"})
	r = call("read_file", map[string]any{"path": "/tmp/d/big.txt"})
	if got := textOf(r); r.IsError || len(got) != mcpserver.MaxReadBytes+len("\n[cut at 1048576 bytes]") || !strings.HasSuffix(got, "[cut at 1048576 bytes]") {
		t.Errorf("read_file of a big file: %v, %d bytes, ends %q", r.IsError, len(got), got[max(0, len(got)-40):])
	}
	if r = call("read_file", map[string]any{"path": "/tmp/d"}); !r.IsError {
		t.Errorf("read_file of a directory: %q", textOf(r))
	}
	if haveData {
		r = call("execute_python", map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])"})
		found := false
		for _, c := range r.Content {
			if im, ok := c.(*mcp.ImageContent); ok && im.MIMEType == "image/png" && bytes.HasPrefix(im.Data, []byte("\x89PNG")) {
				found = true
			}
		}
		if !found {
			t.Errorf("no PNG image content: %q", textOf(r))
		}
	} else {
		t.Logf("%s not built: image content not checked", dataImage)
	}

	// Ending the session removes the box.
	cs.Close()
	closed = true
	rt, err := airlock.Open(airlock.Options{Home: home, ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		boxes, _ := rt.List(ctx)
		if len(boxes) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("box left after the session ended: %+v", boxes)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type bearer struct{ tok string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPStreamableHTTP serves MCP under airlock serve's handler (/mcp,
// behind the bearer token) and drives it with the SDK's streamable HTTP
// client: a session gets a box, which goes when the session ends.
func TestMCPStreamableHTTP(t *testing.T) {
	vmtest.Require(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ms := mcpserver.New(rt, mcpserver.Options{Box: airlock.BoxOptions{Network: airlock.NetworkDisabled}, Version: "test"})
	defer ms.Close()
	ts := httptest.NewServer(server.New(server.Config{Runtime: rt, Token: "tok", MCP: ms.HTTPHandler()}).Handler(true))
	defer ts.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)

	if _, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL + "/mcp", MaxRetries: -1}, nil); err == nil {
		t.Fatal("connected without the bearer token")
	}
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{"tok"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_command", Arguments: map[string]any{"command": "echo over-http"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.IsError || !strings.Contains(textOf(r), "over-http") {
		t.Errorf("execute_command: %v %q", r.IsError, textOf(r))
	}
	if boxes, _ := rt.List(ctx); len(boxes) != 1 {
		t.Fatalf("boxes during the session: %d, want 1", len(boxes))
	}
	cs.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		boxes, _ := rt.List(ctx)
		if len(boxes) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("box left after the HTTP session ended: %+v", boxes)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
