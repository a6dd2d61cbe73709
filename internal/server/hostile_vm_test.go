package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestHostileClientStalledReaders: a client that stops reading a buffered
// exec's response, or an exec WebSocket's output, is cut off once a write
// has waited Config.WriteStall: the exec ends and its handler returns,
// instead of holding the exec, its output and a goroutine forever.
func TestHostileClientStalledReaders(t *testing.T) {
	requireVM(t)
	home := t.TempDir()
	rt, err := airlock.Open(airlock.Options{Home: home, ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	t.Cleanup(func() { vmtest.KillHome(home) })
	s := New(Config{Runtime: rt, WriteStall: 500 * time.Millisecond})
	ts := httptest.NewServer(s.Handler(false))
	t.Cleanup(ts.Close)
	c := apiClient{t, ts.URL}
	var box Box
	if st := c.do("POST", "/v1/boxes", BoxSpec{Image: vmtest.DefaultImage, Network: "disabled"}, &box); st != 201 {
		t.Fatalf("create: %d %+v", st, box)
	}
	defer rt.Remove(context.Background(), box.ID, true)
	idle := func(what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var list ExecList
			c.do("GET", "/v1/boxes/"+box.ID+"/execs", nil, &list)
			if len(list.Execs) == 0 && s.inflight.Load() == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: after 20 s (write stall 500 ms) the server still holds it: execs %+v, %d requests in flight", what, list.Execs, s.inflight.Load())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("websocket", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, strings.Replace(ts.URL, "http", "ws", 1)+"/v1/boxes/"+box.ID+"/exec/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		req, _ := json.Marshal(ExecRequest{Cmd: []string{"cat", "/dev/zero"}})
		ws.Write(ctx, websocket.MessageText, req)
		// Read nothing: endless output fills the socket, then waits.
		time.Sleep(2 * time.Second)
		idle("an exec stream nobody reads")
	})

	t.Run("buffered", func(t *testing.T) {
		conn, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.(*net.TCPConn).SetReadBuffer(4 << 10)
		body, _ := json.Marshal(ExecRequest{Cmd: []string{"sh", "-c", "head -c 16000000 /dev/zero | tr '\\0' x"}})
		fmt.Fprintf(conn, "POST /v1/boxes/%s/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", box.ID, len(body), body)
		time.Sleep(2 * time.Second)
		idle("a 16 MB exec response nobody reads")
	})
}
