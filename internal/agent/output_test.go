//go:build linux

package agent_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
)

// countingHeadTail records how many bytes crossed the transport and their
// first and last few.
type countingHeadTail struct {
	n    int64
	head []byte
	tail []byte
}

func (c *countingHeadTail) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	if len(c.head) < 16 {
		c.head = append(c.head, b[:min(len(b), 16-len(c.head))]...)
	}
	c.tail = append(c.tail, b...)
	if len(c.tail) > 16 {
		c.tail = append([]byte(nil), c.tail[len(c.tail)-16:]...)
	}
	return len(b), nil
}

// With MaxOutput the agent sends the head and the tail of each stream and
// only counts the middle: the dropped bytes never reach the host.
func TestExecMaxOutputDropsTheMiddleInTheAgent(t *testing.T) {
	c := startAgent(t)
	const max = 1 << 20
	var out, errw countingHeadTail
	p, err := c.Exec(context.Background(), client.Spec{
		Argv:      []string{"sh", "-c", "printf HEAD; head -c 50000000 /dev/zero; printf TAIL; printf e >&2"},
		Env:       []string{"PATH=/usr/bin:/bin"},
		MaxOutput: max,
	}, &out, &errw)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := p.Wait()
	if err != nil || ex.Code != 0 {
		t.Fatal(ex, err)
	}
	if out.n != max || ex.StdoutDropped != 50000008-max {
		t.Fatalf("host got %d bytes, agent dropped %d; want %d and %d", out.n, ex.StdoutDropped, max, 50000008-max)
	}
	if !bytes.HasPrefix(out.head, []byte("HEAD")) || !bytes.HasSuffix(out.tail, []byte("TAIL")) {
		t.Fatalf("head %q tail %q", out.head, out.tail)
	}
	if errw.n != 1 || ex.StderrDropped != 0 {
		t.Fatalf("stderr: %d bytes, %d dropped", errw.n, ex.StderrDropped)
	}
}

// A gigabyte through the cap costs the agent a copy into its ring, not a
// transfer: on the host this takes about a second.
func TestExecMaxOutputGigabyte(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 1 GiB through a pipe")
	}
	c := startAgent(t)
	var out countingHeadTail
	t0 := time.Now()
	p, err := c.Exec(context.Background(), client.Spec{
		Argv: []string{"head", "-c", "1073741824", "/dev/zero"}, Env: []string{"PATH=/usr/bin:/bin"}, MaxOutput: 16 << 20,
	}, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := p.Wait()
	if err != nil || ex.Code != 0 {
		t.Fatal(ex, err)
	}
	if out.n != 16<<20 || ex.StdoutDropped != 1<<30-16<<20 {
		t.Fatalf("host got %d bytes, %d dropped", out.n, ex.StdoutDropped)
	}
	t.Logf("1 GiB through a 16 MiB cap in %s", time.Since(t0).Round(time.Millisecond))
}

// A background child holding the pipes open does not hold a capped exec
// either (the drain deadline still works).
func TestExecMaxOutputBackgroundChild(t *testing.T) {
	c := startAgent(t)
	t0 := time.Now()
	ex, out, _ := run(t, c, client.Spec{Argv: []string{"sh", "-c", "sleep 30 & echo hi"}, MaxOutput: 1 << 20})
	if ex.Code != 0 || out != "hi\n" {
		t.Fatalf("%+v %q", ex, out)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("exec held %s by a background child", d)
	}
}
