package airlock_test

// The hostile-agent battery: the guest agent is played by the test
// (internal/agent/evilagent) behind the whole host stack, on the fake
// driver, as root in a box could play it after killing the real agent.
// Each test names what the host must not do for such a guest.

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/agent/evilagent"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// evilBox starts a box on the fake driver whose agent connections all go
// to a (the real agent process still stands for the machine and serves
// the calls a does not script).
func evilBox(t *testing.T, a *evilagent.Agent) *airlock.Box {
	t.Helper()
	b := evilBoxCreated(t, a)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b
}

// evilBoxCreated is evilBox not started yet.
func evilBoxCreated(t *testing.T, a *evilagent.Agent) *airlock.Box {
	t.Helper()
	drv := fake.New(os.Getenv("AIRLOCK_AGENT"))
	drv.TestAgent = a.Dial
	h := fakeHarnessOn(t, drv)
	r := h.open(t, "")
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: h.image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		r.Remove(context.Background(), b.ID(), true)
	})
	return b
}

// tarOf builds an archive by hand, as a hostile guest sends it.
func tarOf(t *testing.T, entries ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h.Format = tar.FormatPAX
		if h.Typeflag == tar.TypeReg {
			h.Size = 4
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("evil"))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// copyOutScript answers CopyOut with top as the top entry's name and
// archive as the data.
func copyOutScript(top string, archive []byte) evilagent.Script {
	return func(c *evilagent.Call) error {
		if _, err := c.FileRequest(); err != nil {
			return err
		}
		c.Result(&agentpb.FileResult{More: true, Infos: []*agentpb.FileInfo{{Name: top, Mode: uint32(fs.ModeDir | 0o755)}}})
		c.Data(archive)
		return c.Result(&agentpb.FileResult{})
	}
}

// A box answering `airlock cp BOX:/out ~` (and `~/new`) with out/x plus
// .bashrc and .ssh/authorized_keys replaces no host file, chmods no host
// directory, and leaves nothing behind: the copy fails naming the entry.
// A box naming another top entry than the one asked for is refused too.
func TestEvilAgentCopyOutStaysInDestination(t *testing.T) {
	evil := tarOf(t,
		tar.Header{Name: "out", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644},
		tar.Header{Name: ".ssh", Typeflag: tar.TypeDir, Mode: 0o777},
		tar.Header{Name: ".ssh/authorized_keys", Typeflag: tar.TypeReg, Mode: 0o644},
		tar.Header{Name: ".bashrc", Typeflag: tar.TypeReg, Mode: 0o644},
	)
	a := &evilagent.Agent{Calls: map[string]evilagent.Script{"CopyOut": copyOutScript("out", evil)}}
	b := evilBox(t, a)
	ctx := context.Background()
	for _, dst := range []string{"", "new", "new/"} {
		home := t.TempDir()
		os.Mkdir(filepath.Join(home, ".ssh"), 0o700)
		os.WriteFile(filepath.Join(home, ".ssh", "authorized_keys"), []byte("mine"), 0o600)
		os.WriteFile(filepath.Join(home, ".bashrc"), []byte("mine"), 0o644)
		err := b.CopyOut(ctx, "/out", filepath.Join(home, dst))
		if err == nil || !strings.Contains(err.Error(), ".ssh") {
			t.Errorf("cp BOX:/out %q: err = %v, want a refusal naming .ssh", dst, err)
		}
		for _, f := range []string{".bashrc", ".ssh/authorized_keys"} {
			if b, _ := os.ReadFile(filepath.Join(home, f)); string(b) != "mine" {
				t.Errorf("cp BOX:/out %q: %s replaced: %q", dst, f, b)
			}
		}
		if fi, _ := os.Stat(filepath.Join(home, ".ssh")); fi.Mode().Perm() != 0o700 {
			t.Errorf("cp BOX:/out %q: ~/.ssh chmodded to %v", dst, fi.Mode().Perm())
		}
		ents, _ := os.ReadDir(home)
		if len(ents) != 2 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("cp BOX:/out %q: left %v in the destination", dst, names)
		}
	}

	// The top entry the box names must be the one asked for.
	a.SetCall("CopyOut", copyOutScript(".ssh", tarOf(t,
		tar.Header{Name: ".ssh", Typeflag: tar.TypeDir, Mode: 0o777},
		tar.Header{Name: ".ssh/authorized_keys", Typeflag: tar.TypeReg, Mode: 0o644},
	)))
	home := t.TempDir()
	os.Mkdir(filepath.Join(home, ".ssh"), 0o700)
	os.WriteFile(filepath.Join(home, ".ssh", "authorized_keys"), []byte("mine"), 0o600)
	err := b.CopyOut(ctx, "/out", home)
	if err == nil || !strings.Contains(err.Error(), `".ssh"`) {
		t.Errorf("top entry .ssh for /out: err = %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(filepath.Join(home, ".ssh", "authorized_keys")); string(b) != "mine" {
		t.Errorf("authorized_keys replaced: %q", b)
	}
}

// heapDuring returns the most heap this process had in use while f ran
// (sampled every millisecond) above what it had before.
func heapDuring(f func()) uint64 {
	// Little garbage headroom, so that the peak is about live memory.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	done := make(chan struct{})
	peak := make(chan uint64)
	go func() {
		var p uint64
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			p = max(p, ms.HeapAlloc)
			select {
			case <-done:
				peak <- p
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	f()
	close(done)
	p := <-peak
	if p < before {
		return 0
	}
	return p - before
}

// A box that declares a 1 GiB file and sends 4 bytes costs the host 4
// bytes, not a 1 GiB buffer.
func TestEvilAgentReadFileDeclaredSize(t *testing.T) {
	a := &evilagent.Agent{Calls: map[string]evilagent.Script{"ReadFile": func(c *evilagent.Call) error {
		if _, err := c.FileRequest(); err != nil {
			return err
		}
		c.Result(&agentpb.FileResult{More: true, Infos: []*agentpb.FileInfo{{Name: "f", Size: airlock.MaxReadFile, Mode: 0o644}}})
		c.Data([]byte("evil"))
		return c.Result(&agentpb.FileResult{Bytes: 4})
	}}}
	b := evilBox(t, a)
	var data []byte
	var err error
	grew := heapDuring(func() { data, err = b.ReadFile(context.Background(), "/f") })
	if err != nil || string(data) != "evil" {
		t.Fatalf("ReadFile: %q %v", data, err)
	}
	t.Logf("host heap grew by %d KiB", grew>>10)
	if grew > 32<<20 {
		t.Fatalf("a declared size of 1 GiB grew the host's heap by %d MiB", grew>>20)
	}
}

// readDirScript answers ReadDir with n entries named by name(i), in
// batches of batch.
func readDirScript(n, batch int, name func(i int) string) evilagent.Script {
	return func(c *evilagent.Call) error {
		if _, err := c.FileRequest(); err != nil {
			return err
		}
		var infos []*agentpb.FileInfo
		for i := 0; i < n; i++ {
			infos = append(infos, &agentpb.FileInfo{Name: name(i), Mode: 0o644})
			if len(infos) == batch {
				if err := c.Result(&agentpb.FileResult{Infos: infos, More: true}); err != nil {
					return err
				}
				infos = nil
			}
		}
		return c.Result(&agentpb.FileResult{Infos: infos})
	}
}

// A listing is bounded in bytes, not only entries: names past PATH_MAX, a
// listing past 64 MiB of names, and names no directory holds are refused,
// and the host's heap stays bounded meanwhile.
func TestEvilAgentReadDirBounded(t *testing.T) {
	a := &evilagent.Agent{Calls: map[string]evilagent.Script{}}
	b := evilBox(t, a)
	ctx := context.Background()
	cases := []struct {
		what   string
		script evilagent.Script
		want   string
	}{
		{"4 MiB names", readDirScript(64, 1, func(i int) string {
			return strings.Repeat("n", 4<<20-64) + string(rune('a'+i%26))
		}), "name of"},
		{"80 MiB of 4000-byte names", readDirScript(20000, 200, func(i int) string {
			return strings.Repeat("n", 3990) + strings.Repeat("x", 10-len(itoa(i))) + itoa(i)
		}), "MiB of names"},
		{"a name with a slash", readDirScript(1, 1, func(int) string { return "../../etc/passwd" }), "no directory holds"},
	}
	for _, c := range cases {
		a.SetCall("ReadDir", c.script)
		var ents []airlock.FileInfo
		var err error
		grew := heapDuring(func() { ents, err = b.ReadDir(ctx, "/d") })
		t.Logf("%s: heap +%d MiB, err %v", c.what, grew>>20, err)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %d entries, err = %v, want an error with %q", c.what, len(ents), err, c.want)
		}
		if grew > 150<<20 {
			t.Errorf("%s: the host's heap grew by %d MiB", c.what, grew>>20)
		}
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{digits[i%10]}, b...)
	}
	return string(b)
}

// A box whose agent floods the connection with yamux pings (forging the
// replies to the host's keepalive) is cut off at each connection, and the
// errors of its start and of a call say why.
func TestEvilAgentPingFloodEndsTheSession(t *testing.T) {
	flood := func(conn net.Conn) error {
		_, err := evilagent.PingFlood(conn, 10*time.Second)
		return err
	}
	// The box is made with a well-behaved agent (a flood from its first
	// connection cuts off the create's own, or not, by timing); then its
	// connection ends, and every connection from now on floods.
	a := &evilagent.Agent{}
	b := evilBoxCreated(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a.SetRaw(flood)
	a.Close()
	// The first call may find the old connection ended.
	if _, err := b.ReadFile(ctx, "/etc/hostname"); err == nil || !strings.Contains(err.Error(), "pings") && !strings.Contains(err.Error(), "lost the connection") {
		t.Fatalf("ReadFile after the agent's connection ended: %v, want it lost or an error naming the pings", err)
	}
	before := runtime.NumGoroutine()
	// The handshake completes before the flood: Start may see it or not.
	if err := b.Start(ctx); err != nil && !strings.Contains(err.Error(), "pings") {
		t.Fatalf("start with an agent flooding pings: %v, want success or an error naming the pings", err)
	}
	for i := 0; i < 3; i++ {
		_, err := b.ReadFile(ctx, "/etc/hostname")
		t.Logf("goroutines: %d before, %d now; ReadFile: %v", before, runtime.NumGoroutine(), err)
		if err == nil || !strings.Contains(err.Error(), "pings") {
			t.Fatalf("ReadFile during a ping flood: %v, want an error naming the pings", err)
		}
	}

}

// Calls a box answers with broken frames, half-closed streams, endless
// output, nothing at all, or yamux frames for streams the host never
// opened: each ends with an error (or the caller's deadline) in bounded
// time and bounded host memory, and the host process stays up.
func TestEvilAgentMisbehavingCalls(t *testing.T) {
	fileReq := func(c *evilagent.Call) bool { _, err := c.FileRequest(); return err == nil }
	cases := []struct {
		what   string
		method string
		script evilagent.Script
		raw    func(net.Conn) error
		want   string // in the error; "" for the caller's deadline
		long   bool   // skipped with -short
	}{
		{what: "frame past MaxFrame", method: "Stat", script: func(c *evilagent.Call) error {
			fileReq(c)
			return c.FrameHeader(evilagent.FrameMsg, 0xffffffff)
		}, want: "bad frame length"},
		{what: "4 MiB frame announced, never sent", method: "Stat", script: func(c *evilagent.Call) error {
			fileReq(c)
			c.FrameHeader(evilagent.FrameMsg, 4<<20)
			c.Hang()
			return nil
		}},
		{what: "stream half-closed without a result", method: "Stat", script: func(c *evilagent.Call) error {
			fileReq(c)
			return nil // the stream closes
		}, want: "without a result"},
		{what: "unknown frame kind", method: "Stat", script: func(c *evilagent.Call) error {
			fileReq(c)
			return c.Frame(9, []byte("?"))
		}, want: "unexpected frame kind"},
		{what: "garbage message", method: "Stat", script: func(c *evilagent.Call) error {
			fileReq(c)
			return c.Frame(evilagent.FrameMsg, []byte{0x12, 0xff, 0xff, 0xff, 0xff, 0x0f})
		}, want: "agent message"},
		{what: "never answering an exec", method: "Exec", script: func(c *evilagent.Call) error {
			c.Hang()
			return nil
		}, long: true},
		{what: "endless exec output, no exit", method: "Exec", script: func(c *evilagent.Call) error {
			c.Recv(new(agentpb.ExecRequest))
			c.Send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Started{Started: &agentpb.ExecStarted{Pid: 1}}})
			chunk := bytes.Repeat([]byte("y"), 256<<10)
			for {
				if err := c.Send(&agentpb.ExecEvent{Msg: &agentpb.ExecEvent_Stdout{Stdout: chunk}}); err != nil {
					return nil
				}
			}
		}},
		{what: "frames for streams the host never opened, not reading", raw: func(conn net.Conn) error {
			var b []byte
			for id := uint32(2); id < 2000; id += 2 {
				b = append(b, evilagent.YamuxHeader(evilagent.YamuxData, evilagent.YamuxSYN, id, 16)...)
				b = append(b, make([]byte, 16)...)
				b = append(b, evilagent.YamuxHeader(evilagent.YamuxWindowUpdate, evilagent.YamuxFIN, id+1, 1<<30)...)
			}
			// Data announced for a stream that does not exist, 4 GiB of
			// it, of which a little comes. The guest reads nothing until
			// all of it is written: the host's replies (resets of the
			// streams above) fill its send queue, and its writes block.
			b = append(b, evilagent.YamuxHeader(evilagent.YamuxData, 0, 999, 0xffffffff)...)
			b = append(b, make([]byte, 1<<20)...)
			conn.Write(b)
			io.Copy(io.Discard, conn)
			return nil
		}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.what, " ", "_"), func(t *testing.T) {
			if c.long && testing.Short() {
				t.Skip("waits out the host's exec slack; skipped with -short")
			}
			// A box of its own: an exec the agent does not end makes
			// the host give up on the box (Box.Unhealthy, then killed).
			// (Starting makes no call: the handshake is all it needs.)
			a := &evilagent.Agent{Raw: c.raw, Calls: map[string]evilagent.Script{}}
			if c.method != "" {
				a.Calls[c.method] = c.script
			}
			b := evilBox(t, a)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var err error
			t0 := time.Now()
			grew := heapDuring(func() {
				if c.method == "Exec" {
					_, err = b.Exec(ctx, "true", nil, airlock.ExecOptions{})
				} else {
					_, err = b.Stat(ctx, "/x")
				}
			})
			d := time.Since(t0)
			t.Logf("%s: %v after %s, heap +%d MiB", c.what, err, d.Round(time.Millisecond), grew>>20)
			if err == nil {
				t.Fatal("no error")
			}
			if c.want != "" && !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want %q in it", err, c.want)
			}
			// An exec's deadline is the agent's timeout; the host then
			// waits its grace (2 s) and slack for the agent's report.
			// Other calls end with their context: a guest that does not
			// read (a blocked write) must not hold the caller past it.
			limit := 4 * time.Second
			if c.method == "Exec" {
				limit = 2*time.Second + 2*time.Second + airlock.HostSlack + 3*time.Second
			}
			if d > limit {
				t.Errorf("took %s with a 2 s deadline (limit %s)", d, limit)
			}
			// What the host keeps is bounded (an exec's output: its head
			// and tail, DefaultMaxOutput); the heap also holds what the
			// collector has not reclaimed yet, of this process's hostile
			// agent too, which grows with load (45-55 MiB measured idle).
			// Without the bound it grows by gigabytes in these seconds.
			if grew > 96<<20 {
				t.Errorf("the host's heap grew by %d MiB", grew>>20)
			}
		})
	}
}

