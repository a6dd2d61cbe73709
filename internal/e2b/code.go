package e2b

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock/codebox"
)

// maxContexts bounds the code contexts of one sandbox.
const maxContexts = 32

// codeContext is one E2B code context: a codebox context (a Python
// interpreter in the box), or a bash process (bash.go).
type codeContext struct {
	id, language, cwd string
	user              userInfo

	mu sync.Mutex // serialises runs, and guards x, sh and runs
	x  *codebox.Context
	// sh is a bash context's shell; nil until its first run, or after
	// its bash ended.
	sh *shell
	// runs counts the context's runs (E2B's execution count).
	runs int
}

// contextJSON is E2B's Context.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// codeHandler is the code interpreter's API for the sandbox.
func (sb *sandbox) codeHandler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, "OK") })
	m.HandleFunc("POST /execute", sb.execute)
	m.HandleFunc("POST /contexts", sb.createContext)
	m.HandleFunc("GET /contexts", sb.listContexts)
	m.HandleFunc("DELETE /contexts/{id}", sb.removeContext)
	m.HandleFunc("POST /contexts/{id}/restart", sb.restartContext)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("code interpreter: %s %s is not answered by airlock (see docs/e2b.md)", r.Method, r.URL.Path))
	})
	return m
}

// language checks a context language: airlock's contexts run Python
// (codebox), bash and, in an image with node, JavaScript.
func language(l string) (string, error) {
	switch strings.ToLower(l) {
	case "", "python", "python3":
		return "python", nil
	case "bash", "sh", "shell":
		return "bash", nil
	case "js", "javascript":
		return "javascript", nil
	case "ts", "typescript", "deno":
		return "", badRequest("language %q: airlock's code contexts run python, bash and javascript (node, in an image that has it); TypeScript is not offered: run it with sandbox.commands.run", l)
	}
	return "", badRequest("language %q: airlock's code contexts run python, bash and javascript (node, in an image that has it); run other languages with sandbox.commands.run", l)
}

// startInterp starts a bash or JavaScript context's process.
func (sb *sandbox) startInterp(ctx context.Context, lang string, u userInfo, cwd string) (*shell, error) {
	if lang == "javascript" {
		return sb.startNode(ctx, u, cwd)
	}
	return sb.startShell(ctx, u, cwd)
}

// close ends the context's interpreter.
func (c *codeContext) close() {
	if c.x != nil {
		c.x.Close()
	}
	if c.sh != nil {
		c.sh.close()
		c.sh = nil
	}
}

// codebox returns the sandbox's CodeBox (made on first use).
func (sb *sandbox) codebox() *codebox.CodeBox {
	sb.cmu.Lock()
	defer sb.cmu.Unlock()
	if sb.cb == nil {
		sb.cb = codebox.Attach(sb.box, codebox.Options{})
	}
	return sb.cb
}

func (sb *sandbox) closeCode() {
	sb.cmu.Lock()
	cb := sb.cb
	sb.cb = nil
	old := sb.contexts
	sb.contexts = map[string]*codeContext{}
	sb.cmu.Unlock()
	if cb != nil {
		cb.Close()
	}
	for _, c := range old {
		if c.language == "bash" || c.language == "javascript" {
			// A running cell ends as its box goes, and lets go of c.mu.
			go func() {
				c.mu.Lock()
				defer c.mu.Unlock()
				c.close()
			}()
		}
	}
}

