// Package interp is a code interpreter for a language model: the model
// writes Python, airlock runs it in a box, and the result goes back to the
// model until it answers.
//
// Two loops are offered:
//
//   - Interpreter (tool mode): the model gets one tool, execute_python(code);
//     every call runs in one stateful codebox.Context (variables and imports
//     persist), and the tool's result carries stdout, stderr, the value of
//     the last expression, the exception with its traceback, and a note of
//     the images produced. The loop ends when the model answers without tool
//     calls, or after MaxSteps rounds.
//   - OneShot: for endpoints without tool calls: ask
//     the model for code, take the fenced ```python block (or the whole
//     reply), run it once with CodeBox.Run, and return its output.
//
// The model sits behind the small LLM interface; *OpenAI implements it for
// any OpenAI-compatible endpoint.
package interp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock/codebox"
)

// ToolName is the name of the one tool of tool mode.
const ToolName = "execute_python"

// DefaultMaxSteps is Interpreter.MaxSteps when left zero.
const DefaultMaxSteps = 10

// DefaultSystemPrompt tells the model about its tool; Interpreter uses it
// when SystemPrompt is empty.
const DefaultSystemPrompt = `You are a helpful assistant that can run Python code.
Call the execute_python tool to compute anything: it runs the code in an isolated Linux microVM with Python 3.
State persists between calls like in a notebook: variables, imports and functions stay defined.
The tool returns stdout, stderr, the repr of the last expression, and the error with its traceback if the code raised.
Matplotlib figures left open at the end of a call are captured as PNG images.
When an error comes back, fix the code and try again. When you have the result, answer the user directly and concisely.`

// PythonTool is the declaration of execute_python sent to the model.
var PythonTool = Tool{
	Name:        ToolName,
	Description: "Run Python 3 code in a persistent sandboxed interpreter and return its output (stdout, stderr, the value of the last expression, any error with traceback, and images produced).",
	Parameters: map[string]any{
		"type": "object",
		"properties": map[string]any{
			"code": map[string]any{"type": "string", "description": "The Python source to run."},
		},
		"required": []string{"code"},
	},
}

// Executor runs one cell of Python with state kept between calls.
// *codebox.Context implements it.
type Executor interface {
	Run(ctx context.Context, code string) (*codebox.Result, error)
}

// ErrMaxSteps: the model still asked for tool calls after MaxSteps rounds.
var ErrMaxSteps = errors.New("the model was still calling tools when the step limit was reached")

// Interpreter is the tool-mode loop. Fill LLM and Exec; the rest is
// optional. An Interpreter runs one Ask at a time.
type Interpreter struct {
	LLM  LLM
	Exec Executor
	// MaxSteps bounds the rounds of tool calls (default DefaultMaxSteps).
	MaxSteps int
	// SystemPrompt replaces DefaultSystemPrompt.
	SystemPrompt string
	// Log, when set, receives each code block and its output as it runs
	// (the CLI's --show-code).
	Log io.Writer
	// OutDir, when set, is where images produced by the code are saved
	// (created if needed), as step<N>-<M>.png.
	OutDir string
	// MaxOutput bounds each of stdout and stderr in a tool result, in
	// bytes (default 16384); the middle of longer output is cut.
	MaxOutput int
}

// Answer is the outcome of Ask.
type Answer struct {
	// Text is the model's final reply.
	Text string
	// ToolCalls is the number of execute_python calls run.
	ToolCalls int
	// Images are the paths of the images saved in OutDir.
	Images []string
	// Messages is the whole conversation, final reply included.
	Messages []Message
	// ModelTime is the time spent waiting for the model; ExecTime the time
	// spent running code.
	ModelTime, ExecTime time.Duration
}

