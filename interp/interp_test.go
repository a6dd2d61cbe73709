package interp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/interp"
	"github.com/airlock-run/airlock/interp/interptest"
)

// These tests need no VM: the model is the fake server and the Python
// interpreter a scripted Executor. box_test.go runs the real thing.

type fakeExec struct {
	codes   []string
	results []*codebox.Result
}

func (f *fakeExec) Run(ctx context.Context, code string) (*codebox.Result, error) {
	f.codes = append(f.codes, code)
	r := f.results[0]
	f.results = f.results[1:]
	return r, nil
}

func newLLM(t *testing.T, f *interptest.FakeOpenAI) *interp.OpenAI {
	t.Helper()
	llm, err := interp.NewOpenAI(interp.OpenAIConfig{APIKey: "test-key", BaseURL: f.BaseURL, Model: "fake-model", MaxRetries: 0})
	if err != nil {
		t.Fatal(err)
	}
	return llm
}

func toolCall(id, code string) interptest.ToolCall {
	args, _ := json.Marshal(map[string]string{"code": code})
	return interptest.ToolCall{ID: id, Name: interp.ToolName, Arguments: string(args)}
}

func TestToolLoopRequests(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nfake")
	ex := &fakeExec{results: []*codebox.Result{
		{Stdout: "partial\n", Error: &codebox.Error{Name: "NameError", Value: "name 'y' is not defined", Traceback: "Traceback (most recent call last):\nNameError: name 'y' is not defined\n"}},
		{Stdout: "ok\n", Value: "42", Images: []codebox.Image{{MIMEType: "image/png", Data: png}}},
	}}
	var toolMsgs []map[string]any
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		if req.Model != "fake-model" || req.Authorization != "Bearer test-key" {
			t.Errorf("request %d: model %q auth %q", n, req.Model, req.Authorization)
		}
		if len(req.Tools) != 1 || req.Tools[0].Type != "function" || req.Tools[0].Function.Name != "execute_python" ||
			req.Tools[0].Function.Parameters["required"] == nil {
			t.Errorf("request %d: tools not declared: %+v", n, req.Tools)
		}
		last := req.Messages[len(req.Messages)-1]
		switch n {
		case 0:
			if len(req.Messages) != 2 || req.Messages[0].Role != "system" || last.Role != "user" || last.Text() != "compute" {
				t.Errorf("first request: %+v", req.Messages)
			}
			return interptest.Reply{ToolCalls: []interptest.ToolCall{toolCall("call_a", "print('partial'); y")}}
		case 1, 2:
			want := map[int]string{1: "call_a", 2: "call_b"}[n]
			prev := req.Messages[len(req.Messages)-2]
			if last.Role != "tool" || last.ToolCallID != want || prev.Role != "assistant" || len(prev.ToolCalls) != 1 || prev.ToolCalls[0].ID != want {
				t.Errorf("request %d: tool result does not answer %s: %+v", n, want, req.Messages)
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(last.Text()), &m); err != nil {
				t.Errorf("tool result not JSON: %q", last.Text())
			}
			toolMsgs = append(toolMsgs, m)
			if n == 1 {
				return interptest.Reply{Content: "retrying", ToolCalls: []interptest.ToolCall{toolCall("call_b", "y = 42\nprint('ok')\ny")}}
			}
			return interptest.Reply{Content: "The answer is 42."}
		}
		t.Errorf("unexpected request %d", n)
		return interptest.Reply{Status: 500}
	})
	var log bytes.Buffer
	out := t.TempDir()
	it := &interp.Interpreter{LLM: newLLM(t, f), Exec: ex, Log: &log, OutDir: out}
	ans, err := it.Ask(context.Background(), "compute")
	if err != nil {
		t.Fatal(err)
	}
	if ans.Text != "The answer is 42." || ans.ToolCalls != 2 || len(f.Requests()) != 3 {
		t.Fatalf("answer %+v after %d requests", ans, len(f.Requests()))
	}
	if len(toolMsgs) != 2 || toolMsgs[0]["stdout"] != "partial\n" || !strings.Contains(toolMsgs[0]["error"].(string), "NameError") {
		t.Fatalf("first tool result %+v", toolMsgs)
	}
	if toolMsgs[1]["result"] != "42" || !strings.Contains(toolMsgs[1]["images"].([]any)[0].(string), "saved to") {
		t.Fatalf("second tool result %+v", toolMsgs[1])
	}
	if len(ans.Images) != 1 {
		t.Fatalf("images %v", ans.Images)
	}
	if b, err := os.ReadFile(ans.Images[0]); err != nil || !bytes.Equal(b, png) {
		t.Fatalf("saved image: %v", err)
	}
	for _, want := range []string{"print('partial'); y", "NameError", "=> 42", "--- output"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
}

func TestMaxSteps(t *testing.T) {
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		return interptest.Reply{ToolCalls: []interptest.ToolCall{toolCall("c", "1")}}
	})
	ex := &fakeExec{results: []*codebox.Result{{}, {}}}
	it := &interp.Interpreter{LLM: newLLM(t, f), Exec: ex, MaxSteps: 2}
	ans, err := it.Ask(context.Background(), "loop")
	if !errors.Is(err, interp.ErrMaxSteps) || ans.ToolCalls != 2 || len(f.Requests()) != 3 {
		t.Fatalf("got %v, %d calls, %d requests", err, ans.ToolCalls, len(f.Requests()))
	}
}

