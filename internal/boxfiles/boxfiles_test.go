package boxfiles

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/agent/client"
)

var ctx = context.Background()

func dirInfo(name string) *agentpb.FileInfo {
	return &agentpb.FileInfo{Name: name, Mode: uint32(fs.ModeDir | 0o755)}
}

func fileEntry(name string, size int64) *agentpb.FileInfo {
	return &agentpb.FileInfo{Name: name, Size: size, Mode: 0o644}
}

func TestStatAndCallErrors(t *testing.T) {
	enoent := &fs.PathError{Op: "stat", Path: "/x", Err: syscall.ENOENT}
	b, _ := boxOn(map[string]func(*client.FileRequest) *fakeCall{
		"Stat": func(req *client.FileRequest) *fakeCall {
			switch req.Path {
			case "/f":
				return newCall(result(fileEntry("f", 5)))
			case "/two":
				return newCall(result(fileEntry("a", 1), fileEntry("b", 1)))
			case "/lost":
				return newCall(msg{err: errors.New("connection reset")})
			}
			return newCall(failed(enoent))
		},
	})
	uses := 0
	b.Use = func(context.Context) func() { uses++; return func() { uses-- } }
	b.CallErr = func(err error) error { return errors.New("explained: " + err.Error()) }

	fi, err := b.Stat(ctx, "/f")
	if err != nil || fi.Name != "f" || fi.Size != 5 || fi.Mode != 0o644 {
		t.Fatalf("Stat /f: %+v %v", fi, err)
	}
	if uses != 0 {
		t.Errorf("a finished Stat left %d uses in flight", uses)
	}
	_, err = b.Stat(ctx, "/x")
	if !errors.Is(err, fs.ErrNotExist) || err.Error() != "box b1: stat /x: no such file or directory" {
		t.Errorf("Stat of a missing path: %v", err)
	}
	if _, err := b.Stat(ctx, "/two"); err == nil || err.Error() != "box b1: stat /two: agent answered 2 entries" {
		t.Errorf("Stat answered by two entries: %v", err)
	}
	if _, err := b.Stat(ctx, "/lost"); err == nil || err.Error() != "explained: connection reset" {
		t.Errorf("a transport failure is not CallErr's: %v", err)
	}
	if err := b.MkdirAll(ctx, "/d", 0o755); err == nil || !strings.HasPrefix(err.Error(), "box b1: its agent has no file calls: restart the box") {
		t.Errorf("an agent without file calls: %v", err)
	}
	b.Agent = func(context.Context) (Agent, error) { return nil, errors.New("box b1 is stopped") }
	if err := b.Remove(ctx, "/d"); err == nil || err.Error() != "box b1 is stopped" {
		t.Errorf("the connect error is not returned as it is: %v", err)
	}
}

func TestReadDir(t *testing.T) {
	b, _ := boxOn(map[string]func(*client.FileRequest) *fakeCall{
		"ReadDir": func(req *client.FileRequest) *fakeCall {
			if req.Path == "/empty" {
				return newCall(result())
			}
			first := result(fileEntry("a", 1))
			first.res.More = true
			return newCall(first, result(&agentpb.FileInfo{Name: "l", Mode: uint32(fs.ModeSymlink | 0o777), Link: "/etc"}))
		},
	})
	got, err := b.ReadDir(ctx, "/d")
	if err != nil || len(got) != 2 || got[0].Name != "a" || got[1].Link != "/etc" {
		t.Fatalf("ReadDir over two results: %+v %v", got, err)
	}
	got, err = b.ReadDir(ctx, "/empty")
	if err != nil || got != nil {
		t.Errorf("ReadDir of an empty directory: %#v %v", got, err)
	}
}

