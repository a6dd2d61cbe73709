package airlock_test

// The hostile-agent battery: the guest agent is played by the test
// (internal/agent/evilagent) behind the whole host stack, on the fake
// driver, as root in a box could play it after killing the real agent.
// Each test names what the host must not do for such a guest.

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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
	a := &evilagent.Agent{Raw: flood}
	b := evilBoxCreated(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
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
