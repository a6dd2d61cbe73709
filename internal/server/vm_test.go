package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

func TestMain(m *testing.M) { os.Exit(vmtest.Main(m)) }

func requireVM(t *testing.T) {
	t.Helper()
	vmtest.Require(t)
}

// eventLog collects the /v1/events stream.
type eventLog struct {
	mu  sync.Mutex
	evs []Event
}

func subscribe(t *testing.T, base string) *eventLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	l := &eventLog{}
	open := make(chan struct{})
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev Event
			json.Unmarshal([]byte(data), &ev)
			if ev.Type == EventStreamOpen {
				close(open)
				continue
			}
			l.mu.Lock()
			l.evs = append(l.evs, ev)
			l.mu.Unlock()
		}
	}()
	select {
	case <-open:
	case <-time.After(10 * time.Second):
		t.Fatal("event stream did not open")
	}
	return l
}

func (l *eventLog) waitFor(t *testing.T, typ string) []Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		evs := append([]Event(nil), l.evs...)
		l.mu.Unlock()
		for _, ev := range evs {
			if ev.Type == typ {
				return evs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event in %+v", typ, evs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type apiClient struct {
	t    *testing.T
	base string
}

func (c apiClient) do(method, path string, body any, out any) int {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.base+path, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, data)
		}
	}
	return resp.StatusCode
}