// A box chooses what it lists: entries no directory holds and listings
// past the bounds are refused with the reason.
func TestReadDirRefusesHostileListings(t *testing.T) {
	long := strings.Repeat("n", MaxPathBytes+1)
	full := &agentpb.FileInfo{Name: strings.Repeat("n", MaxPathBytes)}
	tooMuchBytes := make([]*agentpb.FileInfo, MaxDirBytes/MaxPathBytes+1)
	for i := range tooMuchBytes {
		tooMuchBytes[i] = full
	}
	short := &agentpb.FileInfo{Name: "a"}
	tooMany := make([]*agentpb.FileInfo, MaxDirEntries+1)
	for i := range tooMany {
		tooMany[i] = short
	}
	for _, c := range []struct {
		name  string
		infos []*agentpb.FileInfo
		want  string
	}{
		{"empty name", []*agentpb.FileInfo{{Name: ""}}, `the box sent an entry named "", which no directory holds: refused`},
		{"dot", []*agentpb.FileInfo{{Name: "."}}, `the box sent an entry named ".", which no directory holds: refused`},
		{"dotdot", []*agentpb.FileInfo{{Name: ".."}}, `the box sent an entry named "..", which no directory holds: refused`},
		{"slash", []*agentpb.FileInfo{{Name: "a/b"}}, `the box sent an entry named "a/b", which no directory holds: refused`},
		{"nul", []*agentpb.FileInfo{{Name: "a\x00"}}, `the box sent an entry named "a\x00", which no directory holds: refused`},
		{"long name", []*agentpb.FileInfo{{Name: long}}, "the box sent a name of 4097 bytes (at most 4096): refused"},
		{"long link", []*agentpb.FileInfo{{Name: "l", Link: long}}, "the box sent a link target of 4097 bytes (at most 4096): refused"},
		{"bytes", tooMuchBytes, "more than 64 MiB of names: refused"},
		{"entries", tooMany, "more than 1048576 entries"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, _ := boxOn(map[string]func(*client.FileRequest) *fakeCall{
				"ReadDir": answer(msg{res: &agentpb.FileResult{Infos: c.infos}}),
			})
			got, err := b.ReadDir(ctx, "/d")
			if want := "box b1: readdir /d: " + c.want; err == nil || err.Error() != want {
				t.Errorf("got %d entries, %v; want %q", len(got), err, want)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	eio := &fs.PathError{Op: "read", Path: "/f", Err: syscall.EIO}
	b, _ := boxOn(map[string]func(*client.FileRequest) *fakeCall{
		"ReadFile": func(req *client.FileRequest) *fakeCall {
			// The declared size is a hint: 1 TiB must not be allocated.
			head := result(fileEntry("f", 1<<40))
			if req.Path == "/bad" {
				return newCall(head, data([]byte("par")), failed(eio))
			}
			return newCall(head, data([]byte("hello ")), data([]byte("world")), result())
		},
	})
	got, err := b.ReadFile(ctx, "/f")
	if err != nil || string(got) != "hello world" {
		t.Fatalf("ReadFile: %q %v", got, err)
	}
	if _, err := b.ReadFile(ctx, "/bad"); !errors.Is(err, syscall.EIO) || err.Error() != "box b1: read /f: input/output error" {
		t.Errorf("ReadFile failing in the box: %v", err)
	}
	rc, fi, err := b.OpenFile(ctx, "/f")
	if err != nil || fi.Size != 1<<40 {
		t.Fatalf("OpenFile: %+v %v", fi, err)
	}
	got, err = io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != "hello world" {
		t.Errorf("OpenFile's stream: %q %v", got, err)
	}
	rc, _, err = b.OpenFile(ctx, "/bad")
	if err != nil {
		t.Fatal(err)
	}
	got, err = io.ReadAll(rc)
	if string(got) != "par" || !errors.Is(err, syscall.EIO) {
		t.Errorf("OpenFile's stream of a failing read: %q %v", got, err)
	}
}

// uploadOK answers an upload with a result once the host ends its data.
func uploadOK(calls *[]*fakeCall) func(*client.FileRequest) *fakeCall {
	return func(*client.FileRequest) *fakeCall {
		f := newCall()
		*calls = append(*calls, f)
		go func() {
			select {
			case <-f.eof:
				f.down <- result()
			case <-f.closed:
			}
		}()
		return f
	}
}

func TestWriteFile(t *testing.T) {
	var calls []*fakeCall
	b, a := boxOn(map[string]func(*client.FileRequest) *fakeCall{"WriteFile": uploadOK(&calls)})
	payload := bytes.Repeat([]byte("x"), 600<<10) // more than one read of the uploader
	if err := b.WriteFile(ctx, "/f", bytes.NewReader(payload), 0o4755|fs.ModeSetuid|fs.ModeDir, Options{Owner: true, UID: 7, GID: 8}); err != nil {
		t.Fatal(err)
	}
	if got := calls[0].uploaded(); !bytes.Equal(got, payload) {
		t.Errorf("uploaded %d bytes, want %d", len(got), len(payload))
	}
	req := a.req("WriteFile")
	if req.Mode != uint32(0o755|fs.ModeSetuid) || !req.SetOwner || req.Uid != 7 || req.Gid != 8 {
		t.Errorf("request %+v", req)
	}
	if err := b.WriteFile(ctx, "/g", strings.NewReader(""), 0, Options{}); err != nil {
		t.Fatal(err)
	}
	if req := a.req("WriteFile"); !req.SetOwner || req.Uid != 0 || req.Gid != 0 {
		t.Errorf("a file with no owner given is not root's: %+v", req)
	}
}

// blockingReader's Read waits for release, then returns data.
type blockingReader struct{ release chan struct{} }

func (r blockingReader) Read(p []byte) (int, error) {
	<-r.release
	return copy(p, "late"), nil
}

// uploaders counts the goroutines that upload a call's data.
func uploaders() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "boxfiles.(*Box).send.func")
}

// waitUploaders waits (at most 10 s, else fails with msg) until no
// uploader runs.
func waitUploaders(t *testing.T, msg string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); uploaders() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
	}
}

