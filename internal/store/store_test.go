package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestRecordsSharedBetweenHandles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	a, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(path, nil) // a second process would open it the same way
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	rec := &Box{ID: "0123456789ab", Name: "web", Image: "python:slim", ImageDigest: "sha256:x", Config: []byte(`{}`), State: StateCreated, Created: time.Now()}
	if err := a.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := a.Insert(ctx, &Box{ID: "ffff", Name: "web", Config: []byte(`{}`), State: StateCreated}); !errors.Is(err, ErrNameInUse) {
		t.Fatalf("duplicate name: %v", err)
	}
	for _, ref := range []string{"0123456789ab", "web", "0123"} {
		got, err := b.Get(ctx, ref)
		if err != nil || got.ID != rec.ID {
			t.Fatalf("get %q: %+v %v", ref, got, err)
		}
	}
	if _, err := b.Get(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if err := b.SetRunning(ctx, rec.ID, 42, 7, time.Now()); err != nil {
		t.Fatal(err)
	}
	got, _ := a.Get(ctx, "web")
	if got.State != StateRunning || got.PID != 42 || got.PIDStart != 7 {
		t.Fatalf("after SetRunning: %+v", got)
	}
	// Concurrent writers do not fail with "database is locked".
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			db := a
			if i%2 == 1 {
				db = b
			}
			if i%3 == 0 {
				errs <- db.SetStopped(ctx, rec.ID)
			} else {
				errs <- db.SetRunning(ctx, rec.ID, i, uint64(i), time.Now())
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Delete(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if l, _ := b.List(ctx); len(l) != 0 {
		t.Fatalf("list after delete: %+v", l)
	}
}

func TestGetByIDPrefix(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	for _, id := range []string{"abc123", "abd456"} {
		if err := db.Insert(ctx, &Box{ID: id, Config: []byte(`{}`), State: StateCreated}); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := db.Get(ctx, "abc"); err != nil || b.ID != "abc123" {
		t.Errorf("unique prefix: %+v %v", b, err)
	}
	if _, err := db.Get(ctx, "ab"); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("shared prefix: %v", err)
	}
	// SQL LIKE wildcards are plain characters in a prefix.
	for _, ref := range []string{"_", "%", "a_c", "ab%", "ABC"} {
		if b, err := db.Get(ctx, ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%q) = %+v, %v; want not found", ref, b, err)
		}
	}
}

func TestMigrations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	// A version-0 database: the table, no user_version.
	d, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.db.Exec(`PRAGMA user_version = 0`); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := d.Insert(ctx, &Box{ID: id, Config: []byte(`old-` + id), State: StateCreated, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	d.Close()

	// A failing upgrade leaves the database as it was.
	if _, err := Open(path, func(b []byte) ([]byte, error) { return nil, errors.New("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("failing upgrade: %v", err)
	}
	calls := 0
	up := func(b []byte) ([]byte, error) {
		calls++
		return []byte("new-" + strings.TrimPrefix(string(b), "old-")), nil
	}
	d, err = Open(path, up)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if b, err := d.Get(ctx, id); err != nil || string(b.Config) != "new-"+id {
			t.Fatalf("%s after migration: %+v %v", id, b, err)
		}
	}
	var v int
	d.db.QueryRow(`PRAGMA user_version`).Scan(&v)
	if v != SchemaVersion || calls != 2 {
		t.Fatalf("user_version %d, %d upgrade calls", v, calls)
	}
	d.Close()
	if d, err = Open(path, up); err != nil || calls != 2 {
		t.Fatalf("reopen: %v, %d upgrade calls", err, calls)
	}
	d.db.Exec(`PRAGMA user_version = 99`)
	d.Close()
	if _, err := Open(path, up); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("newer schema: %v", err)
	}
}

// A full filesystem fails the write with an error that says so; the
// database stays readable and takes writes again once there is room.
func TestFullFilesystem(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=256k"); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	d, err := Open(filepath.Join(dir, "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	if err := d.Insert(ctx, &Box{ID: "keep", Config: []byte(`{}`), State: StateCreated, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	big := []byte(`"` + strings.Repeat("x", 32<<10) + `"`)
	var ferr error
	for i := 0; i < 64 && ferr == nil; i++ {
		ferr = d.Insert(ctx, &Box{ID: fmt.Sprint("b", i), Config: big, State: StateCreated, Created: time.Now()})
	}
	if ferr == nil || !strings.Contains(ferr.Error(), "is full") {
		t.Fatalf("insert on a full filesystem: %v", ferr)
	}
	if b, err := d.Get(ctx, "keep"); err != nil || b.ID != "keep" {
		t.Fatalf("read after a failed write: %+v %v", b, err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, "size=8m"); err != nil {
		t.Fatal(err)
	}
	if err := d.Insert(ctx, &Box{ID: "later", Config: []byte(`{}`), State: StateCreated, Created: time.Now()}); err != nil {
		t.Fatalf("insert once there is room: %v", err)
	}
}
