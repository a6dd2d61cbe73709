package codebox_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// DataImage is the image with numpy, pandas and matplotlib that the PNG
// test uses; the skip message says how to build it.
const DataImage = "airlock/python-data:latest"

var agentPath string

func TestMain(m *testing.M) {
	isolated, err := vmtest.Isolate()
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "codebox-test-")
	if err != nil {
		panic(err)
	}
	agentPath, err = vmtest.BuildAgent(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	helper, err := vmtest.BuildNetHelper(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("AIRLOCK_NET_HELPER", helper)
	code := m.Run()
	os.RemoveAll(dir)
	if err := isolated(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	os.Exit(code)
}

func openRuntime(t *testing.T) *airlock.Runtime {
	t.Helper()
	r, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), AgentPath: agentPath, Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func newCodeBox(t *testing.T, opts codebox.Options) *codebox.CodeBox {
	t.Helper()
	cb, err := codebox.New(context.Background(), openRuntime(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cb.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return cb
}

func hostRelease(t *testing.T) string {
	out, err := exec.Command("uname", "-r").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestCodeBox shares one python:slim box between all its subtests.
func TestCodeBox(t *testing.T) {
	vmtest.Require(t)
	idx := newIndex(t)
	cb := newCodeBox(t, codebox.Options{Timeout: 8 * time.Second, InterruptGrace: 3 * time.Second, IndexURL: idx.guestURL,
		BoxOptions: airlock.BoxOptions{AllowHostPorts: []int{idx.port}}})
	ctx := context.Background()

	t.Run("run", func(t *testing.T) {
		out, err := cb.Run(ctx, "print('Hello from a microVM!')")
		if err != nil || out != "Hello from a microVM!\n" {
			t.Fatalf("got %q, %v", out, err)
		}
	})
	t.Run("run error keeps stdout", func(t *testing.T) {
		out, err := cb.Run(ctx, "print('before')\nraise ValueError('boom')")
		var ee *codebox.ExecError
		if !errors.As(err, &ee) || out != "before\n" || ee.ExitCode != 1 || ee.Stdout != "before\n" ||
			!strings.Contains(ee.Stderr, "Traceback") || !strings.Contains(err.Error(), "ValueError: boom") {
			t.Fatalf("got %q, %#v", out, err)
		}
	})
	t.Run("run past MaxOutput is marked", func(t *testing.T) {
		o, err := cb.RunOutput(ctx, "import sys\nsys.stdout.write('H' + 'x' * (20 << 20) + 'T')")
		if err != nil {
			t.Fatal(err)
		}
		const keep = airlock.DefaultMaxOutput
		marker := fmt.Sprintf("\n[airlock: %d bytes of stdout left out here (MaxOutput)]\n", o.StdoutDropped)
		if !o.Truncated || o.StdoutDropped != 20<<20+2-keep || len(o.Stdout) != keep+len(marker) ||
			strings.Index(o.Stdout, marker) != keep/2 || !strings.HasPrefix(o.Stdout, "Hx") || !strings.HasSuffix(o.Stdout, "xT") {
			t.Fatalf("kept %d bytes, dropped %d, truncated %v, marker at %d", len(o.Stdout), o.StdoutDropped, o.Truncated, strings.Index(o.Stdout, marker))
		}
	})
	t.Run("run timeout", func(t *testing.T) {
		start := time.Now()
		out, err := cb.Run(ctx, "import subprocess, time\nsubprocess.Popen(['sleep', '600'])\nprint('start', flush=True)\ntime.sleep(600)")
		var ee *codebox.ExecError
		if !errors.As(err, &ee) || !ee.TimedOut || ee.Timeout != 8*time.Second || out != "start\n" ||
			!strings.Contains(err.Error(), "timed out after 8s") || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %q, %v", out, err)
		}
		if d := time.Since(start); d > 25*time.Second {
			t.Fatalf("took %s", d)
		}
		// The whole tree was killed: no sleep 600 left behind.
		res, err := cb.Exec(ctx, "sh", []string{"-c", "ps -eo args | grep -c '^sleep 600' || true"}, airlock.ExecOptions{})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "0" {
			t.Fatalf("leftover processes: %q %v", res.Stdout, err)
		}
		// A context deadline sooner than Options.Timeout applies too.
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err = cb.Run(dctx, "import time; time.sleep(600)")
		if !errors.As(err, &ee) || !ee.TimedOut || ee.Timeout > 3*time.Second {
			t.Fatalf("ctx deadline: %v", err)
		}
	})
	t.Run("run script and long code", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "my_script.py")
		os.WriteFile(p, []byte("import sys\nprint(sys.argv[0].endswith('my_script.py'))\nraise SystemExit('bye')\n"), 0o644)
		out, err := cb.RunScript(ctx, p)
		var ee *codebox.ExecError
		if out != "True\n" || !errors.As(err, &ee) || !strings.Contains(ee.Stderr, "bye") {
			t.Fatalf("got %q, %v", out, err)
		}
		code := "x = 0\n" + strings.Repeat("x += 1\n", 20000) + "print(x)"
		if out, err := cb.Run(ctx, code); err != nil || out != "20000\n" {
			t.Fatalf("long code (%d bytes): %q, %v", len(code), out, err)
		}
		// The copies made in the box are gone again.
		res, err := cb.Exec(ctx, "sh", []string{"-c", "ls -A /tmp/.airlock-codebox 2>/dev/null | wc -l"}, airlock.ExecOptions{})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != "0" {
			t.Fatalf("scripts left in the box's /tmp: %q %v", res.Stdout, err)
		}
	})
	t.Run("exec", func(t *testing.T) {
		res, err := cb.Exec(ctx, "python3", []string{"-c", "import sys; print('out'); sys.exit('err')"}, airlock.ExecOptions{})
		if err != nil || res.ExitCode != 1 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
			t.Fatalf("got %+v, %v", res, err)
		}
	})
	t.Run("files and a context's working dir and env", func(t *testing.T) {
		if err := cb.WriteFile(ctx, "/work/in/data.csv", []byte("a,b\n1,2\n"), 0); err != nil {
			t.Fatal(err)
		}
		x, err := cb.NewContext(ctx, codebox.ContextOptions{WorkingDir: "/work", Env: []string{"GREETING=hi"}})
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		res, err := x.Run(ctx, "import os\nos.makedirs('out', exist_ok=True)\nopen('out/r.txt', 'w').write(open('in/data.csv').read().upper())\nos.getcwd() + ' ' + os.environ['GREETING']")
		if err != nil || res.Value != "'/work hi'" {
			t.Fatalf("cwd/env: %+v %v", res, err)
		}
		got, err := cb.ReadFile(ctx, "/work/out/r.txt")
		if err != nil || string(got) != "A,B\n1,2\n" {
			t.Fatalf("ReadFile: %q %v", got, err)
		}
		dir := t.TempDir()
		if err := cb.CopyOut(ctx, "/work/out", dir+"/res"); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(dir + "/res/r.txt"); string(b) != "A,B\n1,2\n" {
			t.Fatalf("CopyOut: %q", b)
		}
		if err := cb.CopyIn(ctx, dir+"/res", "/work/back"); err != nil {
			t.Fatal(err)
		}
		if got, _ := cb.ReadFile(ctx, "/work/back/r.txt"); string(got) != "A,B\n1,2\n" {
			t.Fatalf("CopyIn: %q", got)
		}
	})
	t.Run("context", func(t *testing.T) {
		x, err := cb.NewContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		y, err := cb.NewContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer y.Close()
		run := func(x *codebox.Context, code string) *codebox.Result {
			t.Helper()
			res, err := x.Run(ctx, code)
			if err != nil {
				t.Fatalf("Run(%q): %v", code, err)
			}
			return res
		}
		run(x, "import platform\ndef double(v):\n    return 2 * v\nn = 21")
		if res := run(x, "print(platform.release())\ndouble(n)"); res.Value != "42" || strings.TrimSpace(res.Stdout) == hostRelease(t) || res.Stdout == "" {
			t.Fatalf("state/value: %+v", res)
		}
		if res := run(y, "'n' in globals()"); res.Value != "False" {
			t.Fatalf("contexts share state: %+v", res)
		}
		res := run(x, "print('partial')\n{}['missing']")
		if res.Stdout != "partial\n" || res.Error == nil || res.Error.Name != "KeyError" || !strings.Contains(res.Error.Traceback, "<cell-") {
			t.Fatalf("exception: %+v %+v", res, res.Error)
		}
		start := time.Now()
		res = run(x, "import time\nprint('sleeping')\ntime.sleep(600)")
		if !res.TimedOut || res.StateLost || res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.Stdout != "sleeping\n" {
			t.Fatalf("timeout: %+v %+v", res, res.Error)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("interrupt took %s", d)
		}
		if res := run(x, "n"); res.Value != "21" {
			t.Fatalf("state lost after interrupt: %+v", res)
		}
	})
	t.Run("hostile cells", func(t *testing.T) {
		x, err := cb.NewContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		// 1 GiB printed by one cell: the kernel keeps head and tail, so a
		// few MiB cross to the host.
		rss0 := vmRSS(t)
		t1 := time.Now()
		res, err := x.Run(ctx, "import sys\ns = 'x' * 65536\nsys.stdout.write('H')\nfor _ in range(16384): sys.stdout.write(s)\nsys.stdout.write('T')")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("1 GiB cell: %s, host RSS %d -> %d MiB", time.Since(t1).Round(time.Millisecond), rss0>>20, vmRSS(t)>>20)
		marker := fmt.Sprintf("\n[airlock: %d characters of stdout left out here]\n", res.StdoutDropped)
		if res.Error != nil || !res.Truncated || len(res.Stdout) != 8<<20+len(marker) || res.StdoutDropped != 1<<30+2-8<<20 ||
			!strings.HasPrefix(res.Stdout, "Hx") || !strings.HasSuffix(res.Stdout, "xT") || !strings.Contains(res.Stdout, marker) {
			t.Fatalf("1 GiB cell: error %v, truncated %v, kept %d, dropped %d", res.Error, res.Truncated, len(res.Stdout), res.StdoutDropped)
		}
		// A cell printing without a newline.
		if res, err := x.Run(ctx, "print('no newline', end='')"); err != nil || res.Stdout != "no newline" {
			t.Fatalf("no newline: %+v %v", res, err)
		}
		// A cell writing to the kernel's protocol pipe, no newline.
		res, err = x.Run(ctx, "import os, sys\nfd = sys.modules['__main__']._proto_out.fileno()\nb = b'z' * (1 << 20)\nfor _ in range(40): os.write(fd, b)")
		if err != nil || res.Error == nil || res.Error.Name != "ProtocolError" || !res.StateLost {
			t.Fatalf("protocol flood: %+v %v", res, err)
		}
		if res, err := x.Run(ctx, "6 * 7"); err != nil || res.Value != "42" {
			t.Fatalf("after a protocol flood: %+v %v", res, err)
		}
	})
	t.Run("install from a local index", func(t *testing.T) {
		out, err := cb.InstallPackage(ctx, "airlock-demo")
		if err != nil {
			t.Fatalf("pip: %v\n%s", err, out)
		}
		if !strings.Contains(out, "Successfully installed airlock-demo-0.1") {
			t.Fatalf("pip output: %s", out)
		}
		if !idx.served("/files/airlock_demo-0.1-py3-none-any.whl") {
			t.Fatalf("the wheel was not fetched from the test index: %v", idx.log())
		}
		if out, err := cb.Run(ctx, "import airlock_demo; print(airlock_demo.greet())"); err != nil || out != "hello from a local wheel\n" {
			t.Fatalf("import: %q, %v", out, err)
		}
		out, err = cb.InstallPackages(ctx, "no-such-package-xyz", "airlock-demo")
		var ee *codebox.ExecError
		if !errors.As(err, &ee) || !strings.Contains(out, "no-such-package-xyz") {
			t.Fatalf("missing package: %v\n%s", err, out)
		}
	})
}

// TestContextPNG needs the data image (numpy, pandas, matplotlib).
func TestContextPNG(t *testing.T) {
	vmtest.Require(t)
	s, err := vmtest.OpenImages()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(DataImage); err != nil {
		t.Skipf("image %s not in %s; build it with: airlock image build-debian --packages python3,python3-pip,python3-numpy,python3-pandas,python3-matplotlib,ca-certificates --tag %s", DataImage, vmtest.ImagesDir(), DataImage)
	}
	cb := newCodeBox(t, codebox.Options{BoxOptions: airlock.BoxOptions{Image: DataImage, MemoryMiB: 1024}, Timeout: 2 * time.Minute})
	ctx := context.Background()
	x, err := cb.NewContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	res, err := x.Run(ctx, `import matplotlib.pyplot as plt
import pandas as pd
df = pd.DataFrame({"x": range(10), "y": [v * v for v in range(10)]})
df.plot(x="x", y="y")
plt.title("squares")
plt.show()
df["y"].sum()`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first plot (matplotlib builds its font cache): %s, stderr %q", res.Duration.Round(time.Millisecond), res.Stderr)
	// A fresh box has no matplotlib font cache: matplotlib builds it on
	// the first import and says so on stderr when that takes over 5 s
	// (a timer in its FontManager), as it can under TCG on a loaded host.
	// Nothing else may be on stderr (plt.show() must not warn).
	stderr := strings.TrimPrefix(res.Stderr, "Matplotlib is building the font cache; this may take a moment.\n")
	if res.Error != nil || res.Value != "285" || len(res.Images) != 1 || res.Images[0].MIMEType != "image/png" ||
		!bytes.HasPrefix(res.Images[0].Data, []byte("\x89PNG\r\n\x1a\n")) || stderr != "" {
		var kinds []string // not the PNG's bytes in decimal
		for _, im := range res.Images {
			kinds = append(kinds, fmt.Sprintf("%s %d bytes %q", im.MIMEType, len(im.Data), im.Data[:min(8, len(im.Data))]))
		}
		res.Images = nil
		t.Fatalf("got %+v, images %v (error %+v, stderr %q)", res, kinds, res.Error, res.Stderr)
	}
	// Figures are closed after each cell, like a notebook's inline backend.
	if res, err := x.Run(ctx, "len(plt.get_fignums())"); err != nil || res.Value != "0" || len(res.Images) != 0 {
		t.Fatalf("figures left open: %+v, %v", res, err)
	}
}

// index is a PEP 503 simple index on the host's loopback, serving one
// wheel built by the test.
type index struct {
	guestURL string
	port     int // on the host's 127.0.0.1
	mu       sync.Mutex
	paths    []string
}

func (i *index) served(p string) bool {
	for _, s := range i.log() {
		if s == p {
			return true
		}
	}
	return false
}

func (i *index) log() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]string(nil), i.paths...)
}

