package boxarchive

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/checkpoint"
)

func TestTreeOrderPutsParentsFirst(t *testing.T) {
	list := []checkpoint.Meta{{Name: "c", Parent: "b"}, {Name: "b", Parent: "a"}, {Name: "a"}, {Name: "x", Parent: "gone"}}
	var got []string
	for _, m := range treeOrder(list) {
		got = append(got, m.Name+"<"+m.Parent)
	}
	if s := strings.Join(got, " "); s != "a< b<a c<b x<" {
		t.Errorf("treeOrder = %s; want parents first, an orphan made a root", s)
	}
}

// TestCheckpointsExportAndAdopt writes a box's checkpoints whole as an
// export does and gives them to another box as an import does: the
// tree, the files and the current checkpoint arrive.
func TestCheckpointsExportAndAdopt(t *testing.T) {
	src := checkpoint.Of(t.TempDir())
	for _, name := range []string{"a", "b"} {
		if _, err := src.Create(name, func(tmp string) (checkpoint.Meta, error) {
			return checkpoint.Meta{StateBytes: 5}, os.WriteFile(filepath.Join(tmp, StateFile), []byte("state "+name), 0o600)
		}); err != nil {
			t.Fatal(err)
		}
	}
	var sealed []string
	seal := func(ctx context.Context, dir string) error { sealed = append(sealed, filepath.Base(dir)); return nil }
	srcs, head, drop, err := WholeCheckpoints(context.Background(), src, t.TempDir(), seal)
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	if head != "b" || len(srcs) != 2 || srcs[0].Name != "a" || srcs[1].Parent != "a" || strings.Join(sealed, " ") != "a b" {
		t.Fatalf("WholeCheckpoints = %+v, head %q, sealed %v", srcs, head, sealed)
	}
	// The archive's layout as Extract writes it.
	dir := t.TempDir()
	m := &Manifest{CheckpointHead: head}
	for i, s := range srcs {
		m.Checkpoints = append(m.Checkpoints, s.Checkpoint)
		to := CheckpointDir(dir, i)
		if err := os.MkdirAll(to, 0o700); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(s.Dir, StateFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, StateFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	box := t.TempDir()
	if err := AdoptCheckpoints(box, dir, m); err != nil {
		t.Fatal(err)
	}
	dst := checkpoint.Of(box)
	b, err := dst.Get("b")
	if err != nil || b.Parent != "a" || dst.Head() != "b" {
		t.Fatalf("adopted b = %+v, %v; head %q", b, err, dst.Head())
	}
	if got, err := os.ReadFile(filepath.Join(dst.Path("a"), StateFile)); err != nil || string(got) != "state a" {
		t.Errorf("adopted a's state %q, %v", got, err)
	}
	drop()
	if _, err := os.Stat(srcs[0].Dir); !os.IsNotExist(err) {
		t.Errorf("drop left %s: %v", srcs[0].Dir, err)
	}
	// No checkpoints: nothing to adopt.
	if err := AdoptCheckpoints(t.TempDir(), dir, &Manifest{}); err != nil {
		t.Error(err)
	}
}
