package interp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/vmtest"
	"github.com/airlock-run/airlock/interp"
	"github.com/airlock-run/airlock/interp/interptest"
)

// The tests and benchmarks of this file share one python:slim box.

var (
	agentPath string
	testHome  string

	boxOnce sync.Once
	box     *codebox.CodeBox
	boxErr  error

	// Figures the benchmarks leave for TestMain's summary (per call).
	benchMu                           sync.Mutex
	benchCtx, benchRun, benchToolCall time.Duration
	benchToolExec, benchToolModel     time.Duration
)

func TestMain(m *testing.M) {
	isolated, err := vmtest.Isolate()
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "interp-test-")
	if err != nil {
		panic(err)
	}
	agentPath, err = vmtest.BuildAgent(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	helper, err := vmtest.BuildNetHelper(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("AIRLOCK_NET_HELPER", helper)
	testHome = dir
	code := m.Run()
	if box != nil {
		box.Close()
	}
	printBenchSummary()
	os.RemoveAll(dir)
	if err := isolated(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	os.Exit(code)
}

func sharedBox(t testing.TB) *codebox.CodeBox {
	t.Helper()
	vmtest.Require(t)
	boxOnce.Do(func() {
		var rt *airlock.Runtime
		rt, boxErr = airlock.Open(airlock.Options{Home: testHome, ImagesDir: vmtest.ImagesDir(), AgentPath: agentPath, Warn: func(string) {}})
		if boxErr != nil {
			return
		}
		box, boxErr = codebox.New(context.Background(), rt, codebox.Options{Timeout: time.Minute})
	})
	if boxErr != nil {
		t.Fatal(boxErr)
	}
	return box
}

func TestToolModeInBox(t *testing.T) {
	cb := sharedBox(t)
	ctx := context.Background()
	info, err := cb.Box().GuestInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	host, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	if info.Kernel == strings.TrimSpace(string(host)) {
		t.Fatalf("guest and host kernels are both %s: the test could not tell them apart", info.Kernel)
	}
	const code = "import platform; print(platform.release())"
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		if len(req.Tools) != 1 || req.Tools[0].Function.Name != "execute_python" {
			t.Errorf("request %d: execute_python not declared: %+v", n, req.Tools)
		}
		if n == 0 {
			return interptest.Reply{ToolCalls: []interptest.ToolCall{toolCall("call_release", code)}}
		}
		last := req.Messages[len(req.Messages)-1]
		if last.Role != "tool" || last.ToolCallID != "call_release" {
			t.Errorf("tool result does not carry call_release: %+v", last)
		}
		var res struct{ Stdout string }
		json.Unmarshal([]byte(last.Text()), &res)
		return interptest.Reply{Content: "The sandbox runs Linux " + strings.TrimSpace(res.Stdout) + "."}
	})
	x, err := cb.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	it := &interp.Interpreter{LLM: newLLM(t, f), Exec: x}
	ans, err := it.Ask(ctx, "Which kernel does your sandbox run?")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ans.Text, info.Kernel) || ans.ToolCalls != 1 {
		t.Fatalf("answer %q lacks the guest kernel %s", ans.Text, info.Kernel)
	}
	t.Logf("answer: %s (host kernel %s)", ans.Text, strings.TrimSpace(string(host)))
}

func TestOneShotInBox(t *testing.T) {
	cb := sharedBox(t)
	ctx := context.Background()
	for _, tc := range []struct{ name, reply, want string }{
		{"fenced", "Here is the code:\n```python\nprimes = [p for p in range(2, 30) if all(p % d for d in range(2, p))]\nprint(primes[:10])\n```\n", "[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]\n"},
		{"unfenced", "print(sum(range(10)))", "45\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := interptest.NewFakeOpenAI(t, func(int, interptest.Request) interptest.Reply { return interptest.Reply{Content: tc.reply} })
			res, err := interp.OneShot(ctx, newLLM(t, f), cb, "Compute the first 10 prime numbers and print them as a list.")
			if err != nil || res.Output != tc.want {
				t.Fatalf("got %+v, %v", res, err)
			}
		})
	}
	t.Run("raises", func(t *testing.T) {
		f := interptest.NewFakeOpenAI(t, func(int, interptest.Request) interptest.Reply {
			return interptest.Reply{Content: "```python\nprint('start')\n1/0\n```"}
		})
		res, err := interp.OneShot(ctx, newLLM(t, f), cb, "divide")
		var ee *codebox.ExecError
		if !errors.As(err, &ee) || res.Output != "start\n" || !strings.Contains(ee.Stderr, "ZeroDivisionError") {
			t.Fatalf("got %+v, %v", res, err)
		}
	})
}

