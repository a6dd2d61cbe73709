package airlock_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// TestStateV0Migrates opens a state.db written before box records had a
// schema version (testdata/README.md) and starts its boxes.
func TestStateV0Migrates(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	raw, err := os.ReadFile("testdata/state-v0.db")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "state.db"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// The old home had a directory per box (the fake driver needs nothing in it).
	for _, id := range []string{"a1b2c3d4e5f6", "0a0b0c0d0e0f", "ffeeddccbbaa"} {
		os.MkdirAll(filepath.Join(home, "boxes", id), 0o700)
	}
	images := t.TempDir()
	s, err := image.Open(images)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteImage(ctx, "fixture/app:v1", imagetest.Image(t, []string{"sh"}), "test image", nil); err != nil {
		t.Fatal(err)
	}
	r, err := airlock.OpenWithDriver(airlock.Options{Home: home, ImagesDir: images, CacheDir: t.TempDir(), Warn: func(string) {}},
		fake.New(os.Getenv("AIRLOCK_AGENT")))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	list, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Fatalf("got %d boxes, want 3: %+v", len(list), list)
	}
	byID := map[string]airlock.BoxInfo{}
	for _, bi := range list {
		byID[bi.ID] = bi
	}
	web, anon, crashed := byID["a1b2c3d4e5f6"], byID["0a0b0c0d0e0f"], byID["ffeeddccbbaa"]
	if web.Name != "web" || web.State != "stopped" || web.Options.Network != airlock.NetworkPublic ||
		web.Options.User != "nobody" || web.Options.WorkingDir != "/tmp" || len(web.Options.Env) != 1 {
		t.Errorf("web: %+v", web)
	}
	if anon.Name != "" || anon.State != "created" || anon.Options.Network != airlock.NetworkNone ||
		anon.Options.CPUs != 2 || anon.Options.MemoryMiB != 256 {
		t.Errorf("unnamed box: %+v", anon)
	}
	if crashed.Name != "crashed" || crashed.State != "stopped" || crashed.PID != 0 {
		t.Errorf("box recorded running under a gone pid: %+v", crashed)
	}

	// Records from before lifetimes: boxes without limits, which no reap
	// pass removes.
	for _, bi := range list {
		o := bi.Options
		if o.TTL != 0 || o.IdleTimeout != 0 || o.Lease != 0 || !bi.ExpiresAt.IsZero() || !bi.LeaseUntil.IsZero() || !bi.IdleDeadline.IsZero() {
			t.Errorf("old box %s has lifetime limits: %+v", bi.ID, bi)
		}
	}
	if reaped := r.Reap(ctx); len(reaped) != 0 {
		t.Errorf("old boxes reaped: %+v", reaped)
	}

	for _, ref := range []string{"web", "0a0b0c0d0e0f", "crashed"} {
		b, err := r.Get(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatalf("start %s: %v", ref, err)
		}
		defer b.Remove(ctx, true)
	}
	b, _ := r.Get(ctx, "web")
	res, err := b.Exec(ctx, "sh", []string{"-c", `echo "$BOXVAR $FROMIMAGE"; id -un; pwd`}, airlock.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "kept 1\nnobody\n/tmp\n"; string(res.Stdout) != want {
		t.Errorf("web's exec: %q (stderr %q), want %q", res.Stdout, res.Stderr, want)
	}

	// The database is at the current schema, records rewritten with the
	// new network names.
	db, err := sql.Open("sqlite", filepath.Join(home, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil || v != 1 {
		t.Errorf("user_version %d %v, want 1", v, err)
	}
	var cfg string
	if err := db.QueryRow(`SELECT config FROM boxes WHERE id = '0a0b0c0d0e0f'`).Scan(&cfg); err != nil {
		t.Fatal(err)
	}
	var rec struct {
		V       int    `json:"v"`
		Network string `json:"network"`
	}
	if err := json.Unmarshal([]byte(cfg), &rec); err != nil || rec.V != 1 || rec.Network != "none" {
		t.Errorf("stored record %s: %+v %v", cfg, rec, err)
	}
}
