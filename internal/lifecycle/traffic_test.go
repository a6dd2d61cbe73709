package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/vmm"
)

// fakeHelper answers the stats calls of a box's network helper with
// bytes in; it "runs" as this test process.
func fakeHelper(t *testing.T, b helper.Box, bytes *atomic.Uint64) {
	pid := os.Getpid()
	if err := os.WriteFile(filepath.Join(b.Dir, boxdir.NetPID), []byte(fmt.Sprintf("%d %d", pid, vmm.StartTime(pid))), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", boxdir.SockPath(b.Dir, b.ID, boxdir.NetControl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			var req netstack.Request
			json.NewDecoder(c).Decode(&req)
			json.NewEncoder(c).Encode(netstack.Response{Stats: netstack.Stats{BytesIn: bytes.Load()}})
			c.Close()
		}
	}()
}

func TestTrafficCountsAsUse(t *testing.T) {
	ctx := context.Background()
	b := helper.Box{ID: "0123456789ab", Dir: t.TempDir()}
	var tr Traffic
	if tr.Used(ctx, b) {
		t.Error("a box without a network helper was used")
	}
	var bytes atomic.Uint64
	fakeHelper(t, b, &bytes)
	if tr.Used(ctx, b) {
		t.Error("a helper seen first with no traffic since its start counts as use")
	}
	if tr.Used(ctx, b) {
		t.Error("no traffic since the last call counts as use")
	}
	bytes.Store(100)
	if !tr.Used(ctx, b) {
		t.Error("traffic since the last call is not use")
	}
	if tr.Used(ctx, b) {
		t.Error("the same counters twice count as use")
	}
	// The next process (each airlock command runs a pass) compares with
	// what this one recorded in the box's directory: counting from the
	// helper's start, it found every box with traffic used, always.
	var next Traffic
	if next.Used(ctx, b) {
		t.Error("a new process counts the traffic an earlier pass saw as use")
	}
	bytes.Store(200)
	if !next.Used(ctx, b) {
		t.Error("a new process does not see traffic since the last pass")
	}
	if tr.Used(ctx, b) {
		t.Error("the first process counts again what the second saw")
	}
	// A new helper (the box started or resumed again) counts from its
	// start, whatever was recorded of the old one.
	writeMark(b.Dir, mark{PID: 1, Sum: 200})
	tr.Forget(b.ID)
	if !tr.Used(ctx, b) {
		t.Error("a helper other than the recorded one: its traffic since its start is not use")
	}
}