// newContext makes a context for language in cwd (the user's home when
// empty), under id ("" for a new one).
func (sb *sandbox) newContext(ctx context.Context, id, lang, cwd string) (*codeContext, error) {
	lang, err := language(lang)
	if err != nil {
		return nil, err
	}
	u, err := sb.user(ctx, defaultUser)
	if err != nil {
		return nil, err
	}
	cwd = u.resolve(cwd)
	if id == "" {
		b := make([]byte, 8)
		rand.Read(b)
		id = hex.EncodeToString(b)
	}
	sb.cmu.Lock()
	if len(sb.contexts) >= maxContexts {
		sb.cmu.Unlock()
		return nil, badRequest("the sandbox has %d code contexts, the most it may: remove one", maxContexts)
	}
	sb.cmu.Unlock()
	if lang == "bash" || lang == "javascript" {
		sh, err := sb.startInterp(ctx, lang, u, cwd)
		if err != nil {
			return nil, err
		}
		c := &codeContext{id: id, language: lang, cwd: cwd, user: u, sh: sh}
		sb.cmu.Lock()
		sb.contexts[id] = c
		sb.cmu.Unlock()
		return c, nil
	}
	var x *codebox.Context
	if id == defaultContextID(lang) && sb.box.FromPool() {
		// A box from a warm pool has its interpreter started: the default
		// context adopts it (a context with options would start another)
		// and moves to cwd.
		if x, err = sb.codebox().NewContext(ctx, codebox.ContextOptions{Structured: true}); err == nil {
			if res, err := x.Run(ctx, fmt.Sprintf("import os as _e2b_os\n_e2b_os.chdir(%q)", cwd)); err != nil || res.Error != nil {
				x.Close()
				x = nil
			}
		}
	}
	if x == nil {
		if x, err = sb.codebox().NewContext(ctx, codebox.ContextOptions{WorkingDir: cwd, Structured: true}); err != nil {
			return nil, err
		}
	}
	c := &codeContext{id: id, language: lang, cwd: cwd, user: u, x: x}
	sb.cmu.Lock()
	sb.contexts[id] = c
	sb.cmu.Unlock()
	return c, nil
}

// defaultContextID is the id of a sandbox's default context of a language.
func defaultContextID(lang string) string { return "default-" + lang }

// contextFor returns context id, or the default context of lang.
func (sb *sandbox) contextFor(ctx context.Context, id, lang string) (*codeContext, error) {
	if id != "" {
		sb.cmu.Lock()
		c := sb.contexts[id]
		sb.cmu.Unlock()
		if c == nil {
			return nil, fmt.Errorf("context %s not found: %w", id, errNotSandbox)
		}
		return c, nil
	}
	lang, err := language(lang)
	if err != nil {
		return nil, err
	}
	// One first run makes the default context; the others wait for it.
	sb.defMu.Lock()
	defer sb.defMu.Unlock()
	sb.cmu.Lock()
	c := sb.contexts[defaultContextID(lang)]
	sb.cmu.Unlock()
	if c != nil {
		return c, nil
	}
	return sb.newContext(ctx, defaultContextID(lang), lang, "")
}

func (sb *sandbox) createContext(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := sb.s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	c, err := sb.newContext(r.Context(), "", body.Language, body.Cwd)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, contextJSON{ID: c.id, Language: c.language, Cwd: c.cwd})
}

func (sb *sandbox) listContexts(w http.ResponseWriter, r *http.Request) {
	sb.cmu.Lock()
	out := []contextJSON{}
	for _, c := range sb.contexts {
		out = append(out, contextJSON{ID: c.id, Language: c.language, Cwd: c.cwd})
	}
	sb.cmu.Unlock()
	slices.SortFunc(out, func(a, b contextJSON) int { return strings.Compare(a.ID, b.ID) })
	writeJSON(w, http.StatusOK, out)
}

func (sb *sandbox) removeContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb.cmu.Lock()
	c := sb.contexts[id]
	delete(sb.contexts, id)
	sb.cmu.Unlock()
	if c == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("context %s not found", id))
		return
	}
	c.mu.Lock()
	c.close()
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (sb *sandbox) restartContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sb.cmu.Lock()
	c := sb.contexts[id]
	sb.cmu.Unlock()
	if c == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("context %s not found", id))
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.close()
	if c.language == "bash" || c.language == "javascript" {
		// The next run starts a new bash or node.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	x, err := sb.codebox().NewContext(r.Context(), codebox.ContextOptions{WorkingDir: c.cwd, Structured: true})
	if err != nil {
		writeBoxError(w, err)
		return
	}
	c.x = x
	w.WriteHeader(http.StatusNoContent)
}

