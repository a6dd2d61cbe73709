//go:build linux

package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/sys/user"

	"github.com/airlock-run/airlock/internal/agent/client"
)

func TestExecTTY(t *testing.T) {
	c := startAgent(t)
	ex, out, errs := run(t, c, client.Spec{Argv: []string{"sh", "-c", "stty size; test -t 0 && test -t 1 && test -t 2 && echo tty; echo err >&2"}, TTY: true, Rows: 33, Cols: 101})
	if ex.Code != 0 || out != "33 101\r\ntty\r\nerr\r\n" || errs != "" {
		t.Fatalf("exit %d stdout %q stderr %q", ex.Code, out, errs)
	}
}

func TestExecTTYCtrlC(t *testing.T) {
	c := startAgent(t)
	var out syncBuffer
	p, err := c.Exec(context.Background(), client.Spec{Argv: []string{"sh", "-c", "trap 'echo INT; exit 5' INT; echo ready; while :; do sleep 0.05; done"}, Env: []string{"PATH=/usr/bin:/bin"}, TTY: true, Stdin: true}, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(out.String(), "ready") {
		time.Sleep(10 * time.Millisecond)
	}
	p.WriteStdin([]byte{3})
	ex, err := p.Wait()
	if err != nil || ex.Code != 5 || !strings.Contains(out.String(), "INT") {
		t.Fatalf("exit %+v %v, output %q", ex, err, out.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The terminal of a tty exec is its user's, as after login: owner the
// exec user, group tty, mode 0620.
func TestExecTTYOwnedByExecUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (exec as another user)")
	}
	want := "65534 65534 620"
	if gs, err := user.ParseGroupFileFilter("/etc/group", func(g user.Group) bool { return g.Name == "tty" }); err == nil && len(gs) > 0 {
		want = fmt.Sprintf("65534 %d 620", gs[0].Gid)
	}
	c := startAgent(t)
	ex, out, errs := run(t, c, client.Spec{Argv: []string{"sh", "-c", `stat -c '%u %g %a' "$(tty)"`}, User: "65534:65534", TTY: true})
	if ex.Code != 0 || strings.TrimSpace(out) != want {
		t.Fatalf("exit %d, terminal %q (stderr %q), want %q", ex.Code, out, errs, want)
	}
}
