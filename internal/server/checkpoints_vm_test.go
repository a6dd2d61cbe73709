package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestServerCheckpoints: checkpoints and rollback over REST: a checkpoint
// (a second of the same name refused), a rollback that brings the file
// back in the same box, the list as a tree with the current one, a
// rollback to a missing checkpoint, and a removal that keeps the child;
// a context's variable is rolled back with the box.
func TestServerCheckpoints(t *testing.T) {
	requireVM(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ts := httptest.NewServer(New(Config{Runtime: rt}).Handler(false))
	defer ts.Close()
	c := apiClient{t, ts.URL}
	var box Box
	if st := c.do("POST", "/v1/boxes", BoxSpec{Image: vmtest.DefaultImage, Network: "none"}, &box); st != 201 {
		t.Fatalf("create: status %d %+v", st, box)
	}
	id := box.ID
	defer rt.Remove(context.Background(), id, true)
	sh := func(script string) string {
		t.Helper()
		var r ExecResult
		if st := c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"sh", "-c", script}}, &r); st != 200 || r.ExitCode != 0 {
			t.Fatalf("exec %q: %d %+v", script, st, r)
		}
		return r.Stdout
	}
	sh("echo a > /root/f")
	var cx ContextInfo
	if st := c.do("POST", "/v1/boxes/"+id+"/contexts", nil, &cx); st != 201 {
		t.Fatalf("create context: %d", st)
	}
	var cell CellResult
	c.do("POST", "/v1/boxes/"+id+"/contexts/"+cx.ID+"/run", RunRequest{Code: "x = 1"}, &cell)
	var ck Checkpoint
	if st := c.do("POST", "/v1/boxes/"+id+"/checkpoints", CheckpointRequest{Name: "A"}, &ck); st != 201 || ck.Name != "A" || !ck.Current || ck.StateBytes == 0 {
		t.Fatalf("checkpoint A: %d %+v", st, ck)
	}
	var p Problem
	if st := c.do("POST", "/v1/boxes/"+id+"/checkpoints", CheckpointRequest{Name: "A"}, &p); st != 409 || p.Code != CodeCheckpointExists {
		t.Errorf("second A: %d %+v", st, p)
	}
	if st := c.do("POST", "/v1/boxes/"+id+"/checkpoints", CheckpointRequest{Name: "../x"}, &p); st != 422 && st != 400 {
		t.Errorf("bad name: %d %+v", st, p)
	}
	sh("echo b > /root/f")
	c.do("POST", "/v1/boxes/"+id+"/contexts/"+cx.ID+"/run", RunRequest{Code: "x = 2"}, &cell)
	if st := c.do("POST", "/v1/boxes/"+id+"/checkpoints", CheckpointRequest{Name: "B"}, &ck); st != 201 || ck.Parent != "A" {
		t.Fatalf("checkpoint B: %d %+v", st, ck)
	}
	var after Box
	if st := c.do("POST", "/v1/boxes/"+id+"/rollback", CheckpointRequest{Name: "A"}, &after); st != 200 || after.ID != id || after.State != "running" {
		t.Fatalf("rollback A: %d %+v", st, after)
	}
	if got := sh("cat /root/f"); got != "a\n" {
		t.Errorf("after rollback A: %q", got)
	}
	// The context is rolled back with the box: x as at A.
	if st := c.do("POST", "/v1/boxes/"+id+"/contexts/"+cx.ID+"/run", RunRequest{Code: "x"}, &cell); st != 200 || cell.Value != "1" {
		t.Errorf("context after rollback A: %d %+v, want x == 1", st, cell)
	}
	var list CheckpointList
	if st := c.do("GET", "/v1/boxes/"+id+"/checkpoints", nil, &list); st != 200 || len(list.Checkpoints) != 2 ||
		list.Checkpoints[0].Name != "A" || !list.Checkpoints[0].Current || list.Checkpoints[1].Parent != "A" || list.Checkpoints[1].Current {
		t.Errorf("list: %d %+v", st, list)
	}
	if st := c.do("POST", "/v1/boxes/"+id+"/rollback", CheckpointRequest{Name: "nope"}, &p); st != 404 || p.Code != CodeCheckpointNotFound {
		t.Errorf("rollback to a missing checkpoint: %d %+v", st, p)
	}
	if st := c.do("DELETE", "/v1/boxes/"+id+"/checkpoints/A", nil, nil); st != 204 {
		t.Errorf("remove A: %d", st)
	}
	if st := c.do("GET", "/v1/boxes/"+id+"/checkpoints", nil, &list); st != 200 || len(list.Checkpoints) != 1 || list.Checkpoints[0].Parent != "" {
		t.Errorf("list after removing A: %d %+v", st, list)
	}
}

