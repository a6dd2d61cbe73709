package airlock

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// A handle to another process's AutoRemove box (`airlock ls` or `inspect`
// while `airlock run --rm` runs) leaves the box alone when it is closed:
// only the box's creator removes it.
func TestCloseLeavesAnotherProcessesAutoRemoveBox(t *testing.T) {
	home := t.TempDir()
	opts, err := Options{Home: home, ImagesDir: t.TempDir(), CacheDir: t.TempDir(), Warn: func(string) {}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r, err := openWith(opts, fake.New("/nonexistent/agent"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	owner := exec.Command("sleep", "60") // stands for the airlock run --rm client
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { owner.Process.Kill(); owner.Wait() }()
	ctx := context.Background()
	cfg := boxConfig{Options: BoxOptions{AutoRemove: true}, Meta: boxopts.Meta{OwnerPID: owner.Process.Pid, OwnerStart: vmm.StartTime(owner.Process.Pid)}}
	rec := &store.Box{ID: "0123456789ab", Image: "x", Config: encodeConfig(cfg), State: store.StateCreated, Created: time.Now()}
	if err := r.db.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	b, err := r.Get(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(ctx, rec.ID); err != nil {
		t.Fatalf("closing a handle to another process's --rm box removed it: %v", err)
	}
	// Once its creator is gone, the next Open removes it.
	owner.Process.Kill()
	owner.Wait()
	r2, err := openWith(opts, fake.New("/nonexistent/agent"))
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, err := r2.Get(ctx, rec.ID); err == nil {
		t.Fatal("an AutoRemove box outlived its creator past the next Open")
	}
}
