package airlock_test

import (
	"context"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
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
	res, err := b.Exec(ctx, "sh", []string{"-c", "setsid /evilguest -delay 1s >/evilguest.log 2>&1 </dev/null &"}, airlock.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start evilguest: %v %+v", err, res)
	}
	home := t.TempDir()
	os.Mkdir(filepath.Join(home, ".ssh"), 0o700)
	os.WriteFile(filepath.Join(home, ".ssh", "authorized_keys"), []byte("mine"), 0o600)
	os.WriteFile(filepath.Join(home, ".bashrc"), []byte("mine"), 0o644)
	// The host's session with the stopped agent ends by keepalive (about
	// 10 s); the next call connects again, to evilguest.
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = b.CopyOut(cctx, "/out", home)
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
	_, err = b.ReadDir(ctx, "/")
	t.Logf("readdir: %v", err)
	if err == nil || !strings.Contains(err.Error(), "name of") {
		t.Errorf("a listing of 4 MiB names: %v, want a refusal", err)
	}
}
