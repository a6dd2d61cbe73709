package confine

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/confine/jailstage"
)

// The box uid range comes from Options.UIDRange / AIRLOCK_UID_RANGE when
// set, and a bad one is refused saying what is wanted.
func TestBoxUIDRangeFromSetting(t *testing.T) {
	r, err := BoxUIDRange("200000:65536")
	if err != nil || r != (UIDRange{Start: 200000, Count: 65536, Source: "AIRLOCK_UID_RANGE"}) {
		t.Fatalf("BoxUIDRange(200000:65536) = %+v, %v", r, err)
	}
	for _, bad := range []string{"200000", "x:1", "200000:0", "10:100", "4294967000:1000", "-5:10"} {
		if _, err := BoxUIDRange(bad); err == nil || !strings.Contains(err.Error(), "want START:COUNT") {
			t.Errorf("BoxUIDRange(%q) = %v, want an error naming START:COUNT", bad, err)
		}
	}
}

// The /etc/subuid entry named airlock is the range; a file without one
// says how to reserve it.
func TestSubidRange(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "subuid")
	os.WriteFile(f, []byte("alice:100000:65536\nairlock:1879048192:65536\n"), 0o644)
	r, err := subidRange(f, UIDRangeOwner)
	if err != nil || r.Start != 1879048192 || r.Count != 65536 {
		t.Fatalf("subidRange = %+v, %v", r, err)
	}
	os.WriteFile(f, []byte("alice:100000:65536\n"), 0o644)
	if _, err := subidRange(f, UIDRangeOwner); err == nil || !strings.Contains(err.Error(), "hack/setup.sh") {
		t.Errorf("no airlock entry: %v, want an error saying how to add one", err)
	}
	if _, err := subidRange(filepath.Join(dir, "missing"), UIDRangeOwner); err == nil || !strings.Contains(err.Error(), "AIRLOCK_UID_RANGE") {
		t.Errorf("no file: %v", err)
	}
}

// Every id on a status file's Uid: and Gid: lines counts as in use (real,
// effective, saved, file system).
func TestStatusIDs(t *testing.T) {
	f := filepath.Join(t.TempDir(), "status")
	os.WriteFile(f, []byte("Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t2000\t2001\t2002\t2003\nGroups:\t5000\n"), 0o644)
	got := statusIDs(f, make([]byte, 4096))
	want := []int{1000, 1001, 1002, 1003, 2000, 2001, 2002, 2003}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("statusIDs = %v, want %v (supplementary groups are not box ids)", got, want)
	}
	if statusIDs(filepath.Join(t.TempDir(), "gone"), make([]byte, 64)) != nil {
		t.Error("a process that is gone has ids")
	}
}

// AllocUID hands out each uid of a range once while its claim holds, then
// says the range is used up.
func TestAllocUIDClaims(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (/run/airlock/uids)")
	}
	start := 0x6c000000 + rand.IntN(1<<20)*4
	r := UIDRange{Start: start, Count: 3}
	var got []int
	t.Cleanup(func() {
		for _, u := range got {
			os.Remove(filepath.Join(uidClaimDir, strconv.Itoa(u)))
		}
	})
	for range 3 {
		u, err := AllocUID(r)
		if err != nil {
			t.Fatal(err)
		}
		if u < start || u >= start+3 || slices.Contains(got, u) {
			t.Fatalf("AllocUID gave %d after %v, want a new one of %d-%d", u, got, start, start+2)
		}
		got = append(got, u)
	}
	if u, err := AllocUID(r); err == nil || !strings.Contains(err.Error(), "all 3 uids") {
		got = append(got, u)
		t.Errorf("fourth AllocUID of 3 = %d, %v; want the range used up", u, err)
	}
}

