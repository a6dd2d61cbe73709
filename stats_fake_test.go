package airlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// TestBoxStatsServeFake: GET /v1/boxes/{id}/stats serves what Box.Stats
// (and airlock stats) reads for one box: its VM process's memory against
// the box's guest memory and its CPU time; a paused box answers too
// (paused: true) while an exec into it is refused at once with 409
// box_paused; a stopped box is 409 box_not_running, an unknown one 404.
func TestBoxStatsServeFake(t *testing.T) {
	h := fakeHarnessOn(t, fake.NewSnapshotting(os.Getenv("AIRLOCK_AGENT")))
	r := h.open(t, "")
	s := server.New(server.Config{Runtime: r})
	ts := httptest.NewServer(s.Handler(false))
	t.Cleanup(ts.Close)
	call := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	st, body := call("POST", "/v1/boxes", `{"image":"`+h.image+`","memory_mib":384,"name":"measured"}`)
	var box struct{ ID string }
	if err := json.Unmarshal(body, &box); st != 200 && st != 201 || err != nil {
		t.Fatalf("create: %d %s", st, body)
	}
	t.Cleanup(func() { r.Remove(context.Background(), box.ID, true) })
	p := "/v1/boxes/" + box.ID
	stats := func(want int) server.BoxStats {
		t.Helper()
		st, body := call("GET", p+"/stats", "")
		var v server.BoxStats
		if err := json.Unmarshal(body, &v); st != want || err != nil {
			t.Fatalf("GET stats: %d %s, want %d", st, body, want)
		}
		return v
	}
	v := stats(200)
	if v.ID != box.ID || v.Name != "measured" || v.MemoryLimitBytes != 384<<20 || v.MemoryBytes <= 0 || v.CPUSeconds < 0 ||
		v.CPUPercent < 0 || v.SampleMs <= 0 || v.Read.IsZero() || v.Paused {
		t.Errorf("stats of a running box: %+v", v)
	}

	// The library call behind it, through another handle.
	b, err := r.Get(context.Background(), "measured")
	if err != nil {
		t.Fatal(err)
	}
	if ls, err := b.Stats(context.Background()); err != nil || ls.MemoryLimitBytes != 384<<20 || ls.MemoryBytes <= 0 || ls.At.IsZero() {
		t.Errorf("Box.Stats: %+v %v", ls, err)
	}

	if st, body := call("POST", p+"/pause", `{}`); st != 200 {
		t.Fatalf("pause: %d %s", st, body)
	}
	if v := stats(200); !v.Paused || v.MemoryBytes <= 0 {
		t.Errorf("stats of a paused box: %+v", v)
	}
	st, body = call("POST", p+"/exec", `{"cmd":["true"]}`)
	if st != 409 || !strings.Contains(string(body), `"box_paused"`) || !strings.Contains(string(body), `"title":"Conflict"`) {
		t.Errorf("exec in a paused box: %d %s; want 409 box_paused", st, body)
	}
	// The library refuses it as well (not only the server's check).
	if _, err := b.Exec(context.Background(), "true", nil, airlock.ExecOptions{}); !errors.Is(err, airlock.ErrBoxPaused) {
		t.Errorf("Box.Exec in a paused box: %v; want ErrBoxPaused", err)
	}
	if st, body := call("POST", p+"/resume", `{}`); st != 200 {
		t.Fatalf("resume: %d %s", st, body)
	}
	if st, body := call("POST", p+"/stop", ""); st != 200 {
		t.Fatalf("stop: %d %s", st, body)
	}
	st, body = call("GET", p+"/stats", "")
	if st != 409 || !strings.Contains(string(body), `"box_not_running"`) {
		t.Errorf("stats of a stopped box: %d %s; want 409 box_not_running", st, body)
	}
	if _, err := b.Stats(context.Background()); !errors.Is(err, airlock.ErrBoxNotRunning) {
		t.Errorf("Box.Stats of a stopped box: %v; want ErrBoxNotRunning", err)
	}
	if st, _ := call("GET", "/v1/boxes/nope/stats", ""); st != 404 {
		t.Errorf("stats of no box: %d, want 404", st)
	}
}