// TestServerVM drives one real box through the API: create, exec (exit
// code, non-UTF-8 output, stdin, timeout), the WebSocket (stdin, stdout
// and stderr frames, a signal, the exit frame), code run, a context (value,
// exception), metrics fed by the library, the VM killed (502 box_died with
// its cause), and removal.
func TestServerVM(t *testing.T) {
	requireVM(t)
	m := NewMetrics("test")
	events := NewEvents()
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}, Observer: Observers{m, events}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	m.SetRuntime(rt)
	auditPath := filepath.Join(t.TempDir(), "audit.log")
	audit, err := OpenAuditLog(auditPath, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	s := New(Config{Runtime: rt, Metrics: m, Events: events, Audit: audit})
	ts := httptest.NewServer(s.Handler(false))
	t.Cleanup(ts.Close) // after subscribe's cleanup ends the event stream
	c := apiClient{t, ts.URL}
	got := subscribe(t, ts.URL)

	var box Box
	if st := c.do("POST", "/v1/boxes", BoxSpec{Image: vmtest.DefaultImage, Network: "disabled"}, &box); st != 201 {
		t.Fatalf("create: status %d %+v", st, box)
	}
	if box.State != "running" || box.ID == "" || box.Network != "none" {
		t.Fatalf("created box %+v", box)
	}
	id := box.ID
	defer rt.Remove(context.Background(), id, true)

	t.Run("max-boxes", func(t *testing.T) {
		ps := httptest.NewServer(New(Config{Runtime: rt, Policy: Policy{MaxBoxes: 1}}).Handler(false))
		defer ps.Close()
		var p Problem
		if st := (apiClient{t, ps.URL}).do("POST", "/v1/boxes", BoxSpec{}, &p); st != 403 || p.Code != CodePolicyDenied {
			t.Errorf("second box with --max-boxes 1: %d %+v", st, p)
		}
	})

	t.Run("exec", func(t *testing.T) {
		var r ExecResult
		c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"sh", "-c", `echo out; printf '\377\376' >&2; exit 3`}}, &r)
		if r.ExitCode != 3 || r.Stdout != "out\n" || r.StdoutEncoding != EncodingUTF8 {
			t.Errorf("result %+v", r)
		}
		raw, _ := base64.StdEncoding.DecodeString(r.Stderr)
		if r.StderrEncoding != EncodingBase64 || !bytes.Equal(raw, []byte{0xff, 0xfe}) {
			t.Errorf("non-UTF-8 stderr: %q (%s), want base64 of ff fe", r.Stderr, r.StderrEncoding)
		}
		// env as an object as well as a list.
		c.do("POST", "/v1/boxes/"+id+"/exec", map[string]any{"cmd": []string{"sh", "-c", "echo $A-$B"}, "env": map[string]string{"A": "1", "B": "x y"}}, &r)
		if r.Stdout != "1-x y\n" {
			t.Errorf("env as an object: stdout %q, want %q", r.Stdout, "1-x y\n")
		}
		c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"cat"}, Stdin: "aGVsbG8=", StdinEncoding: EncodingBase64}, &r)
		if r.Stdout != "hello" {
			t.Errorf("stdin: stdout %q", r.Stdout)
		}
		c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"sleep", "30"}, Timeout: 0.5}, &r)
		if !r.TimedOut || r.DurationMS > 10000 {
			t.Errorf("timeout: %+v", r)
		}
		// A running exec is listed, and killed by its id.
		done := make(chan ExecResult, 1)
		go func() {
			var r ExecResult
			c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"sleep", "60"}}, &r)
			done <- r
		}()
		var list ExecList
		for i := 0; i < 100 && len(list.Execs) == 0; i++ {
			time.Sleep(50 * time.Millisecond)
			c.do("GET", "/v1/boxes/"+id+"/execs", nil, &list)
		}
		if len(list.Execs) != 1 || list.Execs[0].Cmd[0] != "sleep" || list.Execs[0].Kind != "exec" {
			t.Fatalf("execs: %+v", list)
		}
		if st := c.do("DELETE", "/v1/boxes/"+id+"/execs/"+list.Execs[0].ID, nil, nil); st != 204 {
			t.Errorf("kill: %d", st)
		}
		select {
		case r := <-done:
			if (r.Signal != 15 && r.Signal != 9) || r.ExitCode != 128+r.Signal {
				t.Errorf("killed exec: %+v", r)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("killed exec did not return")
		}
		var p Problem
		if st := c.do("DELETE", "/v1/boxes/"+id+"/execs/"+list.Execs[0].ID, nil, &p); st != 404 || p.Code != CodeExecNotFound {
			t.Errorf("kill of an ended exec: %d %+v", st, p)
		}
		if st := c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{}, &p); st != 400 || p.Code != CodeInvalid || len(p.Errors) != 1 || p.Errors[0].Pointer != "/cmd" {
			t.Errorf("empty cmd: %d %+v", st, p)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, strings.Replace(ts.URL, "http", "ws", 1)+"/v1/boxes/"+id+"/exec/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		start, _ := json.Marshal(ExecRequest{Cmd: []string{"sh", "-c", `trap 'echo got-int >&2; exit 7' INT; echo ready; read line; echo "echo:$line"; while :; do sleep 0.1; done`}})
		ws.Write(ctx, websocket.MessageText, start)
		var stdout, stderr bytes.Buffer
		var exit wsExit
		sent, signalled := false, false
		for exit.Type == "" {
			typ, msg, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("read: %v (stdout %q stderr %q)", err, stdout.String(), stderr.String())
			}
			if typ == websocket.MessageText {
				var m wsExit
				json.Unmarshal(msg, &m)
				if m.Type == "exit" || m.Type == "error" {
					exit = m
				}
				continue
			}
			switch msg[0] {
			case frameStdout:
				stdout.Write(msg[1:])
			case frameStderr:
				stderr.Write(msg[1:])
			}
			if !sent && strings.Contains(stdout.String(), "ready\n") {
				ws.Write(ctx, websocket.MessageBinary, append([]byte{frameStdin}, "hi\n"...))
				sent = true
			}
			if !signalled && strings.Contains(stdout.String(), "echo:hi") {
				ws.Write(ctx, websocket.MessageText, []byte(`{"type":"signal","signal":"SIGINT"}`))
				signalled = true
			}
		}
		if exit.Type != "exit" || exit.ExitCode != 7 {
			t.Errorf("exit frame %+v", exit)
		}
		if stdout.String() != "ready\necho:hi\n" || stderr.String() != "got-int\n" {
			t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
		}
		if _, _, err := ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Errorf("after exit: %v, want a normal close", err)
		}
	})

	t.Run("code", func(t *testing.T) {
		var r RunResult
		c.do("POST", "/v1/boxes/"+id+"/code/run", RunRequest{Code: "print(6*7)\nraise ValueError('boom')"}, &r)
		if r.Stdout != "42\n" || r.ExitCode != 1 || !strings.Contains(r.Stderr, "ValueError: boom") {
			t.Errorf("run: %+v", r)
		}
		c.do("POST", "/v1/boxes/"+id+"/code/run", RunRequest{Code: "import time; time.sleep(30)", Timeout: 0.5}, &r)
		if !r.TimedOut {
			t.Errorf("run timeout not enforced: %+v", r)
		}
		var cx ContextInfo
		if st := c.do("POST", "/v1/boxes/"+id+"/contexts", nil, &cx); st != 201 || cx.ID == "" {
			t.Fatalf("create context: %d %+v", st, cx)
		}
		var cell CellResult
		c.do("POST", "/v1/boxes/"+id+"/contexts/"+cx.ID+"/run", RunRequest{Code: "x = 41\nprint('p')\nx + 1"}, &cell)
		if cell.Value != "42" || cell.Stdout != "p\n" || cell.Error != nil {
			t.Errorf("cell 1: %+v", cell)
		}
		c.do("POST", "/v1/boxes/"+id+"/contexts/"+cx.ID+"/run", RunRequest{Code: "x / 0"}, &cell)
		if cell.Error == nil || cell.Error.Name != "ZeroDivisionError" {
			t.Errorf("cell 2: %+v", cell)
		}
		if st := c.do("DELETE", "/v1/boxes/"+id+"/contexts/"+cx.ID, nil, nil); st != 204 {
			t.Errorf("delete context: %d", st)
		}
		var p Problem
		if st := c.do("POST", "/v1/boxes/"+id+"/contexts/"+cx.ID+"/run", RunRequest{Code: "x"}, &p); st != 404 || p.Code != CodeContextNotFound {
			t.Errorf("deleted context: %d %+v", st, p)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		resp, err := http.Get(ts.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text := string(body)
		for _, want := range []string{`airlock_boxes{state="running"} 1`, `airlock_box_starts_total{result="ok"} 1`,
			`airlock_execs_total{result="timeout"}`, `airlock_box_start_seconds_count 1`} {
			if !strings.Contains(text, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		if strings.Contains(text, "airlock_exec_output_bytes_total 0\n") {
			t.Error("exec output bytes not counted")
		}
	})

	t.Run("died", func(t *testing.T) {
		infos, _ := rt.List(context.Background())
		pid := 0
		for _, i := range infos {
			if i.ID == id {
				pid = i.PID
			}
		}
		if pid == 0 {
			t.Fatal("no QEMU pid")
		}
		syscall.Kill(pid, syscall.SIGKILL)
		var p Problem
		st := 0
		for i := 0; i < 50; i++ {
			if st = c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"true"}}, &p); st != 200 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("exec in a killed box: %d %s %q", st, p.Code, p.Cause)
		// The exit watcher may have marked the box stopped before the
		// exec: both are honest answers.
		switch {
		case st == 502 && p.Code == CodeBoxDied && p.Cause != "":
		case st == 409 && p.Code == CodeBoxNotRunning:
		default:
			t.Errorf("exec in a killed box: %d %+v", st, p)
		}
		resp, _ := http.Get(ts.URL + "/metrics")
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "airlock_vm_deaths_total{cause=\"qemu_exited\"} 1") {
			t.Error("VM death not counted")
		}
	})

	t.Run("remove", func(t *testing.T) {
		if st := c.do("DELETE", "/v1/boxes/"+id+"?force=true", nil, nil); st != 204 {
			t.Fatalf("remove: %d", st)
		}
		var p Problem
		if st := c.do("GET", "/v1/boxes/"+id, nil, &p); st != 404 || p.Code != CodeBoxNotFound {
			t.Errorf("after remove: %d %+v", st, p)
		}
	})

	t.Run("audit", func(t *testing.T) {
		data, err := os.ReadFile(auditPath)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]bool{}
		found := false
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			var e AuditEntry
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("audit line %q: %v", line, err)
			}
			kinds[e.Kind] = true
			if e.Kind == "exec" && e.BoxID == id && e.ExitCode != nil && *e.ExitCode == 3 && e.Client == "unix" && e.RequestID != "" &&
				len(e.Cmd) == 3 && e.Cmd[0] == "sh" {
				found = true
			}
		}
		if !found || !kinds["exec_stream"] || !kinds["code_run"] || !kinds["cell"] {
			t.Errorf("audit log lacks entries (exec exit 3: %v, kinds %v):\n%s", found, kinds, data)
		}
	})

	t.Run("events", func(t *testing.T) {
		// created before started (#39); every seq one more than the last.
		want := []string{EventBoxCreated, EventBoxStarted, EventExecStarted, EventExecEnded, EventBoxDied, EventBoxRemoved}
		evs := got.waitFor(t, EventBoxRemoved)
		i := 0
		sawExit3 := false
		for k, ev := range evs {
			if ev.BoxID != id {
				t.Errorf("event of another box: %+v", ev)
			}
			if k > 0 && ev.Seq != evs[k-1].Seq+1 {
				t.Errorf("event %d has seq %d after %d", k, ev.Seq, evs[k-1].Seq)
			}
			if i == 0 && ev.Type != EventBoxCreated {
				t.Errorf("first event %+v, want box.created", ev)
			}
			if i < len(want) && ev.Type == want[i] {
				i++
			}
			if ev.Type == EventExecEnded && ev.ExitCode != nil && *ev.ExitCode == 3 {
				sawExit3 = true
			}
		}
		if i < len(want) || !sawExit3 {
			t.Errorf("events %+v: want %v in order and an exec that exited 3", evs, want)
		}
	})
}

