package boxarchive_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/boxarchive"
)

// withCheckpoints is meta's box archive carrying checkpoints named
// names[i] with parents[i] (each with "data" at 4096 of its disk and
// "{}" as its machine.json and state), and the entries the archive then
// holds after its manifest.
func withCheckpoints(names, parents []string, mut func(m map[string]any)) (map[string]any, [][2]string) {
	entries := [][2]string{{"rw.ext4.data", "data"}}
	m := meta(func(m map[string]any) {
		var cks []map[string]any
		files := m["files"].([]map[string]any)
		for i, n := range names {
			cks = append(cks, map[string]any{"name": n, "parent": parents[i], "created": time.Now().UTC(),
				"disk": map[string]any{"size": 16 << 20, "extents": [][2]int64{{4096, 4}}}})
			for _, e := range [][2]string{{boxarchive.DiskName, "data"}, {boxarchive.MachineFile, "{}"}, {boxarchive.StateFile, "{}"}} {
				name := boxarchive.CheckpointEntry(i, e[0])
				files = append(files, map[string]any{"name": name, "size": len(e[1]), "sha256": sum(e[1])})
				entries = append(entries, [2]string{name, e[1]})
			}
		}
		m["checkpoints"], m["files"] = cks, files
		if mut != nil {
			mut(m)
		}
	})
	return m, entries
}