// The measure: a ping flood from the agent for 10 s (the host
// calling it all along, each call on a new connection that the flood cuts
// off) leaves this process within 32 MiB of its RSS before the flood.
func TestEvilAgentPingFloodRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("floods for 10 s; skipped with -short")
	}
	a := &evilagent.Agent{Raw: func(conn net.Conn) error {
		_, err := evilagent.PingFlood(conn, 10*time.Second)
		return err
	}}
	// The box is made with its real agent (a flood in Create's own start
	// would fail the create), then the hostile one answers every new
	// connection.
	var armed atomic.Bool
	drv := fake.New(os.Getenv("AIRLOCK_AGENT"))
	drv.TestAgent = func(ctx context.Context, id string, real func(context.Context) (net.Conn, error)) (net.Conn, error) {
		if !armed.Load() {
			return real(ctx)
		}
		return a.Dial(ctx, id, real)
	}
	h := fakeHarnessOn(t, drv)
	r := h.open(t, "")
	made, err := r.Create(context.Background(), airlock.BoxOptions{Image: h.image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		r.Remove(context.Background(), made.ID(), true)
	})
	made.Close() // its connection goes; the next handle dials anew
	armed.Store(true)
	b, err := r.Get(context.Background(), made.ID())
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	debug.FreeOSMemory()
	before := hostRSS(t)
	stop := peakRSS(t)
	end := time.Now().Add(10 * time.Second)
	calls, cut := 0, 0
	b.Start(context.Background())
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := b.ReadFile(ctx, "/etc/hostname")
		cancel()
		calls++
		if err != nil && strings.Contains(err.Error(), "pings") {
			cut++
		}
		time.Sleep(10 * time.Millisecond)
	}
	peak := stop()
	t.Logf("10 s of ping floods: %d calls, %d cut off naming the pings; host RSS %d MiB before, %d MiB at the peak (+%d MiB); %d goroutines now",
		calls, cut, before>>20, peak>>20, (peak-before)>>20, runtime.NumGoroutine())
	if cut == 0 {
		t.Error("no call was cut off")
	}
	if peak-before > 32<<20 {
		t.Errorf("host RSS grew by %d MiB during the flood (limit: 32 MiB)", (peak-before)>>20)
	}
}