// An agent that fails the call ends it at once, even while a Read of the
// source is pending; what that Read returns later is dropped.
func TestSendEndsWhenTheAgentFails(t *testing.T) {
	enospc := &fs.PathError{Op: "write", Path: "/full/f", Err: syscall.ENOSPC}
	var call *fakeCall
	b, _ := boxOn(map[string]func(*client.FileRequest) *fakeCall{
		"CopyIn": func(*client.FileRequest) *fakeCall { call = newCall(failed(enospc)); return call },
	})
	waitUploaders(t, "an earlier test's uploader still runs")
	src := blockingReader{make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- b.CopyInTar(ctx, "/full", src, Options{}) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		close(src.release)
		t.Fatal("CopyInTar waits for its source after the agent failed the call")
	}
	if !errors.Is(err, syscall.ENOSPC) || err.Error() != "box b1: write /full/f: no space left on device" {
		t.Errorf("CopyInTar: %v", err)
	}
	if n := uploaders(); n != 1 {
		t.Fatalf("%d uploaders while the source's Read is pending, want 1 (is uploaders' name right?)", n)
	}
	close(src.release)
	waitUploaders(t, "the uploader still runs after its Read returned")
	if got := call.uploaded(); len(got) != 0 {
		t.Errorf("the uploader sent %q after the call ended", got)
	}
}

type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n > 0 {
		r.n--
		return copy(p, "part"), nil
	}
	return 0, errors.New("the source broke")
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func TestSendSourceErrorAbandonsTheCall(t *testing.T) {
	var calls []*fakeCall
	b, _ := boxOn(map[string]func(*client.FileRequest) *fakeCall{"WriteFile": uploadOK(&calls), "CopyIn": uploadOK(&calls)})
	src := &closeRecorder{Reader: &failingReader{n: 2}}
	err := b.WriteFile(ctx, "/f", src, 0, Options{})
	if err == nil || err.Error() != "the source broke" {
		t.Errorf("WriteFile from a failing source: %v", err)
	}
	if !calls[0].isClosed() {
		t.Error("the call was not abandoned")
	}
	if !src.closed {
		t.Error("WriteFile did not close its source (an io.Closer)")
	}
	// CopyInTar never closes the caller's reader.
	src = &closeRecorder{Reader: strings.NewReader("")}
	if err := b.CopyInTar(ctx, "/d", src, Options{}); err != nil {
		t.Fatal(err)
	}
	if src.closed {
		t.Error("CopyInTar closed the caller's reader")
	}
}