// A box cgroup goes to v1 hierarchies where the controller has one (under
// this process's own cgroup there), to the v2 root's airlock group
// otherwise, and a controller the host has nowhere is named missing.
func TestCgroupPlan(t *testing.T) {
	s := CgroupSupport{V2: "/sys/fs/cgroup/unified", V2Controllers: []string{"pids", "cpu"}, V1: map[string]string{"memory": "/sys/fs/cgroup/memory"}}
	v1, v2, missing := s.plan("box-0123")
	if want := filepath.Join("/sys/fs/cgroup/memory", ownCgroup("memory"), "airlock", "box-0123"); v1["memory"] != want || len(v1) != 1 {
		t.Errorf("v1 = %v, want memory at %s", v1, want)
	}
	if v2 != "/sys/fs/cgroup/unified/airlock/box-0123" || len(missing) != 0 {
		t.Errorf("v2 = %q, missing %v", v2, missing)
	}
	have, missing := s.Controllers()
	if !reflect.DeepEqual(have, []string{"memory (v1)", "pids (v2)", "cpu (v2)"}) || len(missing) != 0 {
		t.Errorf("Controllers = %v, missing %v", have, missing)
	}
	s = CgroupSupport{V2: "/sys/fs/cgroup", V2Controllers: []string{"memory"}, V1: map[string]string{}}
	if _, _, missing := s.plan("x"); !reflect.DeepEqual(missing, []string{"pids", "cpu"}) {
		t.Errorf("missing = %v, want pids and cpu", missing)
	}
}

// A cgroup of the box's QEMU holds its limits, in the files of the
// hierarchy it is in, and Remove takes it away.
func TestNewCgroupLimits(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root")
	}
	name := "test-limits-" + filepath.Base(t.TempDir())
	g, err := NewCgroup(name, Limits{MemoryBytes: 300 << 20, Pids: 77, CPUs: 0.5})
	if err != nil {
		t.Skipf("no cgroups here: %v", err)
	}
	defer g.Remove()
	want := map[string]string{
		"memory.limit_in_bytes": strconv.Itoa(300 << 20), "memory.max": strconv.Itoa(300 << 20),
		"pids.max": "77", "cpu.cfs_quota_us": "50000", "cpu.max": "50000 100000",
	}
	seen := 0
	for _, d := range g.Dirs {
		if filepath.Base(d) != name || filepath.Base(filepath.Dir(d)) != "airlock" {
			t.Errorf("cgroup directory %s, want .../airlock/%s", d, name)
		}
		for f, v := range want {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				continue
			}
			seen++
			if strings.TrimSpace(string(b)) != v {
				t.Errorf("%s/%s = %q, want %q", d, f, strings.TrimSpace(string(b)), v)
			}
		}
	}
	if seen == 0 {
		t.Errorf("no limit file in %v", g.Dirs)
	}
	file := filepath.Join(t.TempDir(), "cgroup")
	if err := SaveCgroup(file, g); err != nil {
		t.Fatal(err)
	}
	if err := RemoveSavedCgroup(file); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s is still there after RemoveSavedCgroup", d)
		}
	}
	if _, err := os.Stat(file); err == nil {
		t.Error("the saved cgroup's file is still there")
	}
}

// A saved cgroup file is the box directory's, which a box's processes
// could reach: RemoveSavedCgroup removes only directories in an airlock
// group of a cgroup hierarchy, whatever the file names.
func TestHostileGuestRemoveSavedCgroupOnlyCgroups(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "airlock", "victim")
	if err := os.MkdirAll(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "cgroup")
	os.WriteFile(file, []byte(victim+"\n/sys/fs/cgroup/../../.."+dir+"/airlock/victim\n"), 0o600)
	RemoveSavedCgroup(file)
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("RemoveSavedCgroup removed %s, which is no cgroup: %v", victim, err)
	}
}