// CopyOutTar (`airlock cp BOX:/out -`, the REST archive download) passes
// on only the tree asked for: an entry outside it ends the stream with an
// error naming it, before its header reaches the reader.
func TestEvilAgentCopyOutTarStaysInTop(t *testing.T) {
	good := tarOf(t,
		tar.Header{Name: "out", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644},
	)
	a := &evilagent.Agent{Calls: map[string]evilagent.Script{"CopyOut": copyOutScript("out", good)}}
	b := evilBox(t, a)
	ctx := context.Background()
	names := func(t *testing.T) ([]string, error) {
		rc, err := b.CopyOutTar(ctx, "/out")
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		tr := tar.NewReader(rc)
		var ns []string
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return ns, nil
			}
			if err != nil {
				return ns, err
			}
			ns = append(ns, h.Name)
		}
	}
	ns, err := names(t)
	if err != nil || strings.Join(ns, " ") != "out out/x" {
		t.Fatalf("a box's good archive: %q %v", ns, err)
	}
	for what, evil := range map[string][]byte{
		"entry outside": tarOf(t,
			tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644},
			tar.Header{Name: ".bashrc", Typeflag: tar.TypeReg, Mode: 0o644},
		),
		"dot-dot entry": tarOf(t, tar.Header{Name: "out/../.ssh/authorized_keys", Typeflag: tar.TypeReg, Mode: 0o644}),
		"hard link out": tarOf(t, tar.Header{Name: "out/k", Typeflag: tar.TypeLink, Linkname: ".bashrc"}),
		"through a symlink": tarOf(t,
			tar.Header{Name: "out/l", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			tar.Header{Name: "out/l/cron.d/x", Typeflag: tar.TypeReg, Mode: 0o644},
		),
	} {
		a.SetCall("CopyOut", copyOutScript("out", evil))
		ns, err := names(t)
		t.Logf("%s: passed on %q, then %v", what, ns, err)
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: err = %v, want a refusal", what, err)
		}
		for _, n := range ns {
			if n != "out" && !strings.HasPrefix(n, "out/") || strings.Contains(n, "..") {
				t.Errorf("%s: passed on entry %q", what, n)
			}
		}
	}
}

