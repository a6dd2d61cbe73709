package server

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
)

// TestHostileClientSocketNoWindow: the API socket is owner-only from the
// moment it exists at its path, even under umask 0 (where a socket bound
// at its path and chmod'ed afterwards is 0777 until the chmod: any local
// user could connect in between and drive the API).
func TestHostileClientSocketNoWindow(t *testing.T) {
	dir, err := os.MkdirTemp("", "airlock-sock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, SocketName)
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	var first os.FileMode
	listenUnixHook = func(p string) {
		if fi, err := os.Stat(p); err == nil {
			first = fi.Mode()
		}
	}
	defer func() { listenUnixHook = nil }()
	l, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Umask(old)
	if first&os.ModeSocket == 0 || first.Perm() != 0o600 {
		t.Errorf("socket at %s first seen with mode %v, want a socket of 0600", path, first)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	c.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%s holds %d entries, want only the socket (no private directory left)", dir, len(ents))
	}
	if l.Addr().String() != path {
		t.Errorf("listener address %q, want %q", l.Addr(), path)
	}
	l.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("socket left after Close: %v", err)
	}
}

// TestHostileClientConcurrentDisks: a create in progress holds its disk
// against the free-space reserve until it is made (and listed) or fails,
// so creates at the same moment cannot each take the same free space.
func TestHostileClientConcurrentDisks(t *testing.T) {
	s := New(Config{Runtime: openRuntime(t), Policy: Policy{MaxDiskMiB: NoLimit}})
	var fs syscall.Statfs_t
	if err := syscall.Statfs(s.rt.Home(), &fs); err != nil {
		t.Fatal(err)
	}
	free := int(int64(fs.Bavail) * fs.Bsize >> 20)
	if free-3072 > 1<<20 || free < 3072+64 {
		t.Skipf("%d MiB free: outside the API's disk sizes", free)
	}
	ctx := context.Background()
	big := airlock.BoxOptions{Image: "x", DiskSizeMiB: free - 3072}
	release, err := s.checkCreate(ctx, &big)
	if err != nil {
		t.Fatalf("the first big disk: %v", err)
	}
	second := big
	if _, err := s.checkCreate(ctx, &second); err == nil || !strings.Contains(err.Error(), "--min-free-disk") {
		t.Fatalf("a second big disk while the first is being made: %v, want a refusal naming --min-free-disk", err)
	}
	// A snapshot's check (it holds the caps' lock) reads the creates in
	// progress too, without waiting on itself.
	done := make(chan error, 1)
	go func() {
		r, err := s.reserveSnapshot(ctx, airlock.BoxInfo{Options: airlock.BoxOptions{MemoryMiB: 1024, DiskSizeMiB: 1024}})
		if r != nil {
			r()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "--min-free-disk") {
			t.Errorf("a snapshot while the big create is in progress: %v, want a refusal naming --min-free-disk", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the snapshot check did not return in 10 s (deadlock on the caps' lock)")
	}
	release()
	r2, err := s.checkCreate(ctx, &second)
	if err != nil {
		t.Fatalf("the second big disk once the first create is over (it failed): %v", err)
	}
	r2()
}
