package server

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestServerFilesVM drives the files endpoints, the host volume policy and
// a TTY exec's resize on one real box: created with a host volume given
// through a symlink into the granted directory.
func TestServerFilesVM(t *testing.T) {
	requireVM(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	root := t.TempDir()
	granted := filepath.Join(root, "granted")
	os.MkdirAll(filepath.Join(granted, "share"), 0o755)
	os.MkdirAll(filepath.Join(granted, "ro"), 0o755)
	os.WriteFile(filepath.Join(granted, "ro", "keep.txt"), []byte("host"), 0o644)
	os.Symlink(granted, filepath.Join(root, "link"))
	s := New(Config{Runtime: rt, Policy: Policy{AllowVolumeDirs: []string{granted}}})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	c := apiClient{t, ts.URL}

	var box Box
	spec := BoxSpec{Image: vmtest.DefaultImage, Network: "none",
		Volumes: []VolumeSpec{{Source: filepath.Join(root, "link", "share"), Target: "/data"},
			{Source: filepath.Join(granted, "ro"), Target: "/ro", ReadOnly: true}, {Source: "apivol", Target: "/named"}}}
	if st := c.do("POST", "/v1/boxes", spec, &box); st != 201 {
		t.Fatalf("create: status %d %+v", st, box)
	}
	id := box.ID
	defer rt.Remove(context.Background(), id, true)
	if len(box.Volumes) != 3 || box.Volumes[0].Source != filepath.Join(granted, "share") {
		t.Errorf("volumes %+v: want the resolved source %s", box.Volumes, filepath.Join(granted, "share"))
	}
	files := ts.URL + "/v1/boxes/" + id

	send := func(method, url string, body io.Reader) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, url, body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp, data
	}
	wantProblem := func(resp *http.Response, data []byte, status int, code string) {
		t.Helper()
		var p Problem
		json.Unmarshal(data, &p)
		if resp.StatusCode != status || p.Code != code || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want %d %s", resp.Request.URL, resp.StatusCode, data, status, code)
		}
	}

	t.Run("file", func(t *testing.T) {
		data := make([]byte, 18<<10+1)
		rand.Read(data)
		resp, body := send("PUT", files+"/files?path=/tmp/a/b.bin&parents=true&mode=0600", bytes.NewReader(data))
		if resp.StatusCode != 204 {
			t.Fatalf("write: %d %s", resp.StatusCode, body)
		}
		resp, body = send("GET", files+"/files?path=/tmp/a/b.bin", nil)
		if resp.StatusCode != 200 || !bytes.Equal(body, data) || resp.Header.Get("X-Airlock-Mode") != "384" ||
			resp.ContentLength != int64(len(data)) {
			t.Errorf("read: %d, %d bytes (equal %v), mode %q, length %d", resp.StatusCode, len(body), bytes.Equal(body, data),
				resp.Header.Get("X-Airlock-Mode"), resp.ContentLength)
		}
		var fi FileInfo
		if st := c.do("GET", "/v1/boxes/"+id+"/files/stat?path=/tmp/a/b.bin", nil, &fi); st != 200 ||
			fi.Type != "file" || fi.Size != int64(len(data)) || fi.Mode != 0o600 || fi.Name != "b.bin" {
			t.Errorf("stat: %d %+v", st, fi)
		}
		// Empty file; a write without parents into a missing directory.
		if resp, body := send("PUT", files+"/files?path=/tmp/a/empty", strings.NewReader("")); resp.StatusCode != 204 {
			t.Errorf("empty write: %d %s", resp.StatusCode, body)
		}
		if resp, body := send("GET", files+"/files?path=/tmp/a/empty", nil); resp.StatusCode != 200 || len(body) != 0 {
			t.Errorf("empty read: %d %q", resp.StatusCode, body)
		}
		resp, body = send("PUT", files+"/files?path=/tmp/nodir/x", strings.NewReader("x"))
		wantProblem(resp, body, 404, CodeFileNotFound)
		var list DirList
		if st := c.do("GET", "/v1/boxes/"+id+"/files/list?path=/tmp/a", nil, &list); st != 200 || len(list.Entries) != 2 ||
			list.Entries[0].Name != "b.bin" || list.Entries[1].Name != "empty" {
			t.Errorf("list: %d %+v", st, list)
		}
	})

	t.Run("problems", func(t *testing.T) {
		for _, tc := range []struct {
			method, url string
			status      int
			code        string
		}{
			{"GET", "/files/stat?path=/nope", 404, CodeFileNotFound},
			{"GET", "/files?path=/nope", 404, CodeFileNotFound},
			{"GET", "/archive?path=/nope", 404, CodeFileNotFound},
			{"GET", "/files/list?path=/etc/hostname", 409, CodeNotADirectory},
			{"GET", "/files?path=/tmp", 409, CodeIsADirectory},
			{"GET", "/files?path=tmp/relative", 400, CodeInvalidPath},
			{"DELETE", "/files?path=/", 400, CodeInvalidPath},
			{"DELETE", "/files?path=/nope", 404, CodeFileNotFound},
			{"PUT", "/files?path=/tmp/x&mode=rw", 400, CodeInvalid},
		} {
			resp, body := send(tc.method, files+tc.url, strings.NewReader(""))
			wantProblem(resp, body, tc.status, tc.code)
		}
		resp, body := send("GET", ts.URL+"/v1/boxes/nosuchbox/files?path=/etc/hostname", nil)
		wantProblem(resp, body, 404, CodeBoxNotFound)
	})

	t.Run("archive", func(t *testing.T) {
		if st := c.do("POST", "/v1/boxes/"+id+"/files/mkdir", MkdirRequest{Path: "/tmp/m/n"}, nil); st != 204 {
			t.Fatalf("mkdir: %d", st)
		}
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		tw.WriteHeader(&tar.Header{Name: "tree/", Typeflag: tar.TypeDir, Mode: 0o755})
		tw.WriteHeader(&tar.Header{Name: "tree/hello.txt", Mode: 0o640, Size: 5})
		tw.Write([]byte("hello"))
		tw.WriteHeader(&tar.Header{Name: "tree/link", Typeflag: tar.TypeSymlink, Linkname: "hello.txt"})
		tw.Close()
		resp, body := send("PUT", files+"/archive?path=/tmp/m/n", &tb)
		if resp.StatusCode != 204 {
			t.Fatalf("copy in: %d %s", resp.StatusCode, body)
		}
		resp, body = send("GET", files+"/archive?path=/tmp/m/n/tree", nil)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-tar" {
			t.Fatalf("copy out: %d %s", resp.StatusCode, body)
		}
		got := map[string]string{}
		tr := tar.NewReader(bytes.NewReader(body))
		for {
			h, err := tr.Next()
			if err != nil {
				if err != io.EOF {
					t.Fatal(err)
				}
				break
			}
			d, _ := io.ReadAll(tr)
			got[h.Name] = string(d) + h.Linkname
		}
		if got["tree/hello.txt"] != "hello" || got["tree/link"] != "hello.txt" || len(got) != 3 {
			t.Errorf("archive entries %q", got)
		}
		if st := c.do("DELETE", "/v1/boxes/"+id+"/files?path=/tmp/m", nil, nil); st != 204 {
			t.Errorf("remove: %d", st)
		}
		var p Problem
		if st := c.do("GET", "/v1/boxes/"+id+"/files/stat?path=/tmp/m", nil, &p); st != 404 {
			t.Errorf("after remove: %d %+v", st, p)
		}
	})

	t.Run("upload-limit", func(t *testing.T) {
		small := httptest.NewServer(New(Config{Runtime: rt, MaxUploadBytes: 1 << 20}).Handler(false))
		defer small.Close()
		url := small.URL + "/v1/boxes/" + id + "/files?path=/tmp/limited"
		if resp, body := send("PUT", url, strings.NewReader("old")); resp.StatusCode != 204 {
			t.Fatalf("write: %d %s", resp.StatusCode, body)
		}
		big := make([]byte, 2<<20)
		// Content-Length over the limit: refused before any byte moves.
		resp, body := send("PUT", url, bytes.NewReader(big))
		wantProblem(resp, body, 413, CodeBodyTooLarge)
		// Chunked (no length): cut while streaming; nothing is written.
		resp, body = send("PUT", url, io.MultiReader(bytes.NewReader(big)))
		wantProblem(resp, body, 413, CodeBodyTooLarge)
		if resp, body := send("GET", url, nil); string(body) != "old" {
			t.Errorf("after refused uploads: %d %q, want the old file", resp.StatusCode, body)
		}
		// A tar upload has the same bound.
		resp, body = send("PUT", small.URL+"/v1/boxes/"+id+"/archive?path=/tmp", io.MultiReader(bytes.NewReader(big)))
		if resp.StatusCode != 413 {
			t.Errorf("big tar: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("early error ends a stalled upload", func(t *testing.T) {
		// The client sends the start of its body, then stalls (the pipe
		// is never closed while the request runs): the box's error on the
		// read-only volume is the answer all the same.
		for _, u := range []struct{ name, url string }{
			{"archive", files + "/archive?path=/ro"},
			{"file", files + "/files?path=/ro/stalled.txt"},
		} {
			pr, pw := io.Pipe()
			defer pw.Close()
			go func() {
				tw := tar.NewWriter(pw)
				tw.WriteHeader(&tar.Header{Name: "big", Mode: 0o644, Size: 3 << 20, Typeflag: tar.TypeReg})
				tw.Write(make([]byte, 4<<10))
			}()
			type answer struct {
				resp *http.Response
				body []byte
			}
			got := make(chan answer, 1)
			go func() {
				req, _ := http.NewRequest("PUT", u.url, pr)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Errorf("%s: %v", u.name, err)
					got <- answer{}
					return
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				got <- answer{resp, b}
			}()
			select {
			case a := <-got:
				if a.resp != nil {
					wantProblem(a.resp, a.body, 409, CodeReadOnlyFS)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: no answer 20 s after the box refused the upload", u.name)
			}
		}
		if ents, _ := os.ReadDir(filepath.Join(granted, "ro")); len(ents) != 1 {
			t.Errorf("read-only volume after stalled uploads: %d entries", len(ents))
		}
	})

	t.Run("volume", func(t *testing.T) {
		if resp, body := send("PUT", files+"/files?path=/data/from-box.txt", strings.NewReader("via api")); resp.StatusCode != 204 {
			t.Fatalf("write into the volume: %d %s", resp.StatusCode, body)
		}
		if b, err := os.ReadFile(filepath.Join(granted, "share", "from-box.txt")); err != nil || string(b) != "via api" {
			t.Errorf("host side of the volume: %q %v", b, err)
		}
		// A read-only volume refuses the write (EROFS from QEMU) and keeps its file.
		resp, body := send("PUT", files+"/files?path=/ro/keep.txt", strings.NewReader("box"))
		wantProblem(resp, body, 409, CodeReadOnlyFS)
		if b, _ := os.ReadFile(filepath.Join(granted, "ro", "keep.txt")); string(b) != "host" {
			t.Errorf("read-only volume's file: %q", b)
		}
		// A write under a named volume lands in it (mount-aware), and the list shows it.
		if resp, body := send("PUT", files+"/files?path=/named/n.txt", strings.NewReader("named")); resp.StatusCode != 204 {
			t.Fatalf("write into the named volume: %d %s", resp.StatusCode, body)
		}
		var r ExecResult
		c.do("POST", "/v1/boxes/"+id+"/exec", ExecRequest{Cmd: []string{"sh", "-c", "grep -c ' /named ' /proc/mounts; cat /named/n.txt"}}, &r)
		if r.Stdout != "1\nnamed" {
			t.Errorf("named volume in the box: %q %q", r.Stdout, r.Stderr)
		}
	})

	t.Run("tty-resize", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, strings.Replace(ts.URL, "http", "ws", 1)+"/v1/boxes/"+id+"/exec/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.CloseNow()
		start, _ := json.Marshal(ExecRequest{Cmd: []string{"sh", "-c", `stty size; read x; stty size`}, TTY: true, Rows: 30, Cols: 100})
		ws.Write(ctx, websocket.MessageText, start)
		var out bytes.Buffer
		resized := false
		var exit wsExit
		for exit.Type == "" {
			typ, msg, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("read: %v (output %q)", err, out.String())
			}
			if typ == websocket.MessageText {
				json.Unmarshal(msg, &exit)
				if exit.Type == "started" {
					exit.Type = ""
				}
				continue
			}
			if msg[0] != frameStdout {
				t.Errorf("tty output on stream %d", msg[0])
			}
			out.Write(msg[1:])
			if !resized && strings.Contains(out.String(), "30 100") {
				ws.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","rows":50,"cols":132}`))
				ws.Write(ctx, websocket.MessageBinary, append([]byte{frameStdin}, '\n'))
				resized = true
			}
		}
		if exit.Type != "exit" || exit.ExitCode != 0 || !strings.Contains(out.String(), "30 100\r\n") || !strings.Contains(out.String(), "50 132\r\n") {
			t.Errorf("exit %+v, output %q: want 30 100 then 50 132", exit, out.String())
		}
	})
}