// A result message packed with empty file entries (2 bytes each on the
// wire, some 100 decoded) is refused, not decoded into 50 times its size.
func TestEvilAgentPackedEntries(t *testing.T) {
	packed := bytes.Repeat([]byte{0x0a, 0x00}, 2<<20-16) // 2 Mi empty FileInfos in one frame
	a := &evilagent.Agent{Calls: map[string]evilagent.Script{"Stat": func(c *evilagent.Call) error {
		if _, err := c.FileRequest(); err != nil {
			return err
		}
		// FileDown{result: FileResult{infos...}}: field 2, length-delimited.
		msg := append([]byte{0x12}, protowireLen(len(packed))...)
		return c.Frame(evilagent.FrameMsg, append(msg, packed...))
	}}}
	b := evilBox(t, a)
	var err error
	grew := heapDuring(func() { _, err = b.Stat(context.Background(), "/x") })
	t.Logf("stat: %v; heap +%d MiB", err, grew>>20)
	if err == nil || !strings.Contains(err.Error(), "entries") {
		t.Errorf("err = %v, want a refusal of the entries", err)
	}
	if grew > 48<<20 {
		t.Errorf("a 4 MiB message grew the host's heap by %d MiB", grew>>20)
	}
}

// protowireLen is n as a protobuf varint.
func protowireLen(n int) []byte {
	var b []byte
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}
