package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/codebox"
)

// BenchmarkNodeSDKRun compares, on one running box, print(1) through the Go
// codebox.CodeBox.Run and through the TypeScript SDK's `await cb.run(...)`
// (sdk/typescript, built with `npm run build`) over the server's unix socket
// and over TCP, with a Go HTTP client's POST code/run on the same socket to
// tell the server's share from the SDK's, and GET /v1/health through the
// SDK and through Go (the SDK's own cost per request, without the ~300 ms of
// Python under TCG and its noise). The paths are interleaved in each iteration so that the
// load of a shared machine hits them alike; the metrics are medians in ms,
// and the SDK's overhead over the library. It skips when node or the SDK
// build is missing. Run:
//
//	go test -run '^$' -bench NodeSDKRun -benchtime 50x ./internal/server
func BenchmarkNodeSDKRun(b *testing.B) {
	_, file, _, _ := goruntime.Caller(0)
	pkg := filepath.Join(filepath.Dir(file), "..", "..", "sdk", "typescript")
	if _, err := os.Stat(filepath.Join(pkg, "dist", "index.js")); err != nil {
		b.Skip("sdk/typescript is not built (cd sdk/typescript && npm ci && npm run build)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		b.Skip("node not installed")
	}
	env := newBenchEnv(b)
	ctx := context.Background()
	id := env.box.ID()
	cb := codebox.Attach(env.box, codebox.Options{})

	sock := filepath.Join(b.TempDir(), "a.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: env.ts.Config.Handler}
	go hs.Serve(l)
	b.Cleanup(func() { hs.Close() })

	uc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	script := filepath.Join(pkg, "test", "bench_run.mjs")
	unix := startNodeBench(b, node, script, id, "AIRLOCK_SOCKET="+sock)
	tcp := startNodeBench(b, node, script, id, "AIRLOCK_URL="+env.ts.URL)

	paths := []struct {
		name string
		run  func() (time.Duration, error)
	}{
		{"go-codebox-run", func() (time.Duration, error) {
			t0 := time.Now()
			_, err := cb.Run(ctx, "print(1)")
			return time.Since(t0), err
		}},
		{"go-rest-run-unix", func() (time.Duration, error) {
			t0 := time.Now()
			resp, err := uc.Post("http://airlock/v1/boxes/"+id+"/code/run", "application/json", strings.NewReader(`{"code":"print(1)"}`))
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			return time.Since(t0), err
		}},
		{"ts-sdk-run-unix", unix.run},
		{"ts-sdk-run-tcp", tcp.run},
		{"go-health-unix", func() (time.Duration, error) {
			t0 := time.Now()
			resp, err := uc.Get("http://airlock/v1/health")
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			return time.Since(t0), err
		}},
		{"ts-sdk-health-unix", unix.health},
	}
	lat := map[string][]time.Duration{}
	i := 0
	for b.Loop() {
		for j := range paths { // rotate the order each iteration
			p := paths[(i+j)%len(paths)]
			d, err := p.run()
			if err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			lat[p.name] = append(lat[p.name], d)
		}
		i++
	}
	for name, d := range lat {
		b.ReportMetric(float64(median(d).Microseconds())/1000, name+"-ms")
	}
	// Overheads: medians of the per-iteration differences. ts-vs-go: the
	// SDK over the library (the target); ts-vs-rest: the SDK's own share,
	// over a Go HTTP client on the same socket.
	delta := func(metric, a, base string) {
		diff := make([]time.Duration, len(lat[a]))
		for k := range diff {
			diff[k] = lat[a][k] - lat[base][k]
		}
		b.ReportMetric(float64(median(diff).Microseconds())/1000, metric)
	}
	delta("ts-unix-vs-go-ms", "ts-sdk-run-unix", "go-codebox-run")
	delta("ts-tcp-vs-go-ms", "ts-sdk-run-tcp", "go-codebox-run")
	delta("ts-unix-vs-rest-ms", "ts-sdk-run-unix", "go-rest-run-unix")
	delta("ts-health-vs-go-ms", "ts-sdk-health-unix", "go-health-unix")
}

// nodeBench is a node process that times one SDK `await box.run("print(1)")`
// per line it reads (sdk/typescript/test/bench_run.mjs).
type nodeBench struct {
	in  io.WriteCloser
	out *bufio.Scanner
}

func startNodeBench(b *testing.B, node, script, id, endpoint string) *nodeBench {
	cmd := exec.Command(node, script, id)
	cmd.Env = append(os.Environ(), "AIRLOCK_URL=", "AIRLOCK_SOCKET=", endpoint)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { in.Close(); cmd.Wait() })
	p := &nodeBench{in: in, out: bufio.NewScanner(out)}
	for i := 0; i < 5; i++ { // warm up (module load, JIT, connection)
		if _, err := p.run(); err != nil {
			b.Fatal(err)
		}
	}
	return p
}

func (p *nodeBench) run() (time.Duration, error) { return p.do("run") }

func (p *nodeBench) health() (time.Duration, error) { return p.do("health") }

func (p *nodeBench) do(what string) (time.Duration, error) {
	if _, err := p.in.Write([]byte(what + "\n")); err != nil {
		return 0, err
	}
	if !p.out.Scan() {
		return 0, fmt.Errorf("node bench helper ended: %v", p.out.Err())
	}
	var secs float64
	if _, err := fmt.Sscan(p.out.Text(), &secs); err != nil {
		return 0, fmt.Errorf("node bench helper said %q", p.out.Text())
	}
	return time.Duration(secs * float64(time.Second)), nil
}