// Ask gives the model task and runs its tool calls until it answers. It
// returns the answer; with ErrMaxSteps it returns the partial Answer
// (Text holds the model's last words, if any). Code that raises is not an
// error: the traceback goes back to the model. Errors: the model's
// (*ModelError, HTTP errors), the executor's (the box died or could not
// start), ctx's, or failing to save an image.
func (it *Interpreter) Ask(ctx context.Context, task string) (*Answer, error) {
	sys := it.SystemPrompt
	if sys == "" {
		sys = DefaultSystemPrompt
	}
	maxSteps := it.MaxSteps
	if maxSteps <= 0 {
		maxSteps = DefaultMaxSteps
	}
	ans := &Answer{Messages: []Message{{Role: RoleSystem, Content: sys}, {Role: RoleUser, Content: task}}}
	for step := 1; ; step++ {
		t0 := time.Now()
		reply, err := it.LLM.Chat(ctx, ans.Messages, []Tool{PythonTool})
		ans.ModelTime += time.Since(t0)
		if err != nil {
			return ans, err
		}
		reply.Role = RoleAssistant
		ans.Messages = append(ans.Messages, reply)
		ans.Text = reply.Content
		if len(reply.ToolCalls) == 0 {
			return ans, nil
		}
		if step > maxSteps {
			return ans, fmt.Errorf("%w (%d)", ErrMaxSteps, maxSteps)
		}
		for i, tc := range reply.ToolCalls {
			content, err := it.call(ctx, ans, step, i, tc)
			if err != nil {
				return ans, err
			}
			ans.Messages = append(ans.Messages, Message{Role: RoleTool, ToolCallID: tc.ID, Content: content})
		}
	}
}

// toolResult is the JSON a tool message carries.
type toolResult struct {
	Stdout    string   `json:"stdout"`
	Stderr    string   `json:"stderr,omitempty"`
	Result    string   `json:"result,omitempty"`
	Error     string   `json:"error,omitempty"`
	Images    []string `json:"images,omitempty"`
	Note      string   `json:"note,omitempty"`
	Truncated bool     `json:"truncated,omitempty"`
}

// call runs one tool call and returns the tool message's content.
func (it *Interpreter) call(ctx context.Context, ans *Answer, step, i int, tc ToolCall) (string, error) {
	if tc.Name != ToolName {
		return encode(toolResult{Error: fmt.Sprintf("unknown tool %q: the only tool is %s(code)", tc.Name, ToolName)}), nil
	}
	code, err := ParseArguments(tc.Arguments)
	if err != nil {
		return encode(toolResult{Error: err.Error()}), nil
	}
	ans.ToolCalls++
	if it.Log != nil {
		fmt.Fprintf(it.Log, "--- %s #%d\n%s\n", ToolName, ans.ToolCalls, strings.TrimRight(code, "\n"))
	}
	t0 := time.Now()
	res, err := it.Exec.Run(ctx, code)
	ans.ExecTime += time.Since(t0)
	if err != nil {
		return "", err
	}
	tr := toolResult{Stdout: it.clip(res.Stdout), Stderr: it.clip(res.Stderr), Result: it.clip(res.Value), Truncated: res.Truncated}
	if res.Error != nil {
		tr.Error = res.Error.Traceback
		if tr.Error == "" {
			tr.Error = res.Error.Error()
		}
		tr.Error = it.clip(tr.Error)
	}
	var notes []string
	if res.TimedOut {
		notes = append(notes, "the code ran past its time limit and was interrupted")
	}
	if res.StateLost {
		notes = append(notes, "the interpreter was restarted: variables, imports and functions defined before are gone")
	}
	for n, img := range res.Images {
		desc := fmt.Sprintf("image %d (%s, %d bytes)", n+1, img.MIMEType, len(img.Data))
		if it.OutDir != "" {
			p, err := saveImage(it.OutDir, step, i, n, img)
			if err != nil {
				return "", err
			}
			ans.Images = append(ans.Images, p)
			desc += " saved to " + p + " and shown to the user"
		} else {
			desc += " produced (not shown to the user)"
		}
		tr.Images = append(tr.Images, desc)
	}
	tr.Note = strings.Join(notes, "; ")
	if it.Log != nil {
		logResult(it.Log, res, tr.Images)
	}
	return encode(tr), nil
}

func logResult(w io.Writer, res *codebox.Result, images []string) {
	fmt.Fprintln(w, "--- output")
	io.WriteString(w, res.Stdout)
	if res.Stdout != "" && !strings.HasSuffix(res.Stdout, "\n") {
		fmt.Fprintln(w)
	}
	io.WriteString(w, res.Stderr)
	if res.Stderr != "" && !strings.HasSuffix(res.Stderr, "\n") {
		fmt.Fprintln(w)
	}
	if res.Value != "" {
		fmt.Fprintln(w, "=>", res.Value)
	}
	if res.Error != nil {
		if res.Error.Traceback != "" {
			io.WriteString(w, res.Error.Traceback)
		} else {
			fmt.Fprintln(w, res.Error.Error())
		}
	}
	for _, d := range images {
		fmt.Fprintf(w, "[%s]\n", d)
	}
}