// The stage's descriptors: the caller's files first (/dev/null for a nil
// one), kept across the exec; then the inherited files and the lease,
// each named by its number; groups are set (empty) for a jail.
func TestStageSpecDescriptors(t *testing.T) {
	a, _ := os.Open(os.DevNull)
	defer a.Close()
	b, _ := os.Open(os.DevNull)
	defer b.Close()
	s := Spec{Name: "test", Path: "/bin/true", Root: filepath.Join(t.TempDir(), "jail"),
		Keep: []*os.File{nil, a, nil}, Inherit: []*os.File{b, a}, DieWithCaller: true,
		Write: []WriteFile{{Path: "/x", Data: []byte("y"), Mode: 0o444}}}
	spec, extra, closers, err := stageSpec(s)
	for _, f := range closers {
		defer f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(spec.Keep, []int{FDFirst, FDFirst + 1, FDFirst + 2}) {
		t.Errorf("Keep = %v", spec.Keep)
	}
	if !reflect.DeepEqual(spec.Inherit, []int{FDFirst + 3, FDFirst + 4}) || spec.Lease != FDFirst+5 {
		t.Errorf("Inherit = %v, Lease = %d", spec.Inherit, spec.Lease)
	}
	if len(extra) != 6 || extra[1] != a || extra[3] != b || extra[4] != a || extra[0] == nil || extra[0].Name() != os.DevNull {
		t.Errorf("files: %v", extra)
	}
	if spec.Groups == nil || len(spec.Groups) != 0 {
		t.Errorf("Groups = %#v, want empty (no supplementary groups in the jail)", spec.Groups)
	}
	if fi, err := os.Stat(s.Root); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("jail root: %v %v", fi, err)
	}
	if len(spec.Write) != 1 || spec.Write[0].Path != "/x" {
		t.Errorf("Write = %+v", spec.Write)
	}
}

// Running a program as another uid needs root; the error says so.
func TestStartAsUIDNeedsRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("runs as root")
	}
	if _, err := Start(Spec{Name: "test", Path: "/bin/true", UID: 1234}); err == nil || !strings.Contains(err.Error(), "needs root") {
		t.Errorf("Start as uid 1234 = %v", err)
	}
}

// The stage runs in the shares' owner's user namespace only where root,
// without capabilities, reaches every path it opens: a directory of
// another uid's that only that uid may search (a home of mode 0700)
// keeps it out; a directory others may search, or root's own, does not.
func TestReachableByRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
	dir := t.TempDir()
	mk := func(name string, mode os.FileMode, uid, gid int) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "f"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(p, "f")
	}
	for _, c := range []struct {
		name     string
		mode     os.FileMode
		uid, gid int
		ok       bool
	}{
		{"home", 0o700, 1234, 1234, false},
		{"home-group", 0o750, 1234, 1234, false},
		{"root-group", 0o750, 1234, 0, true},
		{"open", 0o711, 1234, 1234, true},
		{"roots", 0o700, 0, 0, true},
	} {
		err := reachableByRoot(mk(c.name, c.mode, c.uid, c.gid), 6)
		if (err == nil) != c.ok {
			t.Errorf("%s (%v %d:%d): %v, want reachable %v", c.name, c.mode, c.uid, c.gid, err, c.ok)
		}
	}
	if err := reachableByRoot(filepath.Join(dir, "missing", "f"), 4); err != nil {
		t.Errorf("a missing path: %v, want nil (the stage reports it)", err)
	}
	s := Spec{UID: 0x6b000001, GID: 0x6b000001}
	spec := jailstage.Spec{Root: filepath.Join(dir, "jail"), Open: []OpenFile{{Path: filepath.Join(dir, "home", "f"), Flags: os.O_RDWR}}}
	if err := ownerUserns(s, spec, 1000, 1000); err == nil || !strings.Contains(err.Error(), "home") {
		t.Errorf("a disk under a 0700 home of another uid's: %v, want it named", err)
	}
	spec = jailstage.Spec{Root: filepath.Join(dir, "jail"), Groups: []int{1000}}
	if err := ownerUserns(s, spec, 1000, 1000); err == nil {
		t.Error("a supplementary group that is the owner's gid: no error")
	}
}