// TestHostileArchiveCheckpoints: an archive's checkpoints must form a
// tree inside it (each parent listed before its child: no loop, no
// missing parent), be at most 64 with valid, distinct names, come only
// with a box archive of the box's disk size, and list their entries; a
// well-formed one is read, each checkpoint's files landing in its own
// directory, its machine.json checked as a snapshot's.
func TestHostileArchiveCheckpoints(t *testing.T) {
	many := make([]string, boxarchive.MaxCheckpoints+1)
	manyParents := make([]string, len(many))
	for i := range many {
		many[i] = fmt.Sprintf("c%d", i)
	}
	cases := []struct {
		name           string
		names, parents []string
		mut            func(m map[string]any)
		want           string
		limit          bool
	}{
		{"dangling parent", []string{"a", "b"}, []string{"", "gone"}, nil, "not a checkpoint listed before it", false},
		{"loop", []string{"a", "b"}, []string{"b", "a"}, nil, "not a checkpoint listed before it", false},
		{"own parent", []string{"a"}, []string{"a"}, nil, "not a checkpoint listed before it", false},
		{"child before parent", []string{"b", "a"}, []string{"a", ""}, nil, "not a checkpoint listed before it", false},
		{"too many", many, manyParents, nil, "more than the 64", true},
		{"oversized name", []string{strings.Repeat("n", 65)}, []string{""}, nil, "checkpoint name", false},
		{"path as a name", []string{"../x"}, []string{""}, nil, "checkpoint name", false},
		{"escape in a parent", []string{"a"}, []string{"\x1b[2J"}, nil, "parent that is no checkpoint name", false},
		{"twice", []string{"a", "a"}, []string{"", ""}, nil, "twice", false},
		{"head not carried", []string{"a"}, []string{""}, func(m map[string]any) { m["checkpoint_head"] = "b" }, "current checkpoint", false},
		{"head without checkpoints", nil, nil, func(m map[string]any) { m["checkpoint_head"] = "a" }, "current checkpoint", false},
		{"with memory", []string{"a"}, []string{""}, func(m map[string]any) { m["kind"] = "snapshot" }, "not of a box without memory", false},
		{"other disk size", []string{"a"}, []string{""}, func(m map[string]any) {
			m["checkpoints"].([]map[string]any)[0]["disk"] = map[string]any{"size": 32 << 20, "extents": [][2]int64{}}
		}, "has a disk of", false},
		{"entries left out", []string{"a"}, []string{""}, func(m map[string]any) {
			m["files"] = m["files"].([]map[string]any)[:1]
		}, "lists 1 entries, not the 4", false},
		{"state past memory", []string{"a"}, []string{""}, func(m map[string]any) {
			m["files"].([]map[string]any)[3]["size"] = 1 << 40
		}, "over what its box allows", true},
		{"bad agent version", []string{"a"}, []string{""}, func(m map[string]any) {
			m["checkpoints"].([]map[string]any)[0]["agent_version"] = "\x1b]0;x"
		}, "bad record", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, entries := withCheckpoints(c.names, c.parents, c.mut)
			_, err := boxarchive.Read(bytes.NewReader(archive(t, m, entries...)), boxLimits)
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, boxarchive.ErrLimit) != c.limit {
				t.Fatalf("Read: %v, want an error saying %q (ErrLimit %v)", err, c.want, c.limit)
			}
		})
	}

	t.Run("a tree", func(t *testing.T) {
		m, entries := withCheckpoints([]string{"a", "b", "c"}, []string{"", "a", "a"}, func(m map[string]any) { m["checkpoint_head"] = "c" })
		var checked []string
		parent, err := readAll(t, archive(t, m, entries...), func(*boxarchive.Manifest) (boxarchive.Limits, error) {
			return boxarchive.Limits{DiskBytes: 16 << 20, MemoryBytes: 512 << 20, CheckFile: func(name string, b []byte) error {
				checked = append(checked, name)
				return nil
			}}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(checked) != 3 || checked[0] != boxarchive.MachineFile {
			t.Errorf("CheckFile saw %v, want each checkpoint's machine.json", checked)
		}
		dir := filepath.Join(parent, "dir")
		for i := range 3 {
			b, err := os.ReadFile(filepath.Join(boxarchive.CheckpointDir(dir, i), boxarchive.StateFile))
			if err != nil || string(b) != "{}" {
				t.Errorf("checkpoint %d's state: %q, %v", i, b, err)
			}
		}
	})

	t.Run("a refused machine.json", func(t *testing.T) {
		m, entries := withCheckpoints([]string{"a"}, []string{""}, nil)
		_, err := readAll(t, archive(t, m, entries...), func(*boxarchive.Manifest) (boxarchive.Limits, error) {
			return boxarchive.Limits{DiskBytes: 16 << 20, MemoryBytes: 512 << 20, CheckFile: func(string, []byte) error {
				return errors.New("init= on the command line")
			}}, nil
		})
		if err == nil || !strings.Contains(err.Error(), "checkpoint.0.machine.json: init=") {
			t.Fatalf("Extract: %v, want the checkpoint's machine.json refused", err)
		}
	})
}

// TestWriteReadCheckpoints: what Write writes with checkpoints, Read and
// Extract read back: the tree, the head, each checkpoint's files (its
// disk sparse).
func TestWriteReadCheckpoints(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	disk := filepath.Join(src, "box.ext4")
	mk := func(p string, size int64, s string) {
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte(s), 8192); err != nil {
			t.Fatal(err)
		}
	}
	mk(disk, 16<<20, "now")
	var ckpts []boxarchive.CheckpointSource
	for i, c := range [][2]string{{"A", ""}, {"B", "A"}} {
		dir := filepath.Join(src, c[0])
		os.Mkdir(dir, 0o700)
		mk(filepath.Join(dir, boxarchive.DiskFile), 16<<20, "disk of "+c[0])
		os.WriteFile(filepath.Join(dir, boxarchive.MachineFile), []byte(`{"m":1}`), 0o600)
		os.WriteFile(filepath.Join(dir, boxarchive.StateFile), []byte("state of "+c[0]), 0o600)
		if i == 1 {
			mk(filepath.Join(dir, boxarchive.RAMFile), 64<<20, "ram of B")
		}
		ckpts = append(ckpts, boxarchive.CheckpointSource{Dir: dir, Checkpoint: boxarchive.Checkpoint{Name: c[0], Parent: c[1], Created: time.Now().UTC(), AgentVersion: "7"}})
	}
	var buf bytes.Buffer
	m := boxarchive.Manifest{Kind: boxarchive.KindBox, Box: "b1", Image: "docker.io/library/python:slim", ImageDigest: "sha256:" + strings.Repeat("a", 64),
		Config: json.RawMessage(`{}`), Exported: time.Now().UTC(), CheckpointHead: "B"}
	if _, err := boxarchive.Write(ctx, &buf, m, disk, "", ckpts); err != nil {
		t.Fatal(err)
	}
	rd, err := boxarchive.Read(&buf, func(*boxarchive.Manifest) (boxarchive.Limits, error) {
		return boxarchive.Limits{DiskBytes: 16 << 20, MemoryBytes: 64 << 20}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := rd.Manifest()
	if len(got.Checkpoints) != 2 || got.Checkpoints[1].Parent != "A" || got.CheckpointHead != "B" || got.Checkpoints[0].RAM != nil || got.Checkpoints[1].RAM == nil {
		t.Fatalf("checkpoints read back: %+v head %q", got.Checkpoints, got.CheckpointHead)
	}
	dst := t.TempDir()
	if err := rd.Extract(ctx, dst); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"A", "B"} {
		cd := boxarchive.CheckpointDir(dst, i)
		for _, f := range []string{boxarchive.DiskFile, boxarchive.MachineFile, boxarchive.StateFile} {
			a, _ := os.ReadFile(filepath.Join(src, name, f))
			b, err := os.ReadFile(filepath.Join(cd, f))
			if err != nil || !bytes.Equal(a, b) {
				t.Errorf("checkpoint %s's %s: %d bytes read back, %d written (%v)", name, f, len(b), len(a), err)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(boxarchive.CheckpointDir(dst, 1), boxarchive.RAMFile)); err != nil || len(b) != 64<<20 || !bytes.Contains(b, []byte("ram of B")) {
		t.Errorf("checkpoint B's RAM image: %d bytes, %v", len(b), err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, boxarchive.DiskFile)); err != nil || !bytes.Contains(b, []byte("now")) {
		t.Errorf("the box's disk: %v", err)
	}
}
