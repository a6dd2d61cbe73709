package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// benchEnv is one runtime, server and box shared by the benchmarks.
type benchEnv struct {
	rt  *airlock.Runtime
	ts  *httptest.Server
	box *airlock.Box
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	if why := vmtest.Missing(); why != "" {
		b.Skipf("cannot boot boxes: %s", why)
	}
	rt, err := airlock.Open(airlock.Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rt.Close() })
	box, err := rt.Create(context.Background(), airlock.BoxOptions{Image: vmtest.DefaultImage, Network: airlock.NetworkDisabled})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { box.Remove(context.Background(), true) })
	ts := httptest.NewServer(New(Config{Runtime: rt, MaxExecsPerClient: 1000}).Handler(false))
	b.Cleanup(ts.Close)
	return &benchEnv{rt: rt, ts: ts, box: box}
}

func restExec(url, id string, cmd ...string) error {
	body, _ := json.Marshal(ExecRequest{Cmd: cmd})
	resp, err := http.Post(url+"/v1/boxes/"+id+"/exec", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r ExecResult
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return err
	}
	if resp.StatusCode != 200 || r.ExitCode != 0 {
		return fmt.Errorf("status %d exit %d", resp.StatusCode, r.ExitCode)
	}
	return nil
}

func wsExec(ctx context.Context, url, id string, cmd ...string) error {
	c, _, err := websocket.Dial(ctx, strings.Replace(url, "http", "ws", 1)+"/v1/boxes/"+id+"/exec/ws", nil)
	if err != nil {
		return err
	}
	defer c.CloseNow()
	req, _ := json.Marshal(ExecRequest{Cmd: cmd})
	if err := c.Write(ctx, websocket.MessageText, req); err != nil {
		return err
	}
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return err
		}
		if typ == websocket.MessageText && bytes.Contains(msg, []byte(`"type":"exit"`)) {
			c.Close(websocket.StatusNormalClosure, "")
			return nil
		}
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkExecRTT compares, on one box, the round trip of `true` through
// the library, the REST API and the exec WebSocket (a new connection per
// exec), and print(1) through codebox.CodeBox.Run, the REST code/run call
// and, when AIRLOCK_BENCH_PYTHON names a Python with the SDK installed,
// the Python SDK's CodeBox.run. The paths are interleaved in each
// iteration so that the load of a shared machine hits them alike; the
// metrics are medians in ms. Run:
//
//	AIRLOCK_BENCH_PYTHON=sdk/python/.venv/bin/python go test -run '^$' -bench ExecRTT -benchtime 50x ./internal/server
func BenchmarkExecRTT(b *testing.B) {
	env := newBenchEnv(b)
	ctx := context.Background()
	id := env.box.ID()
	cb := codebox.Attach(env.box, codebox.Options{})
	runBody, _ := json.Marshal(RunRequest{Code: "print(1)"})

	var py *pyBench
	if p := os.Getenv("AIRLOCK_BENCH_PYTHON"); p != "" {
		py = startPyBench(b, p, env.ts.URL, id)
	}
	lat := map[string][]time.Duration{}
	timeIt := func(name string, f func() error) {
		t0 := time.Now()
		if err := f(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		lat[name] = append(lat[name], time.Since(t0))
	}
	for b.Loop() {
		timeIt("library", func() error { _, err := env.box.Exec(ctx, "true", nil, airlock.ExecOptions{}); return err })
		timeIt("rest", func() error { return restExec(env.ts.URL, id, "true") })
		timeIt("websocket", func() error { return wsExec(ctx, env.ts.URL, id, "true") })
		timeIt("go-codebox-run", func() error { _, err := cb.Run(ctx, "print(1)"); return err })
		timeIt("rest-code-run", func() error {
			resp, err := http.Post(env.ts.URL+"/v1/boxes/"+id+"/code/run", "application/json", bytes.NewReader(runBody))
			if err == nil {
				resp.Body.Close()
			}
			return err
		})
		if py != nil {
			d, err := py.run()
			if err != nil {
				b.Fatalf("python: %v", err)
			}
			lat["py-sdk-run"] = append(lat["py-sdk-run"], d)
		}
	}
	for name, d := range lat {
		b.ReportMetric(float64(median(d).Microseconds())/1000, name+"-ms")
	}
	// Paired differences (same iteration) are steadier than differences
	// of medians on a loaded machine.
	paired := func(name, base string) {
		a, c := lat[name], lat[base]
		if len(a) == 0 || len(a) != len(c) {
			return
		}
		d := make([]time.Duration, len(a))
		for i := range a {
			d[i] = a[i] - c[i]
		}
		b.ReportMetric(float64(median(d).Microseconds())/1000, name+"-over-"+base+"-ms")
	}
	paired("rest", "library")
	paired("websocket", "library")
	paired("rest-code-run", "go-codebox-run")
	paired("py-sdk-run", "go-codebox-run")
}

// pyBench is a Python process that times one SDK box.run("print(1)") per
// line it reads (sdk/python/tests/bench_run.py).
type pyBench struct {
	in  io.WriteCloser
	out *bufio.Scanner
}

func startPyBench(b *testing.B, python, url, id string) *pyBench {
	_, file, _, _ := goruntime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "sdk", "python", "tests", "bench_run.py")
	cmd := exec.Command(python, script, id)
	cmd.Env = append(os.Environ(), "AIRLOCK_URL="+url)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { in.Close(); cmd.Wait() })
	p := &pyBench{in: in, out: bufio.NewScanner(out)}
	for i := 0; i < 3; i++ { // warm up (imports, connection)
		if _, err := p.run(); err != nil {
			b.Fatal(err)
		}
	}
	return p
}

func (p *pyBench) run() (time.Duration, error) {
	if _, err := p.in.Write([]byte("run\n")); err != nil {
		return 0, err
	}
	if !p.out.Scan() {
		return 0, fmt.Errorf("python bench helper ended: %v", p.out.Err())
	}
	var secs float64
	if _, err := fmt.Sscan(p.out.Text(), &secs); err != nil {
		return 0, fmt.Errorf("python bench helper said %q", p.out.Text())
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// BenchmarkConcurrentExecs runs 50 concurrent buffered execs spread over 5
// boxes through the REST API and reports throughput and p99.
func BenchmarkConcurrentExecs(b *testing.B) {
	env := newBenchEnv(b)
	ids := []string{env.box.ID()}
	for i := 1; i < 5; i++ {
		bx, err := env.rt.Create(context.Background(), airlock.BoxOptions{Image: vmtest.DefaultImage, Network: airlock.NetworkDisabled})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bx.Remove(context.Background(), true) })
		ids = append(ids, bx.ID())
	}
	http.DefaultTransport.(*http.Transport).MaxIdleConnsPerHost = 64
	for b.Loop() {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		errs := 0
		t0 := time.Now()
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := time.Now()
				err := restExec(env.ts.URL, ids[i%5], "true")
				mu.Lock()
				lat = append(lat, time.Since(s))
				if err != nil {
					errs++
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		wall := time.Since(t0)
		if errs > 0 {
			b.Fatalf("%d of 50 execs failed", errs)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(50/wall.Seconds(), "execs/s")
		b.ReportMetric(float64(lat[len(lat)*99/100-1].Microseconds())/1000, "p99-ms")
	}
}
