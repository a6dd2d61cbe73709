package cli_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/vmtest"
	"github.com/airlock-run/airlock/interp/interptest"
)

// The model in these tests is interptest's fake OpenAI-compatible server on
// loopback; the binary reaches it through OPENAI_BASE_URL.

func askEnv(t *testing.T, f *interptest.FakeOpenAI) {
	t.Setenv("OPENAI_API_KEY", "test-key")
	t.Setenv("OPENAI_BASE_URL", f.BaseURL)
	t.Setenv("AIRLOCK_MODEL", "")
}

func callPython(id, code string) interptest.ToolCall {
	args, _ := json.Marshal(map[string]string{"code": code})
	return interptest.ToolCall{ID: id, Name: "execute_python", Arguments: string(args)}
}

// TestAskErrors covers the seed's troubleshooting table without booting a
// box.
func TestAskErrors(t *testing.T) {
	c := cli{t, t.TempDir()}
	t.Run("no key", func(t *testing.T) {
		t.Setenv("OPENAI_API_KEY", "")
		_, errs, code := c.run("ask", "--model", "m", "hi")
		if code == 0 || !strings.Contains(errs, "OPENAI_API_KEY is not set") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
	})
	t.Run("no model", func(t *testing.T) {
		t.Setenv("OPENAI_API_KEY", "k")
		t.Setenv("AIRLOCK_MODEL", "")
		_, errs, code := c.run("ask", "hi")
		if code == 0 || !strings.Contains(errs, "AIRLOCK_MODEL") || !strings.Contains(errs, "--model") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
	})
	t.Run("model not served", func(t *testing.T) {
		f := interptest.NewFakeOpenAI(t, func(int, interptest.Request) interptest.Reply {
			return interptest.Reply{Status: http.StatusNotFound, ErrorMessage: "The model `gpt-nope` does not exist"}
		})
		askEnv(t, f)
		_, errs, code := c.run("ask", "--model", "gpt-nope", "--image", "nosuch.invalid/img:1", "hi")
		if code != 1 || !strings.Contains(errs, `model "gpt-nope" is not served by `+f.BaseURL) || !strings.Contains(errs, "set --model or AIRLOCK_MODEL") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
	})
	t.Run("endpoint unreachable", func(t *testing.T) {
		t.Setenv("OPENAI_API_KEY", "k")
		t.Setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
		_, errs, code := c.run("ask", "--model", "m", "--image", "localhost:1/none:1", "hi")
		if code != 1 || !strings.Contains(errs, "cannot reach OPENAI_BASE_URL=http://127.0.0.1:1/v1: is the server running?") || strings.Contains(errs, "dial tcp") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
	})
	t.Run("max steps 0", func(t *testing.T) {
		_, errs, code := c.run("ask", "--max-steps", "0", "hi")
		if code != 125 || !strings.Contains(errs, "--max-steps 0: want 1 or more") {
			t.Fatalf("code %d stderr %q", code, errs)
		}
	})
	t.Run("box cannot start", func(t *testing.T) {
		f := interptest.NewFakeOpenAI(t, func(int, interptest.Request) interptest.Reply {
			return interptest.Reply{ToolCalls: []interptest.ToolCall{callPython("c1", "print(1)")}}
		})
		askEnv(t, f)
		for _, mode := range [][]string{nil, {"--one-shot"}} {
			args := append([]string{"ask", "--model", "fake", "--image", "nosuch.invalid/img:1"}, mode...)
			_, errs, code := c.run(append(args, "hi")...)
			if code != 125 || !strings.Contains(errs, "sandbox failed to start") || !strings.Contains(errs, "image not found") {
				t.Fatalf("%v: code %d stderr %q", mode, code, errs)
			}
		}
	})
}

func TestAskToolMode(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	var release string
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		if len(req.Tools) != 1 || req.Tools[0].Function.Name != "execute_python" || req.Model != "fake-model" {
			t.Errorf("request %d: model %q tools %+v", n, req.Model, req.Tools)
		}
		last := req.Messages[len(req.Messages)-1]
		var res struct{ Stdout, Error string }
		if n > 0 {
			if want := []string{"", "c_div", "c_rel"}[n]; last.Role != "tool" || last.ToolCallID != want {
				t.Errorf("request %d: last message %+v does not answer %s", n, last, want)
			}
			json.Unmarshal([]byte(last.Text()), &res)
		}
		switch n {
		case 0:
			return interptest.Reply{ToolCalls: []interptest.ToolCall{callPython("c_div", "print('dividing')\n1/0")}}
		case 1:
			if !strings.Contains(res.Error, "ZeroDivisionError") || res.Stdout != "dividing\n" {
				t.Errorf("the traceback was not fed back: %+v", res)
			}
			return interptest.Reply{ToolCalls: []interptest.ToolCall{callPython("c_rel", "import platform; print(platform.release())")}}
		default:
			release = strings.TrimSpace(res.Stdout)
			return interptest.Reply{Content: "The sandbox's kernel is " + release + "."}
		}
	})
	askEnv(t, f)
	t.Setenv("AIRLOCK_MODEL", "fake-model")
	out, errs, code := c.run("ask", "--show-code", "Which", "kernel", "runs", "your", "code?")
	if code != 0 {
		t.Fatalf("code %d stderr %s", code, errs)
	}
	host, _ := exec.Command("uname", "-r").Output()
	if release == "" || release == strings.TrimSpace(string(host)) || out != "The sandbox's kernel is "+release+".\n" {
		t.Fatalf("stdout %q (guest %q, host %q)", out, release, host)
	}
	for _, progress := range []string{"booting box", "waiting for the model", "running code", "\033[K"} {
		if strings.Contains(errs, progress) {
			t.Errorf("stderr is not a terminal but shows progress %q:\n%s", progress, errs)
		}
	}
	for _, want := range []string{"print('dividing')", "ZeroDivisionError", "platform.release()", release} {
		if !strings.Contains(errs, want) {
			t.Errorf("--show-code output lacks %q:\n%s", want, errs)
		}
	}
	if tcgExpected(t, c) && !strings.Contains(errs, "airlock: warning: KVM is not usable here") {
		t.Errorf("code ran under TCG, but no warning:\n%s", errs)
	}
	if len(qemuOf(c.home)) != 0 {
		t.Error("the box was left running")
	}
}