// TestServerSnapshots: a fork of a box with a context (each child has the
// file and the context with its variable, and files of its own; a stopped
// child stays, stopped), a fork
// past --max-boxes, a snapshot (a second of the same name, one past
// --max-snapshots), a restore from it (and ones asking for ports and host
// ports the policy does not grant, and for a volume), a pause
// in memory and one to disk of the restored box, each resumed, the
// snapshot's removal and a restore of the removed one.
func TestServerSnapshots(t *testing.T) {
	requireVM(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ts := httptest.NewServer(New(Config{Runtime: rt}).Handler(false))
	defer ts.Close()
	c := apiClient{t, ts.URL}
	// with is a client of another server of rt with policy p.
	with := func(p Policy) apiClient {
		ps := httptest.NewServer(New(Config{Runtime: rt, Policy: p}).Handler(false))
		t.Cleanup(ps.Close)
		return apiClient{t, ps.URL}
	}
	var box Box
	if st := c.do("POST", "/v1/boxes", BoxSpec{Image: vmtest.DefaultImage}, &box); st != 201 {
		t.Fatalf("create: status %d %+v", st, box)
	}
	id := box.ID
	defer rt.Remove(context.Background(), id, true)
	var cx ContextInfo
	if st := c.do("POST", "/v1/boxes/"+id+"/contexts", nil, &cx); st != 201 {
		t.Fatalf("create context: %d", st)
	}
	var cell CellResult
	c.do("POST", "/v1/boxes/"+id+"/contexts/"+cx.ID+"/run", RunRequest{Code: "x = 41"}, &cell)
	var r ExecResult
	c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"sh", "-c", "echo before > /root/f"}}, &r)

	// A fork: the children have the file and the context, with x.
	var fr ForkResult
	if st := c.do("POST", "/v1/boxes/"+id+"/fork", ForkRequest{N: 2}, &fr); st != 201 || len(fr.Boxes) != 2 {
		t.Fatalf("fork: %d %+v", st, fr)
	}
	for i, k := range fr.Boxes {
		defer rt.Remove(context.Background(), k.ID, true)
		if k.State != "running" || k.ID == id {
			t.Errorf("child %+v", k)
		}
		c.do("POST", "/v1/boxes/"+k.ID+"/contexts/"+cx.ID+"/run", RunRequest{Code: "x + 1"}, &cell)
		if cell.Value != "42" {
			t.Errorf("child %d context: %+v", i, cell)
		}
		c.do("POST", "/v1/boxes/"+k.ID+"/exec", ExecRequest{Cmd: []string{"sh", "-c", "cat /root/f; echo " + k.ID + " > /root/mine"}}, &r)
		if r.Stdout != "before\n" {
			t.Errorf("child %d file: %+v", i, r)
		}
	}
	c.do("POST", "/v1/boxes/"+fr.Boxes[0].ID+"/exec", ExecRequest{Cmd: []string{"cat", "/root/mine"}}, &r)
	if r.Stdout != fr.Boxes[0].ID+"\n" {
		t.Errorf("children share a file: %+v", r)
	}
	// A child with contexts is the server's: stopping it keeps it.
	var stopped Box
	if st := c.do("POST", "/v1/boxes/"+fr.Boxes[1].ID+"/stop", nil, &stopped); st != 200 || stopped.State != "stopped" {
		t.Errorf("stop a child: %d %+v", st, stopped)
	}
	if st := c.do("GET", "/v1/boxes/"+fr.Boxes[1].ID, nil, &stopped); st != 200 || stopped.State != "stopped" {
		t.Errorf("a stopped child: %d %+v", st, stopped)
	}
	var p Problem
	var over struct {
		Problem
		ForkResult
	}
	if st := with(Policy{MaxBoxes: 3}).do("POST", "/v1/boxes/"+id+"/fork", ForkRequest{N: 2}, &over); st != 403 || over.Code != CodePolicyDenied {
		t.Errorf("fork into 2 with 2 boxes up and --max-boxes 3: %d %+v", st, over)
		for _, k := range over.Boxes {
			rt.Remove(context.Background(), k.ID, true)
		}
	}

	// A snapshot, a restore from it, its removal.
	var sn Snapshot
	if st := c.do("POST", "/v1/boxes/"+id+"/snapshot", SnapshotRequest{Name: "s1"}, &sn); st != 201 || sn.Name != "s1" || sn.Box != id || sn.StateBytes == 0 {
		t.Fatalf("snapshot: %d %+v", st, sn)
	}
	if st := c.do("POST", "/v1/boxes/"+id+"/snapshot", SnapshotRequest{Name: "s1"}, &p); st != 409 || p.Code != CodeSnapshotExists {
		t.Errorf("second snapshot s1: %d %+v", st, p)
	}
	if st := with(Policy{MaxSnapshots: 1}).do("POST", "/v1/boxes/"+id+"/snapshot", SnapshotRequest{Name: "s2"}, &p); st != 403 || p.Code != CodePolicyDenied {
		t.Errorf("snapshot past --max-snapshots: %d %+v", st, p)
	}
	var list SnapshotList
	c.do("GET", "/v1/snapshots", nil, &list)
	if len(list.Snapshots) != 1 || list.Snapshots[0].Name != "s1" {
		t.Errorf("snapshots: %+v", list)
	}
	// A restore's host side is the request's, held to the policy.
	for _, sp := range []BoxSpec{{Ports: []PortSpec{{GuestPort: 80}}}, {AllowHostPorts: []int{8080}}} {
		sp.FromSnapshot = "s1"
		p = Problem{}
		if st := c.do("POST", "/v1/boxes", sp, &p); st != 403 || p.Code != CodePolicyDenied {
			t.Errorf("restore with %+v and no grant: %d %+v", sp, st, p)
		}
	}
	p = Problem{}
	if st := c.do("POST", "/v1/boxes", BoxSpec{FromSnapshot: "s1", Volumes: []VolumeSpec{{Source: "v", Target: "/v"}}}, &p); st != 400 || p.Code != CodeInvalid {
		t.Errorf("restore with a volume: %d %+v", st, p)
	}
	var rb Box
	if st := c.do("POST", "/v1/boxes", BoxSpec{FromSnapshot: "s1"}, &rb); st != 201 || rb.State != "running" || rb.Image != box.Image {
		t.Fatalf("restore: %d %+v", st, rb)
	}
	defer rt.Remove(context.Background(), rb.ID, true)
	c.do("POST", "/v1/boxes/"+rb.ID+"/exec", ExecRequest{Cmd: []string{"cat", "/root/f"}}, &r)
	if r.Stdout != "before\n" {
		t.Errorf("restored box's file: %+v", r)
	}
	// Pause in memory, then to disk, and back each time.
	var pb Box
	call := func(path string, body any) int { pb = Box{}; return c.do("POST", "/v1/boxes/"+rb.ID+path, body, &pb) }
	if st := call("/pause", PauseRequest{}); st != 200 || !pb.Paused || pb.State != "running" {
		t.Errorf("pause: %d %+v", st, pb)
	}
	// Calls into a box paused in memory are refused at once, naming resume.
	t0 := time.Now()
	p = Problem{}
	if st := c.do("POST", "/v1/boxes/"+rb.ID+"/exec", ExecRequest{Cmd: []string{"true"}}, &p); st != 409 || p.Code != CodeBoxPaused ||
		!strings.Contains(p.Detail, "/resume") || time.Since(t0) > 5*time.Second {
		t.Errorf("exec in a paused box: %d %+v after %s", st, p, time.Since(t0))
	}
	p = Problem{}
	if st := c.do("POST", "/v1/boxes/"+rb.ID+"/code/run", RunRequest{Code: "1"}, &p); st != 409 || p.Code != CodeBoxPaused {
		t.Errorf("code run in a paused box: %d %+v", st, p)
	}
	if st := call("/resume", nil); st != 200 || pb.Paused {
		t.Errorf("resume: %d %+v", st, pb)
	}
	if st := call("/pause", PauseRequest{ToDisk: true}); st != 200 || !pb.Suspended || pb.State != "stopped" {
		t.Errorf("pause to disk: %d %+v", st, pb)
	}
	if st := c.do("POST", "/v1/boxes/"+rb.ID+"/exec", ExecRequest{Cmd: []string{"true"}}, &p); st != 409 || p.Code != CodeBoxNotRunning {
		t.Errorf("exec in a box paused to disk: %d %+v", st, p)
	}
	if st := call("/resume", nil); st != 200 || pb.Suspended || pb.State != "running" {
		t.Errorf("resume from disk: %d %+v", st, pb)
	}
	c.do("POST", "/v1/boxes/"+rb.ID+"/exec", ExecRequest{Cmd: []string{"cat", "/root/f"}}, &r)
	if r.Stdout != "before\n" {
		t.Errorf("file after a pause to disk: %+v", r)
	}
	if st := c.do("DELETE", "/v1/snapshots/s1", nil, nil); st != 204 {
		t.Errorf("remove snapshot: %d", st)
	}
	if st := c.do("GET", "/v1/snapshots/s1", nil, &p); st != 404 || p.Code != CodeSnapshotNotFound {
		t.Errorf("removed snapshot: %d %+v", st, p)
	}
	if st := c.do("POST", "/v1/boxes", BoxSpec{FromSnapshot: "s1"}, &p); st != 404 || p.Code != CodeSnapshotNotFound {
		t.Errorf("restore of a removed snapshot: %d %+v", st, p)
	}
}