func TestCopyIn(t *testing.T) {
	host := t.TempDir()
	os.MkdirAll(filepath.Join(host, "src", "sub"), 0o755)
	os.WriteFile(filepath.Join(host, "src", "sub", "a.txt"), []byte("A"), 0o600)
	os.WriteFile(filepath.Join(host, "file"), []byte("F"), 0o644)
	enoent := &fs.PathError{Op: "stat", Path: "/new", Err: syscall.ENOENT}
	var calls []*fakeCall
	b, a := boxOn(map[string]func(*client.FileRequest) *fakeCall{
		"Stat": func(req *client.FileRequest) *fakeCall {
			if req.Path == "/dir" {
				return newCall(result(dirInfo("dir")))
			}
			return newCall(failed(enoent))
		},
		"CopyIn": uploadOK(&calls),
	})
	if err := b.CopyIn(ctx, filepath.Join(host, "src"), "/dir", Options{Owner: true, UID: 1, GID: 2}); err != nil {
		t.Fatal(err)
	}
	req := a.req("CopyIn")
	if req.Path != "/dir" || req.RenameFrom != "src" || req.RenameTo != "" || !req.SetOwner || req.Uid != 1 || req.Gid != 2 {
		t.Errorf("request %+v", req)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(calls[0].uploaded()))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, " ") != "src/ src/sub/ src/sub/a.txt" {
		t.Errorf("archive sent: %q", names)
	}
	if err := b.CopyIn(ctx, filepath.Join(host, "file"), "/new", Options{}); err != nil {
		t.Fatal(err)
	}
	if req := a.req("CopyIn"); req.Path != "/" || req.RenameFrom != "file" || req.RenameTo != "new" {
		t.Errorf("file to a missing path: %+v", req)
	}
	err := b.CopyIn(ctx, filepath.Join(host, "file"), "/new/", Options{})
	if want := "copy " + filepath.Join(host, "file") + " to box b1: /new/: destination directory does not exist"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}

func tarOf(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Name))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(h.Name))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func dirH(n string) *tar.Header  { return &tar.Header{Name: n, Typeflag: tar.TypeDir, Mode: 0o755} }
func fileH(n string) *tar.Header { return &tar.Header{Name: n, Typeflag: tar.TypeReg} }

func TestCopyOutTar(t *testing.T) {
	archive := map[string][]byte{
		"/out":  tarOf(t, dirH("out/"), fileH("out/a")),
		"/evil": tarOf(t, dirH("evil/"), fileH("evil/../../etc/x")),
	}
	var last *fakeCall
	b, _ := boxOn(map[string]func(*client.FileRequest) *fakeCall{
		"CopyOut": func(req *client.FileRequest) *fakeCall {
			top := strings.TrimPrefix(req.Path, "/")
			if req.Path == "/wrong" {
				top = "etc"
			}
			last = newCall(result(dirInfo(top)), data(archive[req.Path]), result())
			return last
		},
	})
	rc, err := b.CopyOutTar(ctx, "/out")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, archive["/out"]) {
		t.Errorf("CopyOutTar: %d bytes, %v", len(got), err)
	}
	if !last.isClosed() {
		t.Error("closing the stream did not end the call")
	}
	rc, err = b.CopyOutTar(ctx, "/evil")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(rc)
	rc.Close()
	if want := `copy /evil from box b1: entry "evil/../../etc/x" is outside "evil": refused`; err == nil || err.Error() != want {
		t.Errorf("an entry outside the top: %v, want %q", err, want)
	}
	_, err = b.CopyOutTar(ctx, "/wrong")
	if want := `copy /wrong from box b1: the box sent an archive of "etc", not "wrong": refused`; err == nil || err.Error() != want {
		t.Errorf("a wrong top entry: %v, want %q", err, want)
	}
	if !last.isClosed() {
		t.Error("a refused copy left its call open")
	}
}