func newIndex(t *testing.T) *index {
	name, whl := buildWheel(t)
	sum := sha256.Sum256(whl)
	idx := &index{}
	mux := http.NewServeMux()
	mux.HandleFunc("/simple/", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/":
			fmt.Fprint(w, `<!DOCTYPE html><html><body><a href="airlock-demo/">airlock-demo</a></body></html>`)
		case "/simple/airlock-demo/":
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s#sha256=%x">%s</a></body></html>`, name, sum, name)
		default:
			http.NotFound(w, r)
		}
	})
	mux.HandleFunc("/files/"+name, func(w http.ResponseWriter, r *http.Request) { w.Write(whl) })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idx.mu.Lock()
		idx.paths = append(idx.paths, r.URL.Path)
		idx.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	// The box reaches the host's 127.0.0.1:PORT as host.airlock.internal
	// once AllowHostPorts opens PORT.
	idx.guestURL = "http://" + airlock.HostName + ":" + port + "/simple/"
	idx.port, _ = strconv.Atoi(port)
	return idx
}

// buildWheel makes a pure-Python wheel of module airlock_demo.
func buildWheel(t *testing.T) (string, []byte) {
	const dist = "airlock_demo-0.1.dist-info/"
	files := []struct{ name, body string }{
		{"airlock_demo.py", "GREETING = 'hello from a local wheel'\n\n\ndef greet():\n    return GREETING\n"},
		{dist + "METADATA", "Metadata-Version: 2.1\nName: airlock-demo\nVersion: 0.1\nSummary: airlock test wheel\n"},
		{dist + "WHEEL", "Wheel-Version: 1.0\nGenerator: airlock-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString(dist + "RECORD,,\n")
	w, _ := zw.Create(dist + "RECORD")
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return "airlock_demo-0.1-py3-none-any.whl", buf.Bytes()
}

// vmRSS is this process's resident memory in bytes.
func vmRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(v), &kb)
			return kb << 10
		}
	}
	return 0
}