// TestServerLifetimes: a box with a lease lives while it is renewed and
// goes when its TTL ends; a box with an idle timeout lives while used and
// goes when left alone.
func TestServerLifetimes(t *testing.T) {
	requireVM(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	s := New(Config{Runtime: rt, ReapInterval: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.reap(ctx)
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	c := apiClient{t, ts.URL}

	exists := func(id string) bool { return c.do("GET", "/v1/boxes/"+id, nil, nil) == 200 }
	// Each box gets a goroutine that keeps it alive (renewing the lease,
	// or running execs) until told to stop, from the moment it exists.
	keep := func(spec BoxSpec, alive func(id string)) (Box, chan struct{}, time.Time) {
		t0 := time.Now()
		var b Box
		if st := c.do("POST", "/v1/boxes", spec, &b); st != 201 {
			t.Errorf("create: %d", st)
		}
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(250 * time.Millisecond):
					alive(b.ID)
				}
			}
		}()
		return b, stop, t0
	}
	var leased, idle Box
	var stopLease, stopIdle chan struct{}
	var leasedAt time.Time
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		leased, stopLease, leasedAt = keep(BoxSpec{Network: "disabled", Lease: 2, TTL: 7}, func(id string) {
			c.do("POST", "/v1/boxes/"+id+"/lease", nil, nil)
		})
	}()
	go func() {
		defer wg.Done()
		idle, stopIdle, _ = keep(BoxSpec{Network: "disabled", IdleTimeout: 1}, func(id string) {
			var r ExecResult
			c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"true"}}, &r)
		})
	}()
	wg.Wait()
	if leased.ID == "" || idle.ID == "" {
		t.Fatalf("create: %+v %+v", leased, idle)
	}
	defer rt.Remove(context.Background(), leased.ID, true)
	defer rt.Remove(context.Background(), idle.ID, true)
	defer close(stopLease)

	// 3 s of renewals and execs: both stay, past their lease and idle
	// timeout.
	time.Sleep(3 * time.Second)
	if !exists(leased.ID) || !exists(idle.ID) {
		t.Fatalf("removed while renewed/used: leased %v idle %v", exists(leased.ID), exists(idle.ID))
	}
	// Left alone, the idle box goes after ~1 s; the leased one, still
	// renewed, goes when its 7 s TTL ends.
	close(stopIdle)
	deadline := leasedAt.Add(13 * time.Second)
	var leasedGone time.Time
	for time.Now().Before(deadline) && (exists(idle.ID) || leasedGone.IsZero()) {
		if leasedGone.IsZero() && !exists(leased.ID) {
			leasedGone = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	if exists(idle.ID) {
		t.Error("idle box not removed")
	}
	if leasedGone.IsZero() {
		t.Error("box past its TTL not removed")
	} else if d := leasedGone.Sub(leasedAt); d < 7*time.Second {
		t.Errorf("TTL box removed %v after its creation began, before its 7 s TTL", d)
	}
	var p Problem
	if st := c.do("POST", "/v1/boxes/"+leased.ID+"/lease", nil, &p); st != 404 {
		t.Errorf("renewing a removed box: %d %+v", st, p)
	}
}

// TestServeShutdown: on shutdown Serve lets an in-flight exec finish and
// answer, then returns; the box is still running afterwards.
func TestServeShutdown(t *testing.T) {
	requireVM(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	dir, _ := os.MkdirTemp("", "airlock-sd-")
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, SocketName)
	l, err := ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- New(Config{Runtime: rt}).Serve(ctx, l) }()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	post := func(path string, body any, out any) int {
		b, _ := json.Marshal(body)
		resp, err := hc.Post("http://airlock"+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Errorf("POST %s: %v", path, err)
			return 0
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(out)
		return resp.StatusCode
	}
	var box Box
	if st := post("/v1/boxes", BoxSpec{Network: "disabled"}, &box); st != 201 {
		t.Fatalf("create: %d", st)
	}
	defer rt.Remove(context.Background(), box.ID, true)
	got := make(chan ExecResult, 1)
	go func() {
		var r ExecResult
		post("/v1/boxes/"+box.ID+"/exec", ExecRequest{Cmd: []string{"sh", "-c", "sleep 1; echo drained"}}, &r)
		got <- r
	}()
	time.Sleep(300 * time.Millisecond) // the exec is in flight
	cancel()
	select {
	case r := <-got:
		if r.Stdout != "drained\n" {
			t.Errorf("in-flight exec during shutdown: %+v", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("in-flight exec not answered")
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	info, err := rt.List(context.Background())
	if err != nil || len(info) != 1 || info[0].State != "running" {
		t.Errorf("after shutdown: %+v %v, want the box running", info, err)
	}
}
