package client

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/transport"
)

// An agent that sends an exec's exit status and then goes on with the
// call (as the real one does, cleaning up the exec's cgroup): Wait
// returns at once, and WaitExecsEnded until the agent ends the call.
func TestWaitExecsEndedWaitsForTheAgentsEnd(t *testing.T) {
	const tail = 300 * time.Millisecond
	host, guest := net.Pipe()
	go func() {
		if err := transport.GuestHandshake(guest, agentpb.Version); err != nil {
			return
		}
		transport.Serve(guest, func(method string, st *transport.Stream) error {
			if err := st.Recv(new(agentpb.ExecRequest)); err != nil {
				return err
			}
			if err := st.Send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Exit{Exit: &agentpb.ExecExit{ExitCode: 7}}}); err != nil {
				return err
			}
			time.Sleep(tail)
			return nil
		})
	}()
	ctx := context.Background()
	c, err := Dial(ctx, func(context.Context) (net.Conn, error) { return host, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.WaitExecsEnded(ctx, 5*time.Second) // nothing pending: returns at once
	t0 := time.Now()
	p, err := c.Exec(ctx, Spec{Argv: []string{"true"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := p.Wait()
	if err != nil || ex.Code != 7 {
		t.Fatalf("Wait: %+v %v", ex, err)
	}
	if d := time.Since(t0); d >= tail {
		t.Fatalf("Wait took %s: it waited for the agent's end of the call", d)
	}
	c.WaitExecsEnded(ctx, 5*time.Second)
	if d := time.Since(t0); d < tail-50*time.Millisecond || d > 4*time.Second {
		t.Fatalf("WaitExecsEnded returned %s after the exec started; the agent ended the call after %s", d, tail)
	}
	t1 := time.Now()
	c.WaitExecsEnded(ctx, 5*time.Second)
	if d := time.Since(t1); d > time.Second {
		t.Fatalf("a second WaitExecsEnded with nothing pending took %s", d)
	}
}
