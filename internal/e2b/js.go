package e2b

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/airlock-run/airlock"
)

// A JavaScript code context is a node process in the box (jsdriver.js),
// driven as a bash context is (bash.go: the cell's output streamed as it
// prints, an end line after each cell); the cell's value or error is left
// in a file of the box, read when the cell ends.

//go:embed jsdriver.js
var jsDriver string

// maxJSResult bounds what is read of a JavaScript cell's outcome (its
// value's text and its error).
const maxJSResult = 4 << 20

// errNoNode is a JavaScript context asked of a box without node.
var errNoNode = errors.New("language javascript: the sandbox's image has no node (node is not on its PATH): make the sandbox from an image with Node.js for JavaScript contexts (as E2B's code-interpreter template has); this one runs python and bash contexts")

// errNodeGone is the error of a cell whose node ended.
var errNodeGone = errors.New("the node process of the JavaScript context exited (did the cell call process.exit?): its state is gone; the next run starts a new one")

// startNode starts a JavaScript context's node as u in cwd.
func (sb *sandbox) startNode(ctx context.Context, u userInfo, cwd string) (*shell, error) {
	who := strconv.Itoa(u.UID) + ":" + strconv.Itoa(u.GID)
	res, err := sb.box.Exec(ctx, "sh", []string{"-c", "command -v node"}, airlock.ExecOptions{User: who})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("%w: %w", errBadRequest, errNoNode)
	}
	b := make([]byte, 12)
	rand.Read(b)
	tok := hex.EncodeToString(b)
	token := "__airlock_cell_end_" + tok
	result := "/tmp/.airlock-js-" + tok + ".json"
	p, err := sb.box.ExecStream(context.WithoutCancel(ctx), "node", []string{"-e", jsDriver}, airlock.ExecOptions{
		User: who, WorkingDir: cwd,
		Env: []string{"HOME=" + u.Home, "USER=" + u.Name, "TERM=dumb", "AIRLOCK_JS_TOKEN=" + token, "AIRLOCK_JS_RESULT=" + result}})
	if err != nil {
		return nil, err
	}
	sh := &shell{p: p, stdin: p.Stdin(), token: token, chunks: make(chan shellChunk), quit: make(chan struct{}),
		result: result, gone: errNodeGone,
		frame: func(code string) []byte { return fmt.Appendf(nil, "%d\n%s", len(code), code) }}
	sh.readStreams(p.Stdout(), p.Stderr())
	return sh, nil
}

// jsOutcome is what a JavaScript cell leaves in its result file.
type jsOutcome struct {
	Value *string `json:"value"`
	Error *struct {
		Name      string `json:"name"`
		Value     string `json:"value"`
		Traceback string `json:"traceback"`
	} `json:"error"`
}

// outcome reads the outcome of the cell that just ended.
func (sb *sandbox) jsOutcome(ctx context.Context, sh *shell) (jsOutcome, error) {
	var o jsOutcome
	rc, _, err := sb.box.OpenFile(ctx, sh.result)
	if err != nil {
		return o, fmt.Errorf("the JavaScript cell's result: %w", err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, maxJSResult+1))
	if err != nil {
		return o, fmt.Errorf("the JavaScript cell's result: %w", err)
	}
	if len(raw) > maxJSResult {
		return o, fmt.Errorf("the JavaScript cell's value is over %d bytes: print it instead", maxJSResult)
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return o, fmt.Errorf("the JavaScript cell's result: %w", err)
	}
	return o, nil
}

// jsLines writes a JavaScript cell's value as its main result, or its
// error.
func (sb *sandbox) jsLines(ctx context.Context, out *cellStream, sh *shell) {
	o, err := sb.jsOutcome(ctx, sh)
	switch {
	case err != nil:
		out.line(map[string]any{"type": "error", "name": "SandboxError", "value": err.Error(), "traceback": ""})
	case o.Error != nil:
		out.line(map[string]any{"type": "error", "name": o.Error.Name, "value": o.Error.Value, "traceback": o.Error.Traceback})
	case o.Value != nil:
		out.line(resultOf(map[string]string{"text/plain": *o.Value}, true))
	}
}