func saveImage(dir string, step, call, n int, img codebox.Image) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	ext := ".png"
	if img.MIMEType != "image/png" {
		ext = ".bin"
	}
	name := fmt.Sprintf("step%d-%d%s", step, n+1, ext)
	if call > 0 {
		name = fmt.Sprintf("step%d-call%d-%d%s", step, call+1, n+1, ext)
	}
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, img.Data, 0o644)
}

// ParseArguments returns the code of an execute_python call's arguments
// ({"code": "..."}). A model that sent the code bare instead of as JSON
// gets it back as is.
func ParseArguments(args string) (string, error) {
	var v struct {
		Code *string `json:"code"`
	}
	if err := json.Unmarshal([]byte(args), &v); err != nil {
		if s := strings.TrimSpace(args); s != "" && !strings.HasPrefix(s, "{") {
			return args, nil
		}
		return "", fmt.Errorf("the arguments are not valid JSON (%v): call %s with {\"code\": \"...\"}", err, ToolName)
	}
	if v.Code == nil {
		return "", fmt.Errorf("missing \"code\" argument: call %s with {\"code\": \"...\"}", ToolName)
	}
	return *v.Code, nil
}

func (it *Interpreter) clip(s string) string {
	max := it.MaxOutput
	if max <= 0 {
		max = 16 << 10
	}
	if len(s) <= max {
		return s
	}
	head, tail := max*2/3, max/3
	return s[:head] + fmt.Sprintf("\n... [%d bytes cut] ...\n", len(s)-head-tail) + s[len(s)-tail:]
}

func encode(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Runner runs code once in a fresh interpreter; *codebox.CodeBox
// implements it.
type Runner interface {
	Run(ctx context.Context, code string) (string, error)
}

// OneShotResult is the outcome of OneShot.
type OneShotResult struct {
	// Reply is the model's reply; Code the code taken from it.
	Reply, Code string
	// Output is the code's stdout.
	Output string
}

// OneShotPrompt is the seed's prompt; %s is the task.
const OneShotPrompt = "Write Python code (no explanation) for: %s"

// OneShot is the seed's loop: it asks the model for code for task,
// extracts it (ExtractCode), runs it once and returns its stdout. When the
// code fails, the error is the runner's (*codebox.ExecError, whose Stderr
// holds the traceback) and the result still has the code and the output.
// Other errors: the model's, the box's, ctx's.
func OneShot(ctx context.Context, llm LLM, run Runner, task string) (*OneShotResult, error) {
	reply, err := llm.Chat(ctx, []Message{{Role: RoleUser, Content: fmt.Sprintf(OneShotPrompt, task)}}, nil)
	if err != nil {
		return nil, err
	}
	res := &OneShotResult{Reply: reply.Content, Code: ExtractCode(reply.Content)}
	res.Output, err = run.Run(ctx, res.Code)
	return res, err
}

// fence matches a fenced block: its info string's first word (the
// language label, maybe empty) and its body.
var fence = regexp.MustCompile("(?s)```[ \t]*([A-Za-z0-9_+.-]*)[^\n`]*\n(.*?)```")

// codeKind sorts a fence label: 2 Python, 1 unlabelled, 0 shell, -1 other.
func codeKind(label string) int {
	switch strings.ToLower(label) {
	case "py", "python", "python3", "py3", "ipython", "pycon":
		return 2
	case "":
		return 1
	case "sh", "bash", "shell", "console", "zsh":
		return 0
	}
	return -1
}

// ExtractCode returns the Python to run from a model's reply, the way
// models write it: the fenced blocks labelled py/python/python3/Python (any
// case), all of them in order, joined; else the unlabelled blocks; else the
// shell blocks (sh, bash, shell), run by Python through the shell; with no
// fence at all, the whole text, trimmed (the seed's extract_code). Prose
// around the blocks is dropped.
func ExtractCode(text string) string {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	blocks := map[int][]string{}
	for _, m := range fence.FindAllStringSubmatch(text, -1) {
		k := codeKind(m[1])
		if k < 0 {
			continue
		}
		if body := strings.TrimSpace(m[2]); body != "" {
			blocks[k] = append(blocks[k], body)
		}
	}
	switch {
	case len(blocks[2]) > 0:
		return strings.Join(blocks[2], "\n\n")
	case len(blocks[1]) > 0:
		return strings.Join(blocks[1], "\n\n")
	case len(blocks[0]) > 0:
		script := strings.Join(blocks[0], "\n")
		return "import subprocess, sys\nsys.exit(subprocess.call(" + strconv.Quote(script) + ", shell=True))"
	}
	return strings.TrimSpace(text)
}
