//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// A user resolved once is answered from the cache while /etc/passwd and
// /etc/group stay the same, and resolved again from the files once either
// changes: an exec never runs as a user the box no longer has.
func TestExecUserFollowsPasswdChanges(t *testing.T) {
	root := t.TempDir()
	etc := filepath.Join(root, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("passwd", "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n")
	write("group", "root:x:0:\nalice:x:1000:\nstaff:x:50:alice\n")
	check := func(spec string, uid, gid int, home string, sgids int) {
		t.Helper()
		u, err := execUser(root, spec)
		if err != nil {
			t.Fatalf("execUser(%q): %v", spec, err)
		}
		if u.Uid != uid || u.Gid != gid || u.Home != home || len(u.Sgids) != sgids {
			t.Fatalf("execUser(%q) = uid %d gid %d home %s groups %v; want uid %d gid %d home %s, %d groups", spec, u.Uid, u.Gid, u.Home, u.Sgids, uid, gid, home, sgids)
		}
		u.Sgids = append(u.Sgids, 99) // the caller's copy: must not reach the cache
	}
	check("alice", 1000, 1000, "/home/alice", 1)
	check("alice", 1000, 1000, "/home/alice", 1)
	check("", 0, 0, "/root", 0)
	if _, err := execUser(root, "bob"); err == nil {
		t.Fatal("execUser(bob) found a user passwd does not have")
	}

	write("passwd", "root:x:0:0:root:/root:/bin/sh\nalice:x:1001:1000::/srv/alice:/bin/sh\nbob:x:1002:1000::/home/bob:/bin/sh\n")
	check("alice", 1001, 1000, "/srv/alice", 1)
	check("bob", 1002, 1000, "/home/bob", 0)

	write("group", "root:x:0:\nalice:x:1000:\nstaff:x:50:alice,bob\n")
	check("bob", 1002, 1000, "/home/bob", 1)

	if err := os.Remove(filepath.Join(etc, "passwd")); err != nil {
		t.Fatal(err)
	}
	if _, err := execUser(root, "bob"); err == nil {
		t.Fatal("execUser(bob) found a user after /etc/passwd was removed")
	}
}