// TestAskWarnsOnlyWhenCodeRuns: ask boots its box while the model thinks;
// when the model fails before any code ran, the box's warnings (TCG) are
// not printed: the command ran nothing in a box (#39).
func TestAskWarnsOnlyWhenCodeRuns(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	if !tcgExpected(t, c) {
		t.Skip("no TCG warning expected here (KVM, or AIRLOCK_ACCEL set)")
	}
	booted := make(chan bool, 1)
	running := regexp.MustCompile(`(?i)"state": *"running"`)
	f := interptest.NewFakeOpenAI(t, func(int, interptest.Request) interptest.Reply {
		// Answer once the box runs (its boot's warning is then due), or
		// after a minute: the model is not served.
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			ls := exec.Command(airlockBin, "ls", "--format", "json")
			ls.Env = append(os.Environ(), "AIRLOCK_HOME="+c.home, "AIRLOCK_IMAGES="+vmtest.ImagesDir())
			if out, _ := ls.Output(); running.Match(out) {
				booted <- true
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		return interptest.Reply{Status: http.StatusNotFound, ErrorMessage: "The model `gone` does not exist"}
	})
	askEnv(t, f)
	_, errs, code := c.run("ask", "--model", "gone", "hi")
	if code != 1 || !strings.Contains(errs, `model "gone" is not served`) {
		t.Fatalf("code %d stderr %q", code, errs)
	}
	select {
	case <-booted:
	default:
		t.Fatalf("the box never ran while the model was asked; stderr %q", errs)
	}
	if strings.Contains(errs, "warning") {
		t.Errorf("ask ran no code but warned:\n%s", errs)
	}
}

func TestAskOneShot(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	for _, tc := range []struct {
		name, reply, stdout, stderr string
		code                        int
	}{
		{"fenced", "Sure:\n```python\nprint([p for p in range(2, 30) if all(p % d for d in range(2, p))])\n```\n", "[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]\n", "", 0},
		{"unfenced", "print(6 * 7)", "42\n", "", 0},
		{"raises", "```python\nprint('start')\n{}['k']\n```", "start\n", "KeyError: 'k'", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
				if len(req.Tools) != 0 || req.Messages[0].Text() != "Write Python code (no explanation) for: primes" {
					t.Errorf("one-shot request %+v", req)
				}
				return interptest.Reply{Content: tc.reply}
			})
			askEnv(t, f)
			out, errs, code := c.run("ask", "--one-shot", "--model", "m", "primes")
			if code != tc.code || out != tc.stdout || !strings.Contains(errs, tc.stderr) {
				t.Fatalf("code %d stdout %q stderr %q", code, out, errs)
			}
			if tc.code != 0 && !strings.Contains(errs, "Traceback (most recent call last)") {
				t.Fatalf("no traceback in %q", errs)
			}
		})
	}
}

// TestAskFiles: --file puts a CSV in the box and names it to the model;
// what the code writes under /out comes back with --out. The reply is
// written as models write it: prose around a ```py fence.
func TestAskFiles(t *testing.T) {
	vmtest.Require(t)
	c := cli{t, t.TempDir()}
	dir := t.TempDir()
	csv := filepath.Join(dir, "sales.csv")
	os.WriteFile(csv, []byte("month,amount\njan,10\nfeb,32\n"), 0o644)
	var prompt string
	f := interptest.NewFakeOpenAI(t, func(n int, req interptest.Request) interptest.Reply {
		prompt = req.Messages[0].Text()
		return interptest.Reply{Content: "Sure! Here is the code:\n\n```py\nimport csv\nrows = list(csv.DictReader(open('/data/sales.csv')))\ntotal = sum(int(r['amount']) for r in rows)\nopen('/out/total.txt', 'w').write(str(total))\nprint('total', total)\n```\n\nIt sums the amounts."}
	})
	askEnv(t, f)
	out := filepath.Join(dir, "out")
	stdout, errs, code := c.run("ask", "--one-shot", "--model", "m", "--file", csv, "--out", out, "sum the sales")
	if code != 0 {
		t.Fatalf("code %d stdout %q stderr %s", code, stdout, errs)
	}
	if !strings.Contains(prompt, "/data/sales.csv") || !strings.Contains(prompt, "/out/") {
		t.Errorf("the model was not told the paths: %q", prompt)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "total.txt")); string(b) != "42" {
		t.Fatalf("/out/total.txt came back as %q; stdout %q", b, stdout)
	}
	if !strings.Contains(stdout, "total 42\n") || !strings.Contains(stdout, "file: "+filepath.Join(out, "total.txt")) {
		t.Errorf("stdout %q", stdout)
	}
}
