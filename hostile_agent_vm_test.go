package airlock_test

import (
	"context"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/boxvm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// In a real box, root takes the agent's place: it stops airlock-agent
// (PID 1, every thread, with ptrace: killing it would panic the kernel),
// takes its virtio-serial ports (pidfd_getfd) and speaks the protocol on
// them (internal/agent/evilagent/evilguest). The host's next connection
// completes the handshake with it (the handshake proves the host, never
// the guest), and its answers are the attacks: a copy-out archive holding
// .bashrc and .ssh/authorized_keys beside the tree asked for, a listing of
// 4 MiB names. The host writes nothing outside the destination and
// refuses the listing.
func TestHostileGuestTakesOverAgent(t *testing.T) {
	b := startEvilGuest(t)
	ctx := context.Background()
	home := t.TempDir()
	os.Mkdir(filepath.Join(home, ".ssh"), 0o700)
	os.WriteFile(filepath.Join(home, ".ssh", "authorized_keys"), []byte("mine"), 0o600)
	os.WriteFile(filepath.Join(home, ".bashrc"), []byte("mine"), 0o644)
	// The host's session with the stopped agent ends by keepalive (its
	// QEMU runs: boxvm.SlowAgentGrace, 24 s); the next call connects
	// again, to evilguest.
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := b.CopyOut(cctx, "/out", home)
		cancel()
		t.Logf("copy-out: %v", err)
		if err != nil && strings.Contains(err.Error(), "refused") {
			break
		}
		if err == nil {
			t.Fatal("copy-out from the hostile guest succeeded")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer from evilguest: %v", err)
		}
		time.Sleep(time.Second)
	}
	for _, f := range []string{".bashrc", ".ssh/authorized_keys"} {
		if b, _ := os.ReadFile(filepath.Join(home, f)); string(b) != "mine" {
			t.Errorf("%s replaced: %q", f, b)
		}
	}
	if fi, _ := os.Stat(filepath.Join(home, ".ssh")); fi.Mode().Perm() != 0o700 {
		t.Errorf("~/.ssh chmodded to %v", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(home); len(ents) != 2 {
		t.Errorf("left %d entries in the destination, want 2", len(ents))
	}
	_, err := b.ReadDir(ctx, "/")
	t.Logf("readdir: %v", err)
	if err == nil || !strings.Contains(err.Error(), "name of") {
		t.Errorf("a listing of 4 MiB names: %v, want a refusal", err)
	}
}

// startEvilGuest boots a box and starts evilguest in it, detached, with
// args; it takes over the agent about a second later.
func startEvilGuest(t *testing.T, args ...string) *airlock.Box {
	t.Helper()
	vmtest.Require(t)
	if qemu.VsockAvailable() {
		// The host dials vsock first there, which evilguest does not take.
		t.Skip("this host has vhost-vsock: the test covers the virtio-serial ports")
	}
	bin := filepath.Join(t.TempDir(), "evilguest")
	_, file, _, _ := runtime.Caller(0)
	build := osexec.Command("go", "build", "-trimpath", "-o", bin, "./internal/agent/evilagent/evilguest")
	build.Dir = filepath.Dir(file)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build evilguest: %v\n%s", err, out)
	}
	ctx := context.Background()
	r := openRuntime(t, "")
	b, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.CopyIn(ctx, bin, "/evilguest"); err != nil {
		t.Fatal(err)
	}
	cmd := "setsid /evilguest -delay 1s " + strings.Join(args, " ") + " >/evilguest.log 2>&1 </dev/null &"
	res, err := b.Exec(ctx, "sh", []string{"-c", cmd}, airlock.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start evilguest: %v %+v", err, res)
	}
	return b
}

// The measure on a real box: root floods the host's agent
// connections with yamux pings for 10 s, forging the replies to the
// host's keepalive, while the host keeps calling; each connection is cut
// off and the host's RSS stays within 32 MiB of where it was.
func TestHostileGuestPingFlood(t *testing.T) {
	b := startEvilGuest(t, "-flood", "10s")
	time.Sleep(2 * time.Second) // evilguest has the ports
	runtime.GC()
	debug.FreeOSMemory()
	before := hostRSS(t)
	stop := peakRSS(t)
	calls, cut := 0, 0
	var last error
	// The session with the stopped agent ends by keepalive first (its
	// QEMU runs: boxvm.SlowAgentGrace); then each connection floods.
	for end := time.Now().Add(boxvm.SlowAgentGrace + 12*time.Second); time.Now().Before(end) && cut < 3; {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := b.ReadFile(ctx, "/etc/hostname")
		cancel()
		calls++
		if err != nil && strings.Contains(err.Error(), "pings") {
			cut++
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	peak := stop()
	t.Logf("%d calls, %d cut off naming the pings (last: %v); host RSS %d MiB before, %d MiB at the peak (+%d MiB)",
		calls, cut, last, before>>20, peak>>20, (peak-before)>>20)
	if cut == 0 {
		t.Error("no connection was cut off for its pings")
	}
	if peak-before > 32<<20 {
		t.Errorf("host RSS grew by %d MiB during the flood (limit: 32 MiB)", (peak-before)>>20)
	}
}