func benchContext(b *testing.B, cb *codebox.CodeBox) *codebox.Context {
	x, err := cb.NewContext(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { x.Close() })
	if _, err := x.Run(context.Background(), "x = 1"); err != nil {
		b.Fatal(err)
	}
	return x
}

// BenchmarkContextRun is a stateful round trip: "x+1" in a live
// interpreter.
func BenchmarkContextRun(b *testing.B) {
	x := benchContext(b, sharedBox(b))
	ctx := context.Background()
	for b.Loop() {
		res, err := x.Run(ctx, "x+1")
		if err != nil || res.Value != "2" {
			b.Fatalf("%+v %v", res, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/run")
	setBench(&benchCtx, b.Elapsed()/time.Duration(b.N))
}

// BenchmarkRun is a fresh interpreter per call: python3 -c "print(1)".
func BenchmarkRun(b *testing.B) {
	cb := sharedBox(b)
	ctx := context.Background()
	for b.Loop() {
		if out, err := cb.Run(ctx, "print(1)"); err != nil || out != "1\n" {
			b.Fatalf("%q %v", out, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/run")
	setBench(&benchRun, b.Elapsed()/time.Duration(b.N))
}

// BenchmarkToolCall is one turn of the tool loop with a model that
// answers at once (the fake server): model asks for "x+1", the cell runs,
// the model answers. overhead-ms is everything but the model's reply time
// (client, HTTP, JSON, the cell's round trip); exec-ms is the cell's part.
func BenchmarkToolCall(b *testing.B) {
	x := benchContext(b, sharedBox(b))
	f := interptest.NewFakeOpenAI(b, func(n int, req interptest.Request) interptest.Reply {
		if req.Messages[len(req.Messages)-1].Role == "user" {
			return interptest.Reply{ToolCalls: []interptest.ToolCall{toolCall(fmt.Sprintf("call_%d", n), "x+1")}}
		}
		return interptest.Reply{Content: "2"}
	})
	llm, err := interp.NewOpenAI(interp.OpenAIConfig{APIKey: "k", BaseURL: f.BaseURL, Model: "fake", MaxRetries: 0})
	if err != nil {
		b.Fatal(err)
	}
	it := &interp.Interpreter{LLM: llm, Exec: x}
	ctx := context.Background()
	var exec time.Duration
	for b.Loop() {
		ans, err := it.Ask(ctx, "x+1?")
		if err != nil || ans.Text != "2" || ans.ToolCalls != 1 {
			b.Fatalf("%+v %v", ans, err)
		}
		exec += ans.ExecTime
	}
	n := time.Duration(b.N)
	per := b.Elapsed() / n
	model := f.HandlerTime() / n
	b.ReportMetric(float64((per-model).Microseconds())/1000, "overhead-ms")
	b.ReportMetric(float64((exec/n).Microseconds())/1000, "exec-ms")
	setBench(&benchToolCall, per-model)
	setBench(&benchToolExec, exec/n)
	setBench(&benchToolModel, model)
}

func setBench(p *time.Duration, d time.Duration) {
	benchMu.Lock()
	*p = d
	benchMu.Unlock()
}

func printBenchSummary() {
	benchMu.Lock()
	defer benchMu.Unlock()
	if benchCtx > 0 && benchRun > 0 {
		fmt.Printf("summary: Context.Run(\"x+1\") %.2f ms, Run(\"print(1)\") %.1f ms: stateful round trip %.0fx faster\n",
			ms(benchCtx), ms(benchRun), float64(benchRun)/float64(benchCtx))
	}
	if benchToolCall > 0 {
		fmt.Printf("summary: tool loop overhead per tool call beyond the model's reply time (%.2f ms here) %.2f ms, of which running the cell %.2f ms\n",
			ms(benchToolModel), ms(benchToolCall), ms(benchToolExec))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