// TestServerExportCheckpoints: a box exported over REST with its
// checkpoints (GET /v1/boxes/{id}/export?checkpoints=true) imports
// (POST /v1/boxes/import) as a new, stopped box with the same tree, which
// rolls back to each checkpoint; a server without
// Policy.AllowImportState refuses the archive with 403, and takes the
// same box exported without checkpoints.
func TestServerExportCheckpoints(t *testing.T) {
	requireVM(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ts := httptest.NewServer(New(Config{Runtime: rt, Policy: Policy{AllowImportState: true}}).Handler(false))
	defer ts.Close()
	strict := httptest.NewServer(New(Config{Runtime: rt}).Handler(false))
	defer strict.Close()
	c := apiClient{t, ts.URL}
	var box Box
	if st := c.do("POST", "/v1/boxes", BoxSpec{Image: vmtest.DefaultImage, Network: "none", MemoryMiB: 256}, &box); st != 201 {
		t.Fatalf("create: status %d %+v", st, box)
	}
	defer rt.Remove(context.Background(), box.ID, true)
	sh := func(id, script string) string {
		t.Helper()
		var r ExecResult
		if st := c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"sh", "-c", script}}, &r); st != 200 || r.ExitCode != 0 {
			t.Fatalf("exec %q: %d %+v", script, st, r)
		}
		return r.Stdout
	}
	sh(box.ID, "echo a > /root/f")
	var ck Checkpoint
	if st := c.do("POST", "/v1/boxes/"+box.ID+"/checkpoints", CheckpointRequest{Name: "A"}, &ck); st != 201 {
		t.Fatalf("checkpoint A: %d %+v", st, ck)
	}
	sh(box.ID, "echo b > /root/f")
	if st := c.do("POST", "/v1/boxes/"+box.ID+"/checkpoints", CheckpointRequest{Name: "B"}, &ck); st != 201 {
		t.Fatalf("checkpoint B: %d %+v", st, ck)
	}
	sh(box.ID, "echo c > /root/f")
	export := func(query string) []byte {
		t.Helper()
		resp, err := http.Get(ts.URL + "/v1/boxes/" + box.ID + "/export" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-tar" {
			t.Fatalf("export%s: %d %v %.300s", query, resp.StatusCode, err, body)
		}
		return body
	}
	imp := func(base, name string, archive []byte, out any) int {
		t.Helper()
		resp, err := http.Post(base+"/v1/boxes/import?name="+name, "application/x-tar", bytes.NewReader(archive))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("import %s: status %d, body not JSON: %v", name, resp.StatusCode, err)
		}
		return resp.StatusCode
	}
	withCkpts := export("?checkpoints=true")
	var p Problem
	if st := imp(strict.URL, "denied", withCkpts, &p); st != 403 || p.Code != CodePolicyDenied || !strings.Contains(p.Detail, "--allow-import-state") {
		t.Errorf("import with checkpoints on a server without --allow-import-state: %d %+v, want 403 policy_denied", st, p)
	}
	var plain Box
	if st := imp(strict.URL, "plain", export(""), &plain); st != 201 || plain.Name != "plain" || plain.State != "created" {
		t.Errorf("import without checkpoints: %d %+v, want 201 and a created box", st, plain)
	} else {
		defer rt.Remove(context.Background(), plain.ID, true)
	}

	var nb Box
	if st := imp(ts.URL, "copy", withCkpts, &nb); st != 201 || nb.ID == box.ID || nb.State != "created" {
		t.Fatalf("import: %d %+v", st, nb)
	}
	defer rt.Remove(context.Background(), nb.ID, true)
	var list CheckpointList
	if st := c.do("GET", "/v1/boxes/"+nb.ID+"/checkpoints", nil, &list); st != 200 || len(list.Checkpoints) != 2 ||
		list.Checkpoints[0].Name != "A" || list.Checkpoints[1].Name != "B" || list.Checkpoints[1].Parent != "A" || !list.Checkpoints[1].Current {
		t.Fatalf("imported box's checkpoints: %d %+v, want A <- B (current)", st, list)
	}
	var after Box
	if st := c.do("POST", "/v1/boxes/"+nb.ID+"/rollback", CheckpointRequest{Name: "A"}, &after); st != 200 || after.ID != nb.ID || after.State != "running" {
		t.Fatalf("rollback A on the imported box: %d %+v", st, after)
	}
	if got := sh(nb.ID, "cat /root/f"); got != "a\n" {
		t.Errorf("imported box after rollback A: /root/f = %q, want a", got)
	}
	if st := c.do("POST", "/v1/boxes/"+nb.ID+"/rollback", CheckpointRequest{Name: "B"}, &after); st != 200 {
		t.Fatalf("rollback B on the imported box: %d %+v", st, after)
	}
	if got := sh(nb.ID, "cat /root/f"); got != "b\n" {
		t.Errorf("imported box after rollback B: /root/f = %q, want b", got)
	}
}
