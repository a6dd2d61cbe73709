package qemu

import (
	"os"
	"path/filepath"
	"testing"
)

// The TSC cache lives in the user's cache dir and a symlink planted at its
// name is replaced, not written through.
func TestTSCCacheNeverFollowsSymlinks(t *testing.T) {
	cache := t.TempDir()
	p := tscCachePath(cache)
	if filepath.Dir(p) != cache {
		t.Fatalf("cache path %s not under %s", p, cache)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("keep"), 0o644)
	os.Symlink(victim, p)
	if v := readTSCCache(p); v != 0 {
		t.Fatalf("read %d through a symlink", v)
	}
	writeTSCCache(p, 2999999)
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("written through the symlink: victim holds %q", b)
	}
	if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("cache file: %v %v", fi, err)
	}
	if v := readTSCCache(p); v != 2999999 {
		t.Fatalf("read back %d", v)
	}
}