func TestCopyOut(t *testing.T) {
	archive := tarOf(t, dirH("out/"), fileH("out/a"))
	b, _ := boxOn(map[string]func(*client.FileRequest) *fakeCall{
		"CopyOut": answer(result(dirInfo("out")), data(archive), result()),
	})
	host := t.TempDir()
	if err := b.CopyOut(ctx, "/out", filepath.Join(host, "got"), Options{}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(host, "got", "a")); err != nil || string(got) != "out/a" {
		t.Errorf("copied file: %q %v", got, err)
	}
	os.Symlink(host, filepath.Join(host, "link"))
	err := b.CopyOut(ctx, "/out", filepath.Join(host, "link"), Options{})
	if want := "copy /out from box b1: destination " + filepath.Join(host, "link") + " is a symlink: give the directory it points to"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}

func TestCheckedTar(t *testing.T) {
	link := &tar.Header{Name: "top/l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}
	for _, c := range []struct {
		name, top string
		entries   []*tar.Header
		want      string // "" for success
	}{
		{"inside", "top", []*tar.Header{dirH("top/"), fileH("top/a"), link, {Name: "top/h", Typeflag: tar.TypeLink, Linkname: "top/a"}}, ""},
		{"root copy", ".", []*tar.Header{dirH("./"), fileH("etc/passwd")}, ""},
		{"absolute", "top", []*tar.Header{fileH("/etc/passwd")}, `entry "/etc/passwd" is outside "top": refused`},
		{"dotdot", "top", []*tar.Header{fileH("top/../x")}, `entry "top/../x" is outside "top": refused`},
		{"dotdot at root", ".", []*tar.Header{fileH("../x")}, `entry "../x" is outside ".": refused`},
		{"sibling", "top", []*tar.Header{fileH("topx/a")}, `entry "topx/a" is outside "top": refused`},
		{"hard link out", "top", []*tar.Header{{Name: "top/h", Typeflag: tar.TypeLink, Linkname: "other/f"}}, `hard link "top/h" to "other/f", outside "top": refused`},
		{"under symlink", "top", []*tar.Header{link, fileH("top/l/shadow")}, `entry "top/l/shadow" is under the symlink "top/l": refused`},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := tarOf(t, c.entries...)
			src := io.MultiReader(bytes.NewReader(in), strings.NewReader("the result after the archive"))
			var out bytes.Buffer
			err := checkedTar(&out, src, c.top)
			if c.want == "" {
				if err != nil || !bytes.Equal(out.Bytes(), in) {
					t.Errorf("checkedTar: %v (%d bytes, want %d)", err, out.Len(), len(in))
				}
				return
			}
			if err == nil || err.Error() != c.want {
				t.Errorf("got %v, want %q", err, c.want)
			}
		})
	}
	if err := checkedTar(io.Discard, strings.NewReader(strings.Repeat("x", 1024)), "top"); err == nil || !strings.HasPrefix(err.Error(), "reading the box's archive: ") {
		t.Errorf("a stream that is no archive: %v", err)
	}
}

func TestTopName(t *testing.T) {
	for in, want := range map[string]string{"/out": "out", "/out/": "out", "/out/.": "out", "out": "out", "/a/b": "b", "/": ".", "": ".", "/..": "."} {
		if got := topName(in); got != want {
			t.Errorf("topName(%q) = %q, want %q", in, got, want)
		}
	}
}
