package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func save(t *testing.T) func(string) (Meta, error) {
	return func(tmp string) (Meta, error) {
		return Meta{StateBytes: 1}, os.WriteFile(filepath.Join(tmp, "state"), []byte("x"), 0o600)
	}
}

func parents(t *testing.T, tr Tree) map[string]string {
	t.Helper()
	list, err := tr.List()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range list {
		out[m.Name] = m.Parent
	}
	return out
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "A-1", "step_2.ok", strings.Repeat("x", MaxName)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", ".hidden", "-a", "a/b", "..", "a b", "ä", strings.Repeat("x", MaxName+1), "a\n"} {
		if err := CheckName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestTreeBranches: a checkpoint's parent is the last one taken or rolled
// back to, so one taken after a rollback starts a branch.
func TestTreeBranches(t *testing.T) {
	tr := Of(t.TempDir())
	for _, n := range []string{"a", "b"} {
		if _, err := tr.Create(n, save(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.RolledBack("a", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Create("c", save(t)); err != nil {
		t.Fatal(err)
	}
	got := parents(t, tr)
	want := map[string]string{"a": "", "b": "a", "c": "a"}
	for n, p := range want {
		if got[n] != p {
			t.Errorf("parent of %s = %q, want %q (all: %v)", n, got[n], p, got)
		}
	}
	if h := tr.Head(); h != "c" {
		t.Errorf("head %q, want c", h)
	}
	if to, at := tr.LastRollback(); to != "a" || at.IsZero() {
		t.Errorf("last rollback %q at %v", to, at)
	}
	if _, err := tr.Create("b", save(t)); !errors.Is(err, ErrExists) {
		t.Errorf("second b: %v, want ErrExists", err)
	}
	if _, err := tr.Get("zz"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get zz: %v", err)
	}
	lines := strings.Join(Draw(nodes(t, tr)), "\n")
	if lines != "a\n├─ b\n└─ c" {
		t.Errorf("drawn:\n%s", lines)
	}
}

func nodes(t *testing.T, tr Tree) []Node {
	list, _ := tr.List()
	var out []Node
	for _, m := range list {
		out = append(out, Node{m.Name, m.Parent})
	}
	return out
}

// TestRemoveReparents: removing a checkpoint others descend from is safe:
// its children get its parent, and a removed head gives way to its parent.
func TestRemoveReparents(t *testing.T) {
	tr := Of(t.TempDir())
	for _, n := range []string{"a", "b", "c"} {
		if _, err := tr.Create(n, save(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Remove("b"); err != nil {
		t.Fatal(err)
	}
	if got := parents(t, tr); len(got) != 2 || got["c"] != "a" {
		t.Errorf("after removing b: %v, want c's parent a", got)
	}
	if err := tr.Remove("c"); err != nil {
		t.Fatal(err)
	}
	if h := tr.Head(); h != "a" {
		t.Errorf("head %q after removing the head c, want a", h)
	}
	if err := tr.Remove("c"); !errors.Is(err, ErrNotFound) {
		t.Errorf("remove c again: %v", err)
	}
	if _, err := tr.Create("d", save(t)); err != nil {
		t.Fatal(err)
	}
	if got := parents(t, tr); got["d"] != "a" {
		t.Errorf("d's parent %q, want a", got["d"])
	}
}

// TestCreateFailsClean: a failed save leaves no checkpoint and no
// temporary directory, and the head stays.
func TestCreateFailsClean(t *testing.T) {
	dir := t.TempDir()
	tr := Of(dir)
	if _, err := tr.Create("a", save(t)); err != nil {
		t.Fatal(err)
	}
	_, err := tr.Create("b", func(tmp string) (Meta, error) { return Meta{}, errors.New("disk full") })
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("err %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "checkpoints"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left %s", e.Name())
		}
	}
	if list, _ := tr.List(); len(list) != 1 || tr.Head() != "a" {
		t.Errorf("list %v head %q", list, tr.Head())
	}
	if _, err := tr.Create("../x", save(t)); err == nil {
		t.Error("bad name accepted")
	}
}

func TestCheckpointCap(t *testing.T) {
	tr := Of(t.TempDir())
	for i := range MaxCheckpoints {
		if _, err := tr.Create("c"+strings.Repeat("x", i), save(t)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tr.Create("one-more", save(t)); err == nil || !strings.Contains(err.Error(), "remove one") {
		t.Errorf("past the cap: %v", err)
	}
}

// TestHostileRecords: records that are too large, malformed, name
// another checkpoint or form a cycle are left out or drawn once.
func TestHostileRecords(t *testing.T) {
	dir := t.TempDir()
	tr := Of(dir)
	if _, err := tr.Create("a", save(t)); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"big":   `{"v":1,"name":"big","parent":"` + strings.Repeat("x", maxFile) + `"}`,
		"bad":   `{`,
		"other": `{"v":1,"name":"a"}`,
	} {
		os.MkdirAll(tr.Path(name), 0o700)
		os.WriteFile(filepath.Join(tr.Path(name), metaFile), []byte(body), 0o600)
	}
	if got := parents(t, tr); len(got) != 1 {
		t.Errorf("listed %v, want only a", got)
	}
	got := Draw([]Node{{"x", "y"}, {"y", "x"}})
	if len(got) != 2 {
		t.Errorf("cycle drawn as %q", got)
	}
}

// TestSwapLayer: the new layer replaces the old; a failed fill leaves the
// old one in place.
func TestSwapLayer(t *testing.T) {
	p := filepath.Join(t.TempDir(), "rw.ext4")
	os.WriteFile(p, []byte("old"), 0o600)
	err := SwapLayer(p, func() error {
		os.WriteFile(p, []byte("half"), 0o600)
		return errors.New("copy failed")
	})
	if got, _ := os.ReadFile(p); err == nil || string(got) != "old" {
		t.Fatalf("after a failed fill: %q %v", got, err)
	}
	if err := SwapLayer(p, func() error { return os.WriteFile(p, []byte("new"), 0o600) }); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); string(got) != "new" {
		t.Fatalf("after the swap: %q", got)
	}
	if _, err := os.Stat(p + ".old"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old layer stays: %v", err)
	}
}

// TestEnded: an error of a call that a later rollback ended says so; one
// from before the rollback, or no error, is left as it is.
func TestEnded(t *testing.T) {
	tr := Of(t.TempDir())
	cut := errors.New("connection lost")
	t0 := time.Now()
	if err := tr.Ended("b1", t0, cut); err != cut {
		t.Fatalf("no rollback: %v", err)
	}
	if err := tr.RolledBack("A", time.Now().Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Ended("b1", t0, cut); !errors.Is(err, ErrRolledBack) || !strings.Contains(err.Error(), "checkpoint A") {
		t.Errorf("after a rollback: %v", err)
	}
	if err := tr.Ended("b1", time.Now().Add(time.Hour), cut); err != cut {
		t.Errorf("a call begun after the rollback: %v", err)
	}
	if err := tr.Ended("b1", t0, nil); err != nil {
		t.Errorf("no error: %v", err)
	}
}
