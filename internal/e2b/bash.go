package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

// shell is a bash code context: one bash process in the box, each cell
// eval'd in it (so variables, functions and the working directory carry
// over from cell to cell), its stdin /dev/null. After a cell, bash prints
// an end line with the cell's status on stdout and one on stderr; output
// before them is the cell's, streamed as it comes.
type shell struct {
	p     *airlock.Process
	stdin io.WriteCloser
	token string // the end lines' marker: random, unknown to the cell
	// chunks carries both streams' output and end lines; closed when both
	// streams ended (bash exited).
	chunks chan shellChunk
	quit   chan struct{} // closed by close: the readers stop
	once   sync.Once
	// frame, when set, writes a cell for another interpreter than bash
	// (a JavaScript context's node, js.go); result is where that one
	// leaves a cell's outcome.
	frame  func(code string) []byte
	result string
	gone   error // the error of a cell whose interpreter ended (nil: errShellGone)
}

// shellChunk is a piece of a stream, or (end) its end line.
type shellChunk struct {
	stderr bool
	text   string
	end    bool
	status int
}

// startShell starts bash as u in cwd.
func (sb *sandbox) startShell(ctx context.Context, u userInfo, cwd string) (*shell, error) {
	b := make([]byte, 12)
	rand.Read(b)
	p, err := sb.box.ExecStream(context.WithoutCancel(ctx), "bash", []string{"--norc", "--noprofile"}, airlock.ExecOptions{
		User: strconv.Itoa(u.UID) + ":" + strconv.Itoa(u.GID), WorkingDir: cwd, Env: []string{"HOME=" + u.Home, "USER=" + u.Name, "TERM=dumb"}})
	if err != nil {
		return nil, err
	}
	sh := &shell{p: p, stdin: p.Stdin(), token: "__airlock_cell_end_" + hex.EncodeToString(b), chunks: make(chan shellChunk), quit: make(chan struct{})}
	sh.readStreams(p.Stdout(), p.Stderr())
	return sh, nil
}

// readStreams reads bash's output into sh.chunks, closed when both end.
func (sh *shell) readStreams(stdout, stderr io.Reader) {
	done := make(chan struct{}, 2)
	go sh.read(stdout, false, done)
	go sh.read(stderr, true, done)
	go func() {
		<-done
		<-done
		close(sh.chunks)
	}()
}

// send passes c on; false once the shell is closed.
func (sh *shell) send(c shellChunk) bool {
	select {
	case sh.chunks <- c:
		return true
	case <-sh.quit:
		return false
	}
}

// maxEndLine bounds an end line after its marker (" STATUS\n"): a longer
// "end line" is the cell's output.
const maxEndLine = 16

// read passes r's output on as chunks, holding back what may be the start
// of an end line or of a UTF-8 character (so at most a few bytes wait).
func (sh *shell) read(r io.Reader, stderr bool, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	marker := []byte(sh.token)
	var pend []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		pend = append(pend, buf[:n]...)
		for {
			i := bytes.Index(pend, marker)
			if i < 0 {
				break
			}
			rest := pend[i+len(marker):]
			nl := bytes.IndexByte(rest[:min(len(rest), maxEndLine)], '\n')
			if nl < 0 && len(rest) < maxEndLine {
				break // the end line is not all here yet
			}
			if nl < 0 {
				// Not an end line: pass it on as output.
				if !sh.send(shellChunk{stderr: stderr, text: string(pend[:i+len(marker)])}) {
					return
				}
				pend = pend[i+len(marker):]
				continue
			}
			if i > 0 && !sh.send(shellChunk{stderr: stderr, text: string(pend[:i])}) {
				return
			}
			status, _ := strconv.Atoi(strings.TrimSpace(string(rest[:nl])))
			if !sh.send(shellChunk{stderr: stderr, end: true, status: status}) {
				return
			}
			pend = rest[nl+1:]
		}
		// Keep an end line not all here yet, or what may start one.
		keep := 0
		if i := bytes.Index(pend, marker); i >= 0 {
			keep = len(pend) - i
		} else {
			for k := min(len(marker)-1, len(pend)); k > 0; k-- {
				if bytes.HasPrefix(marker, pend[len(pend)-k:]) {
					keep = k
					break
				}
			}
		}
		cut := len(pend) - keep
		for j := 0; j < utf8.UTFMax && cut-j > 0; j++ {
			if utf8.RuneStart(pend[cut-j-1]) {
				if !utf8.FullRune(pend[cut-j-1 : cut]) {
					cut = cut - j - 1
				}
				break
			}
		}
		if cut > 0 {
			if !sh.send(shellChunk{stderr: stderr, text: string(pend[:cut])}) {
				return
			}
			pend = append(pend[:0], pend[cut:]...)
		}
		if err != nil {
			if len(pend) > 0 {
				sh.send(shellChunk{stderr: stderr, text: string(pend)})
			}
			return
		}
	}
}

// errShellGone is the error of a cell whose bash ended.
var errShellGone = errors.New("the bash process of the context exited (did the cell run exit?): its variables are gone; the next run starts a new one")

// run runs code as a cell, passing its output to on, and returns the
// status of its last command. A cell cut short by ctx kills bash (its
// state is lost).
func (sh *shell) run(ctx context.Context, code string, on func(codebox.Chunk)) (int, error) {
	var cmd []byte
	if sh.frame != nil {
		cmd = sh.frame(code)
	} else {
		delim := "AIRLOCK_CELL_" + sh.token
		if strings.Contains(code, delim) {
			return 0, badRequest("the cell contains the context's own delimiter")
		}
		cmd = fmt.Appendf(nil, "eval \"$(cat <<'%s'\n%s\n%s\n)\" </dev/null\nprintf '%s %%d\\n' \"$?\"; printf '%s 0\\n' >&2\n", delim, code, delim, sh.token, sh.token)
	}
	if _, err := sh.stdin.Write(cmd); err != nil {
		return 0, sh.goneErr()
	}
	ended, status := 0, 0
	for ended < 2 {
		select {
		case c, ok := <-sh.chunks:
			if !ok {
				return 0, sh.goneErr()
			}
			if c.end {
				ended++
				if !c.stderr {
					status = c.status
				}
				continue
			}
			on(codebox.Chunk{Stderr: c.stderr, Text: c.text})
		case <-ctx.Done():
			sh.close()
			return 0, ctx.Err()
		}
	}
	return status, nil
}

func (sh *shell) goneErr() error {
	if sh.gone != nil {
		return sh.gone
	}
	return errShellGone
}

// close ends bash.
func (sh *shell) close() {
	sh.once.Do(func() {
		close(sh.quit)
		sh.stdin.Close()
		sh.p.Kill()
	})
}