func TestBadArguments(t *testing.T) {
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		if n == 0 {
			return interptest.Reply{ToolCalls: []interptest.ToolCall{{ID: "x", Name: "execute_python", Arguments: `{"cod": 1}`}, {ID: "y", Name: "shell", Arguments: `{}`}}}
		}
		for _, m := range req.Messages[len(req.Messages)-2:] {
			if m.Role != "tool" || !strings.Contains(m.Text(), "execute_python") {
				t.Errorf("tool message %+v", m)
			}
		}
		return interptest.Reply{Content: "done"}
	})
	it := &interp.Interpreter{LLM: newLLM(t, f), Exec: &fakeExec{}}
	if ans, err := it.Ask(context.Background(), "x"); err != nil || ans.Text != "done" || ans.ToolCalls != 0 {
		t.Fatalf("got %+v, %v", ans, err)
	}
}

func TestModelNotServed(t *testing.T) {
	for _, status := range []int{http.StatusNotFound, http.StatusBadRequest} {
		f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
			return interptest.Reply{Status: status, ErrorMessage: "Model does not exist: fake-model"}
		})
		_, err := newLLM(t, f).Chat(context.Background(), []interp.Message{{Role: "user", Content: "hi"}}, nil)
		var me *interp.ModelError
		if !errors.As(err, &me) || me.StatusCode != status || !strings.Contains(err.Error(), "AIRLOCK_MODEL") || !strings.Contains(err.Error(), "fake-model") {
			t.Fatalf("HTTP %d: got %v", status, err)
		}
	}
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		return interptest.Reply{Status: http.StatusUnauthorized, ErrorMessage: "Incorrect API key provided"}
	})
	_, err := newLLM(t, f).Chat(context.Background(), []interp.Message{{Role: "user", Content: "hi"}}, nil)
	var me *interp.ModelError
	if err == nil || errors.As(err, &me) || !strings.Contains(err.Error(), "Incorrect API key") {
		t.Fatalf("401: got %v", err)
	}
}

func TestConfig(t *testing.T) {
	if _, err := interp.NewOpenAI(interp.OpenAIConfig{Model: "m"}); !errors.Is(err, interp.ErrNoAPIKey) || !strings.Contains(err.Error(), "OPENAI_API_KEY") {
		t.Fatalf("got %v", err)
	}
	if _, err := interp.NewOpenAI(interp.OpenAIConfig{APIKey: "k"}); !errors.Is(err, interp.ErrNoModel) {
		t.Fatalf("got %v", err)
	}
	t.Setenv("AIRLOCK_MODEL", "env-model")
	t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
	if c := interp.ConfigFromEnv(""); c.Model != "env-model" || c.BaseURL != "http://127.0.0.1:1/v1" {
		t.Fatalf("got %+v", c)
	}
	if c := interp.ConfigFromEnv("flag-model"); c.Model != "flag-model" {
		t.Fatalf("got %+v", c)
	}
}

func TestExtractCode(t *testing.T) {
	for in, want := range map[string]string{
		"Here:\n```python\nprint(1)\n```\nbye":       "print(1)",
		"```\nx = 2\nprint(x)\n```":                  "x = 2\nprint(x)",
		"  print('bare')  \n":                        "print('bare')",
		"```python\na\n```\n```python\nb\n```":       "a\n\nb",
		"```py\nprint(3)\n```":                       "print(3)",
		"text ```python\nprint(4)\n``` more ```x```": "print(4)",
		// The way models write it: prose around a py fence.
		"Sure! Here is the code:\n\n```py\nimport math\nprint(math.pi)\n```\n\nThis prints pi.": "import math\nprint(math.pi)",
		"```Python\nx = 1\n```":                              "x = 1",
		"```python3 title\ny\n```":                           "y",
		"Run:\n```\nprint(5)\n```\nthen\n```\nprint(6)\n```": "print(5)\n\nprint(6)",
		// Python preferred over shell and unlabelled blocks; other
		// languages are not run.
		"```bash\npip install x\n```\n```python\nprint(7)\n```\n```\nout\n```": "print(7)",
		"```json\n{}\n```\n```py\nprint(8)\n```":                               "print(8)",
		"```sh\necho hi\n```":                                                  "import subprocess, sys\nsys.exit(subprocess.call(\"echo hi\", shell=True))",
	} {
		if got := interp.ExtractCode(in); got != want {
			t.Errorf("ExtractCode(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{`{"code": "print(1)"}`: "print(1)", "print(2)": "print(2)"} {
		if got, err := interp.ParseArguments(in); err != nil || got != want {
			t.Errorf("ParseArguments(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := interp.ParseArguments(`{"x": 1}`); err == nil {
		t.Error("missing code accepted")
	}
}

type fakeRunner struct{ code string }

func (r *fakeRunner) Run(ctx context.Context, code string) (string, error) {
	r.code = code
	return "out\n", nil
}

func TestOneShotFake(t *testing.T) {
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		if len(req.Tools) != 0 || len(req.Messages) != 1 || req.Messages[0].Text() != "Write Python code (no explanation) for: add" {
			t.Errorf("one-shot request %+v", req)
		}
		return interptest.Reply{Content: "```python\nprint(1+1)\n```"}
	})
	r := &fakeRunner{}
	res, err := interp.OneShot(context.Background(), newLLM(t, f), r, "add")
	if err != nil || r.code != "print(1+1)" || res.Output != "out\n" || res.Code != "print(1+1)" {
		t.Fatalf("got %+v %v (ran %q)", res, err, r.code)
	}
}
