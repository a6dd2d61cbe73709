package snapmeta

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestWriteRead: a record written is read back as it was; its stored
// form keeps its json names.
func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "s1")
	os.Mkdir(snap, 0o700)
	m := Meta{Version: Version, Name: "s1", Box: "0123", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Image: "a",
		ImageDigest: "sha256:x", Config: []byte(`{"v":1}`), AgentVersion: "3", Driver: "qemu", StateBytes: 1, DiskBytes: 2, PausedNs: 3}
	if err := Write(snap, m); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(snap, File))
	const want = "{\n  \"v\": 1,\n  \"name\": \"s1\",\n  \"box\": \"0123\",\n  \"created\": \"2026-01-02T03:04:05Z\",\n  \"image\": \"a\",\n  \"image_digest\": \"sha256:x\",\n  \"config\": {\n    \"v\": 1\n  },\n  \"agent_version\": \"3\",\n  \"driver\": \"qemu\",\n  \"state_bytes\": 1,\n  \"disk_bytes\": 2,\n  \"paused_ns\": 3\n}"
	if string(raw) != want {
		t.Errorf("stored form:\n%s\nwant\n%s", raw, want)
	}
	got, err := Read(dir, "s1")
	m.Config = []byte("{\n    \"v\": 1\n  }") // as indented
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Errorf("read back %+v %v", got, err)
	}
	if l, err := Load(snap); err != nil || l.Name != "s1" {
		t.Errorf("load: %+v %v", l, err)
	}
}

func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(dir, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing: %v", err)
	}
	if _, err := Read(dir, "../x"); err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "want 1-64 letters") {
		t.Errorf("bad name: %v", err)
	}
	for name, content := range map[string]string{
		"big":   `{"v":1,"name":"` + strings.Repeat("x", 1<<20) + `"}`,
		"bad":   `{`,
		"newer": `{"v":2}`,
	} {
		os.MkdirAll(filepath.Join(dir, name), 0o700)
		os.WriteFile(filepath.Join(dir, name, File), []byte(content), 0o600)
		if _, err := Read(dir, name); err == nil || !strings.HasPrefix(err.Error(), "snapshot "+name+": ") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestNamesAndList(t *testing.T) {
	for _, n := range []string{"a", "A.b_c-1", strings.Repeat("x", 64)} {
		if CheckName(n) != nil {
			t.Errorf("%q refused", n)
		}
	}
	for _, n := range []string{"", ".a", "-a", "a/b", "..", strings.Repeat("x", 65)} {
		if CheckName(n) == nil {
			t.Errorf("%q accepted", n)
		}
	}
	if l, err := List(filepath.Join(t.TempDir(), "none")); l != nil || err != nil {
		t.Errorf("missing dir: %v %v", l, err)
	}
	dir := t.TempDir()
	for _, d := range []string{"s1", ".tmp", "snapshot-x123"} {
		os.Mkdir(filepath.Join(dir, d), 0o700)
	}
	os.WriteFile(filepath.Join(dir, ".s1.lock"), nil, 0o600)
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o600)
	if l, err := List(dir); err != nil || !reflect.DeepEqual(l, []string{"s1", "snapshot-x123"}) {
		t.Errorf("list: %v %v", l, err)
	}
}

// TestLock: readers share a snapshot's lock; a writer waits for them,
// until its context ends.
func TestLock(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	r1, err := Lock(ctx, dir, "s", true)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Lock(ctx, dir, "s", true)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := Lock(short, dir, "s", false); !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "lock snapshot s: ") {
		t.Fatalf("writer beside readers: %v", err)
	}
	r1.Unlock()
	r2.Unlock()
	w, err := Lock(ctx, dir, "s", false)
	if err != nil {
		t.Fatal(err)
	}
	w.Unlock()
}

func TestCheckArchived(t *testing.T) {
	if err := CheckArchived([]byte(`{"agent_version":"3","driver":"qemu","paused_ns":5}`)); err != nil {
		t.Error(err)
	}
	for _, b := range []string{`{`, `{"driver":"q\u001b[2J"}`, `{"agent_version":"` + strings.Repeat("1", 65) + `"}`, `{"paused_ns":-1}`} {
		if err := CheckArchived([]byte(b)); err == nil {
			t.Errorf("%q accepted", b)
		}
	}
}

// TestMake: a snapshot appears whole (its files and record, no temporary
// directory left) or not at all; an existing one is not touched.
func TestMake(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "snapshots")
	fill := func(tmp string) (Meta, error) {
		return Meta{Version: Version, Name: "s"}, os.WriteFile(filepath.Join(tmp, "state"), []byte("x"), 0o600)
	}
	if err := Make(ctx, dir, "s", "snapshot-", "pick another", nil, fill); err != nil {
		t.Fatal(err)
	}
	if m, err := Read(dir, "s"); err != nil || m.Name != "s" {
		t.Fatalf("made: %+v %v", m, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "s", "state")); string(b) != "x" {
		t.Error("fill's file missing")
	}
	err := Make(ctx, dir, "s", "snapshot-", "pick another", nil, func(string) (Meta, error) { t.Fatal("filled an existing snapshot"); return Meta{}, nil })
	if !errors.Is(err, ErrExists) || err.Error() != `snapshot already exists: "s" (pick another)` {
		t.Errorf("existing: %v", err)
	}
	wrap := func(err error) error { return errors.New("wrapped: " + err.Error()) }
	err = Make(ctx, dir, "t", "import-", "", wrap, func(tmp string) (Meta, error) {
		os.WriteFile(filepath.Join(tmp, "state"), nil, 0o600)
		return Meta{}, errors.New("fill failed")
	})
	if err == nil || err.Error() != "wrapped: fill failed" {
		t.Errorf("failed fill: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !reflect.DeepEqual(names, []string{".s.lock", "s"}) {
		t.Errorf("left in the snapshots directory: %v", names)
	}
}

// TestReadAllAndRemove: ReadAll leaves out what cannot be read; Remove
// waits for a holder of the snapshot and leaves no lock file.
func TestReadAllAndRemove(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b"} {
		os.MkdirAll(filepath.Join(dir, n), 0o700)
		if err := Write(filepath.Join(dir, n), Meta{Version: Version, Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(dir, "broken"), 0o700)
	ms, err := ReadAll(dir)
	if err != nil || len(ms) != 2 || ms[0].Name != "a" || ms[1].Name != "b" {
		t.Fatalf("ReadAll = %+v, %v", ms, err)
	}
	lk, err := Lock(context.Background(), dir, "a", true)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Remove(context.Background(), dir, "a") }()
	select {
	case err := <-done:
		t.Fatalf("Remove returned (%v) while the snapshot was held", err)
	case <-time.After(100 * time.Millisecond):
	}
	lk.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 { // b and broken
		t.Errorf("left in dir: %v", ents)
	}
	if err := Remove(context.Background(), dir, "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove: %v", err)
	}
}

func TestTempNameIsAValidFreshName(t *testing.T) {
	a, b := TempName("fork-0123456789ab"), TempName("fork-0123456789ab")
	if a == b || !strings.HasPrefix(a, "fork-0123456789ab-") || len(a) != len("fork-0123456789ab-")+8 || CheckName(a) != nil {
		t.Errorf("TempName: %q, %q", a, b)
	}
}
