package assets

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAgentDiskHoldsInitAndMountPointsAndIsCached(t *testing.T) {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		t.Skip("erofs-utils not installed")
	}
	if _, err := exec.LookPath("fsck.erofs"); err != nil {
		t.Skip("fsck.erofs not installed: cannot read the image back")
	}
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	content := []byte("agent binary v1")
	os.WriteFile(agent, content, 0o755)
	cache := filepath.Join(dir, "cache")
	ctx := context.Background()
	p, err := AgentDisk(ctx, cache, agent)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if b, err := exec.Command("fsck.erofs", "--extract="+out, p).CombinedOutput(); err != nil {
		t.Fatalf("fsck.erofs cannot read the agent disk: %v\n%s", err, b)
	}
	got, err := os.ReadFile(filepath.Join(out, "init"))
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("/init on the agent disk: %q %v", got, err)
	}
	if fi, _ := os.Stat(filepath.Join(out, "init")); fi == nil || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("/init is not executable: %v", fi)
	}
	for _, d := range AgentDiskDirs {
		if fi, err := os.Stat(filepath.Join(out, d)); err != nil || !fi.IsDir() {
			t.Errorf("mount point /%s missing: %v", d, err)
		}
	}
	// Cached: same agent, same file, not rebuilt.
	st, _ := os.Stat(p)
	p2, err := AgentDisk(ctx, cache, agent)
	st2, _ := os.Stat(p2)
	if err != nil || p2 != p || !os.SameFile(st, st2) {
		t.Fatalf("second call: %s %v (first %s)", p2, err, p)
	}
	// Using a disk counts as use: an old one in use is kept.
	week := time.Now().Add(-8 * 24 * time.Hour)
	os.Chtimes(p, week, week)
	if _, err := AgentDisk(ctx, cache, agent); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(p); time.Since(st.ModTime()) > time.Hour {
		t.Errorf("using the agent disk did not mark it used: %v", st.ModTime())
	}
	// A new agent makes a new disk; the old one stays (another process
	// may still boot from it) until it is a week old.
	os.WriteFile(agent, []byte("agent binary v2"), 0o755)
	p3, err := AgentDisk(ctx, cache, agent)
	if err != nil || p3 == p {
		t.Fatalf("not rebuilt for a new agent: %s %v", p3, err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("recent agent disk %s removed: %v", p, err)
	}
	os.Chtimes(p, week, week)
	os.WriteFile(agent, []byte("agent binary v3"), 0o755)
	if _, err := AgentDisk(ctx, cache, agent); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("week-old agent disk %s still there: %v", p, err)
	}
	if _, err := os.Stat(p3); err != nil {
		t.Errorf("recent agent disk %s removed: %v", p3, err)
	}
	// A disk removed under a runtime is built again.
	os.Remove(p3)
	os.WriteFile(agent, []byte("agent binary v2"), 0o755)
	if p4, err := AgentDisk(ctx, cache, agent); err != nil || p4 != p3 {
		t.Fatalf("rebuild of a removed disk: %s %v", p4, err)
	} else if _, err := os.Stat(p4); err != nil {
		t.Fatal(err)
	}
}

func TestCheckAgentRejectsDynamicAndForeignBinaries(t *testing.T) {
	// The host's /bin/true is a dynamically linked executable.
	if err := CheckAgent("/bin/true"); err == nil {
		t.Error("a dynamically linked binary was accepted as the agent")
	} else if strings.Contains(err.Error(), "-o /bin/true") {
		t.Errorf("the fix would overwrite the user's file: %v", err)
	}
	txt := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(txt, []byte("#!/bin/sh\n"), 0o755)
	if err := CheckAgent(txt); err == nil {
		t.Error("a shell script was accepted as the agent")
	}
	static := filepath.Join(t.TempDir(), "static")
	cmd := exec.Command("go", "build", "-o", static, "./testdata/static")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("cannot build a static binary: %v\n%s", err, b)
	}
	if err := CheckAgent(static); err != nil {
		t.Errorf("static binary rejected: %v", err)
	}
}

func TestFileDigestIsMemoizedUntilTheFileChanges(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "agent")
	os.WriteFile(p, []byte("agent one"), 0o755)
	digest := func() string {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		d, err := fileDigest(filepath.Join(dir, "memo"), f)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	fresh := digest() // just written: hashed, not memoized
	if fresh != digest() {
		t.Fatal("digest not stable")
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(p, old, old)
	d1 := digest() // memoized now
	// Same size, same time, same inode: the memo answers (no rehash).
	os.WriteFile(p, []byte("agent two"), 0o755)
	os.Chtimes(p, old, old)
	if d := digest(); d != d1 {
		t.Fatalf("memo not used: %s vs %s", d, d1)
	}
	// A new modification time means a new hash.
	newer := old.Add(time.Minute)
	os.Chtimes(p, newer, newer)
	if d := digest(); d == d1 {
		t.Fatal("changed file still answered from the memo")
	}
}
