package volume

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func needMkfs(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("no mkfs.ext4")
	}
}

// TestStore: a volume is created sparse with its size, listed, described,
// ensured without being remade, and removed with its data.
func TestStore(t *testing.T) {
	needMkfs(t)
	ctx := context.Background()
	s := Store{Dir: filepath.Join(t.TempDir(), "volumes")}
	if l, err := s.List(); l != nil || err != nil {
		t.Fatalf("no store yet: %v %v", l, err)
	}
	i, err := s.Create(ctx, "data", 16)
	if err != nil {
		t.Fatal(err)
	}
	if i.Name != "data" || i.SizeMiB != 16 || i.Created.IsZero() {
		t.Errorf("created: %+v", i)
	}
	fi, err := os.Stat(s.Image("data"))
	if err != nil || fi.Size() != 16<<20 {
		t.Fatalf("image: %v %v", fi, err)
	}
	if got, err := s.Info("data"); err != nil || got != i {
		t.Errorf("info %+v %v, want %+v", got, err, i)
	}
	if _, err := s.Create(ctx, "data", 16); err == nil || err.Error() != "volume data already exists" {
		t.Errorf("second create: %v", err)
	}
	os.WriteFile(s.Image("data")+".mark", nil, 0o600)
	if err := s.Ensure(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if err := s.Ensure(ctx, "made"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Info("made"); got.SizeMiB != DefaultSizeMiB {
		t.Errorf("ensured volume: %+v", got)
	}
	os.Mkdir(filepath.Join(s.Dir, "not-a-volume"), 0o700)
	l, err := s.List()
	if err != nil || len(l) != 2 || l[0].Name != "data" || l[1].Name != "made" {
		t.Errorf("list: %+v %v", l, err)
	}
	if _, err := os.Stat(s.Image("data") + ".mark"); err != nil {
		t.Error("Ensure remade an existing volume")
	}
	if err := s.Remove("data"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Info("data"); err == nil || !strings.Contains(err.Error(), "no such volume") {
		t.Errorf("removed volume: %v", err)
	}
}

// TestCreateRefuses: bad names and sizes make nothing; a failed mkfs
// leaves no directory behind.
func TestCreateRefuses(t *testing.T) {
	ctx := context.Background()
	s := Store{Dir: filepath.Join(t.TempDir(), "volumes")}
	for _, n := range []string{"", "../x", ".a", "a/b", strings.Repeat("x", 65)} {
		if _, err := s.Create(ctx, n, 16); err == nil || !strings.Contains(err.Error(), "want letters, digits") {
			t.Errorf("name %q: %v", n, err)
		}
	}
	if _, err := s.Create(ctx, "small", 7); err == nil || err.Error() != "volume small: size 7 MiB: want at least 8" {
		t.Errorf("7 MiB: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Create(cctx, "cancelled", 8); err == nil || !strings.HasPrefix(err.Error(), "create volume cancelled: ") {
		t.Errorf("cancelled mkfs: %v", err)
	}
	if ents, _ := os.ReadDir(s.Dir); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}