// execute answers POST /execute: the cell's output as NDJSON lines, the
// form of E2B's code interpreter server (stdout, stderr, result, error,
// number_of_executions, end_of_execution).
func (sb *sandbox) execute(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Code      string            `json:"code"`
		ContextID string            `json:"context_id"`
		Language  string            `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if err := sb.s.decodeBody(w, r, &body); err != nil {
		writeBoxError(w, err)
		return
	}
	ctx := r.Context()
	c, err := sb.contextFor(ctx, body.ContextID, body.Language)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	if acquire := sb.s.cfg.AcquireExec; acquire != nil {
		release, err := acquire(ctx)
		if err != nil {
			writeBoxError(w, err)
			return
		}
		defer release()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.language == "bash" || c.language == "javascript" {
		sb.executeShell(ctx, w, c, body.Code, body.EnvVars)
		return
	}
	code := body.Code
	if len(body.EnvVars) > 0 {
		// The variables hold for this run only, as E2B's do: set before
		// the cell, the old values put back after it.
		env, _ := json.Marshal(body.EnvVars)
		pre := fmt.Sprintf("import os as _e2b_os, json as _e2b_json\n_e2b_env = _e2b_json.loads(%q)\n_e2b_saved = {k: _e2b_os.environ.get(k) for k in _e2b_env}\n_e2b_os.environ.update(_e2b_env)\n", env)
		if _, err := c.x.Run(ctx, pre); err != nil {
			writeBoxError(w, err)
			return
		}
		defer c.x.Run(context.WithoutCancel(ctx), "for _k, _v in _e2b_saved.items():\n    if _v is None: _e2b_os.environ.pop(_k, None)\n    else: _e2b_os.environ[_k] = _v\n")
	}
	out := &cellStream{w: w, rc: http.NewResponseController(w)}
	ctx, out.cancel = context.WithCancel(ctx)
	defer out.cancel()
	t0 := time.Now()
	res, err := c.x.RunStream(ctx, code, out.chunk)
	rec := AuditRecord{Kind: "cell", BoxID: sb.box.ID(), Code: code, Duration: time.Since(t0)}
	if err != nil {
		rec.Error = err.Error()
	} else {
		rec.TimedOut = res.TimedOut
		if res.Error != nil {
			rec.Error = res.Error.Error()
		}
	}
	sb.s.audit(rec)
	if err != nil && !out.started {
		writeBoxError(w, err)
		return
	}
	c.runs++
	if err != nil {
		// The cell's output went out already: the failure is the last line.
		out.line(map[string]any{"type": "error", "name": "SandboxError", "value": err.Error(), "traceback": ""})
	} else {
		for _, d := range res.Displays {
			out.line(resultOf(d.Data, false))
		}
		for _, img := range res.Images {
			out.image(img)
		}
		if res.Value != "" {
			data := map[string]string{"text/plain": res.Value}
			for k, v := range res.ValueData {
				if k != "text/plain" {
					data[k] = v
				}
			}
			out.line(resultOf(data, true))
		}
		if e := res.Error; e != nil {
			out.line(map[string]any{"type": "error", "name": e.Name, "value": e.Value, "traceback": e.Traceback})
		}
	}
	out.line(map[string]any{"type": "number_of_executions", "execution_count": c.runs})
	out.line(map[string]any{"type": "end_of_execution"})
}

// cellWriteTimeout bounds one write of a cell's output to the client: a
// client that reads nothing for this long is dropped and its cell
// interrupted (the cell blocks at its next print while a write waits).
const cellWriteTimeout = time.Minute

// cellStream writes a cell's output to the client as NDJSON lines as the
// cell prints it: the response starts at the first line.
type cellStream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	cancel  context.CancelFunc // ends the cell when the client is gone
	started bool
	failed  bool
}

// image writes a figure as a result.
func (o *cellStream) image(img codebox.Image) {
	r := map[string]any{"type": "result", "is_main_result": false}
	switch img.MIMEType {
	case "image/png":
		r["png"] = base64.StdEncoding.EncodeToString(img.Data)
		r["text"] = "<Figure>"
		if len(img.Chart) > 0 && json.Valid(img.Chart) {
			r["chart"] = img.Chart
		}
	case "image/jpeg":
		r["jpeg"] = base64.StdEncoding.EncodeToString(img.Data)
	case "image/svg+xml":
		r["svg"] = string(img.Data)
	default:
		return
	}
	o.line(r)
}

// resultFields maps MIME types to the fields of E2B's Result.
var resultFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	codebox.MIMEData:         "data",
	codebox.MIMEChart:        "chart",
}

// resultOf is E2B's result line of a MIME bundle (a display() or the
// cell's value): each known type in its field (json, data and chart as
// JSON, the others as text or base64), other types in "extra".
func resultOf(data map[string]string, main bool) map[string]any {
	r := map[string]any{"type": "result", "is_main_result": main}
	extra := map[string]any{}
	for mime, v := range data {
		f, ok := resultFields[mime]
		switch {
		case !ok:
			extra[mime] = v
		case (f == "json" || f == "data" || f == "chart") && json.Valid([]byte(v)):
			r[f] = json.RawMessage(v)
		case f == "json" || f == "data" || f == "chart":
			extra[mime] = v
		default:
			r[f] = v
		}
	}
	if len(extra) > 0 {
		r["extra"] = extra
	}
	return r
}

// chunk passes a piece of the cell's output on as a stdout or stderr line,
// or a figure it showed as a result.
func (o *cellStream) chunk(c codebox.Chunk) {
	if c.Image != nil {
		o.image(*c.Image)
		return
	}
	if c.Display != nil {
		o.line(resultOf(c.Display.Data, false))
		return
	}
	kind := "stdout"
	if c.Stderr {
		kind = "stderr"
	}
	o.line(map[string]any{"type": kind, "text": c.Text, "timestamp": time.Now().UnixNano()})
}

// line writes one line and flushes it.
func (o *cellStream) line(v any) {
	if o.failed {
		return
	}
	if !o.started {
		o.started = true
		o.w.Header().Set("Content-Type", "application/x-ndjson")
		o.w.WriteHeader(http.StatusOK)
	}
	b, _ := json.Marshal(v)
	o.rc.SetWriteDeadline(time.Now().Add(cellWriteTimeout))
	_, err := o.w.Write(append(b, '\n'))
	if err == nil {
		err = o.rc.Flush()
	}
	if err != nil {
		o.failed = true
		o.cancel()
	}
}

// executeShell runs a cell of a bash context: its output streamed as
// NDJSON lines; a non-zero status of its last command is the cell's error
// (name "ExitError"). env holds for this run only: the variables are
// exported before the cell and unset after it (a value they had before
// is not put back).
func (sb *sandbox) executeShell(ctx context.Context, w http.ResponseWriter, c *codeContext, code string, env map[string]string) {
	out := &cellStream{w: w, rc: http.NewResponseController(w)}
	ctx, out.cancel = context.WithCancel(ctx)
	defer out.cancel()
	if c.sh == nil {
		sh, err := sb.startInterp(ctx, c.language, c.user, c.cwd)
		if err != nil {
			writeBoxError(w, err)
			return
		}
		c.sh = sh
	}
	if len(env) > 0 && c.language == "javascript" {
		// Set in node's process.env for this run, deleted after it.
		raw, _ := json.Marshal(env)
		if _, err := c.sh.run(ctx, fmt.Sprintf("Object.assign(process.env, %s); undefined", raw), func(codebox.Chunk) {}); err != nil {
			c.sh.close()
			c.sh = nil
			writeBoxError(w, err)
			return
		}
		defer func() {
			if c.sh != nil {
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				c.sh.run(uctx, fmt.Sprintf("for (const k of Object.keys(%s)) delete process.env[k]; undefined", raw), func(codebox.Chunk) {})
			}
		}()
	} else if len(env) > 0 {
		var pre, unset strings.Builder
		for k, v := range env {
			if !envName.MatchString(k) {
				writeBoxError(w, badRequest("env_vars: %q is not a variable name", k))
				return
			}
			fmt.Fprintf(&pre, "export %s=%s\n", k, shellQuote(v))
			fmt.Fprintf(&unset, "unset %s\n", k)
		}
		code = pre.String() + code
		defer func() {
			if c.sh != nil {
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				c.sh.run(uctx, unset.String(), func(codebox.Chunk) {})
			}
		}()
	}
	t0 := time.Now()
	status, err := c.sh.run(ctx, code, out.chunk)
	rec := AuditRecord{Kind: "cell", BoxID: sb.box.ID(), Code: code, Duration: time.Since(t0)}
	if err != nil {
		rec.Error = err.Error()
		c.sh.close()
		c.sh = nil
	} else if status != 0 && c.language == "javascript" {
		rec.Error = "the cell threw"
	} else if status != 0 {
		rec.Error = fmt.Sprintf("exit status %d", status)
	}
	sb.s.audit(rec)
	if err != nil && !out.started {
		writeBoxError(w, err)
		return
	}
	c.runs++
	switch {
	case err != nil:
		out.line(map[string]any{"type": "error", "name": "SandboxError", "value": err.Error(), "traceback": ""})
	case c.language == "javascript":
		sb.jsLines(ctx, out, c.sh)
	case status != 0:
		out.line(map[string]any{"type": "error", "name": "ExitError", "value": fmt.Sprintf("exit status %d", status), "traceback": ""})
	}
	out.line(map[string]any{"type": "number_of_executions", "execution_count": c.runs})
	out.line(map[string]any{"type": "end_of_execution"})
}

// envName is what an environment variable's name may be.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
