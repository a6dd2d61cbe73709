package boxarchive_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/boxarchive"
	"github.com/airlock-run/airlock/internal/snapmeta"
)

func sum(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// archive builds a box archive from meta (marshalled) and entries.
func archive(t *testing.T, meta any, entries ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	raw, _ := json.Marshal(meta)
	all := append([][2]string{{boxarchive.MetaName, string(raw)}}, entries...)
	for _, e := range all {
		tw.WriteHeader(&tar.Header{Name: e[0], Size: int64(len(e[1])), Mode: 0o600, Typeflag: tar.TypeReg})
		io.WriteString(tw, e[1])
	}
	tw.Close()
	return buf.Bytes()
}

// meta is the manifest of a box archive for a box of 512 MiB memory and a
// 16 MiB disk holding "data" at 4096, changed by mut.
func meta(mut func(m map[string]any)) map[string]any {
	m := map[string]any{"v": 1, "kind": "box", "box": "b1", "image": "docker.io/library/python:slim",
		"image_digest": "sha256:" + strings.Repeat("0", 64), "config": json.RawMessage(`{"any":"thing"}`),
		"disk":  map[string]any{"size": 16 << 20, "extents": [][2]int64{{4096, 4}}},
		"files": []map[string]any{{"name": "rw.ext4.data", "size": 4, "sha256": sum("data")}}}
	if mut != nil {
		mut(m)
	}
	return m
}

// snapshotFiles lists the entries of a snapshot archive whose JSON
// entries hold snap and machine.
func snapshotFiles(snap, machine string) []map[string]any {
	return []map[string]any{{"name": "rw.ext4.data", "size": 4, "sha256": sum("data")},
		{"name": "snapshot.json", "size": len(snap), "sha256": sum(snap)},
		{"name": "machine.json", "size": len(machine), "sha256": sum(machine)},
		{"name": "state", "size": 2, "sha256": sum("{}")}}
}

// boxLimits are the limits of meta's box.
func boxLimits(*boxarchive.Manifest) (boxarchive.Limits, error) {
	return boxarchive.Limits{DiskBytes: 16 << 20, MemoryBytes: 512 << 20}, nil
}

// readAll reads arc into a new directory under a new parent, which it
// returns with Read's or Extract's error.
func readAll(t *testing.T, arc []byte, limits func(*boxarchive.Manifest) (boxarchive.Limits, error)) (parent string, err error) {
	t.Helper()
	parent = t.TempDir()
	dir := filepath.Join(parent, "dir")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rd, err := boxarchive.Read(bytes.NewReader(arc), limits)
	if err != nil {
		return parent, err
	}
	return parent, rd.Extract(context.Background(), dir)
}

// TestHostileArchiveRefused: entries out of place, links, sizes past the
// box's, data outside the disk, a wrong checksum, ids that are no box id
// (a terminal escape, a path) and names that are paths are refused, and
// nothing is written outside the directory Extract is given.
func TestHostileArchiveRefused(t *testing.T) {
	withRAM := func(ramData int64) []map[string]any {
		return append(snapshotFiles("{}", "{}"), map[string]any{"name": "ram.data", "size": ramData, "sha256": sum("")})
	}
	var link bytes.Buffer
	tw := tar.NewWriter(&link)
	raw, _ := json.Marshal(meta(nil))
	tw.WriteHeader(&tar.Header{Name: boxarchive.MetaName, Size: int64(len(raw)), Typeflag: tar.TypeReg})
	tw.Write(raw)
	tw.WriteHeader(&tar.Header{Name: "rw.ext4.data", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"})
	tw.Close()
	var big bytes.Buffer
	tw = tar.NewWriter(&big)
	tw.WriteHeader(&tar.Header{Name: boxarchive.MetaName, Size: boxarchive.MaxJSON + 1, Typeflag: tar.TypeReg})
	tw.Write(bytes.Repeat([]byte(" "), boxarchive.MaxJSON+1))
	tw.Close()
	cases := []struct {
		name  string
		arc   []byte
		want  string
		limit bool // wraps ErrLimit
	}{
		{"not an archive", []byte("hello"), "read archive", false},
		{"empty archive", archive(t, nil)[:0], "ends before", false},
		{"other first entry", func() []byte {
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			tw.WriteHeader(&tar.Header{Name: "../../etc/passwd", Size: 0, Typeflag: tar.TypeReg})
			tw.Close()
			return b.Bytes()
		}(), "where airlock-box.json was expected", false},
		{"manifest past 1 MiB", big.Bytes(), "larger than", true},
		{"newer format", archive(t, meta(func(m map[string]any) { m["v"] = 2 })), "format version 2", false},
		{"unknown kind", archive(t, meta(func(m map[string]any) { m["kind"] = "image" })), `kind "image"`, false},
		{"escape in the box id", archive(t, meta(func(m map[string]any) { m["box"] = "\x1b[2J\x1b[31mrm -rf" })), "box id", false},
		{"path as the box id", archive(t, meta(func(m map[string]any) { m["box"] = "../../x" })), "box id", false},
		{"no image digest", archive(t, meta(func(m map[string]any) { m["image_digest"] = "sha256:../x" })), "not an image reference and digest", false},
		{"extent outside the disk", archive(t, meta(func(m map[string]any) {
			m["disk"] = map[string]any{"size": 16 << 20, "extents": [][2]int64{{16 << 20, 4}}}
		})), "outside", false},
		{"extents out of order", archive(t, meta(func(m map[string]any) {
			m["disk"] = map[string]any{"size": 16 << 20, "extents": [][2]int64{{8192, 2}, {4096, 2}}}
		})), "out of order", false},
		{"extent that overflows", archive(t, meta(func(m map[string]any) {
			m["disk"] = map[string]any{"size": 16 << 20, "extents": [][2]int64{{1 << 62, 1 << 62}}}
		})), "outside", false},
		{"disk bigger than the box's", archive(t, meta(func(m map[string]any) {
			m["disk"] = map[string]any{"size": 1 << 40, "extents": [][2]int64{}}
		})), "not the 16 MiB", false},
		{"disk data longer than its map", archive(t, meta(func(m map[string]any) {
			m["files"] = []map[string]any{{"name": "rw.ext4.data", "size": 1 << 30, "sha256": sum("data")}}
		})), "over what its box allows", true},
		{"state past the memory size", archive(t, meta(func(m map[string]any) {
			m["kind"] = "snapshot"
			f := snapshotFiles("{}", "{}")
			f[3]["size"] = int64(8) << 30
			m["files"] = f
		})), "over what its box allows", true},
		{"machine.json past 1 MiB", archive(t, meta(func(m map[string]any) {
			m["kind"] = "snapshot"
			f := snapshotFiles("{}", "{}")
			f[2]["size"] = 2 << 20
			m["files"] = f
		})), "over what its box allows", true},
		{"RAM image bigger than the box's memory", archive(t, meta(func(m map[string]any) {
			m["kind"] = "snapshot"
			m["ram"] = map[string]any{"size": 1 << 40, "extents": [][2]int64{}}
			m["files"] = withRAM(4096)
		})), "not the 512 MiB", false},
		{"RAM image range outside its size", archive(t, meta(func(m map[string]any) {
			m["kind"] = "snapshot"
			m["ram"] = map[string]any{"size": 512 << 20, "extents": [][2]int64{{512 << 20, 4096}}}
			m["files"] = withRAM(4096)
		})), "RAM image map has a range", false},
		{"RAM image data longer than its map", archive(t, meta(func(m map[string]any) {
			m["kind"] = "snapshot"
			m["ram"] = map[string]any{"size": 512 << 20, "extents": [][2]int64{{0, 4096}}}
			m["files"] = withRAM(1 << 30)
		})), "over what its box allows", true},
		{"a RAM image in an archive without memory", archive(t, meta(func(m map[string]any) {
			m["ram"] = map[string]any{"size": 512 << 20, "extents": [][2]int64{}}
		})), "not of a snapshot", false},
		{"a path instead of an entry name", archive(t, meta(func(m map[string]any) {
			m["files"] = []map[string]any{{"name": "../../etc/passwd", "size": 4, "sha256": sum("data")}}
		})), "where rw.ext4.data belongs", false},
		{"an entry too many", archive(t, meta(func(m map[string]any) { m["files"] = snapshotFiles("{}", "{}") })), "lists 4 entries", false},
		{"no valid checksum", archive(t, meta(func(m map[string]any) {
			m["files"] = []map[string]any{{"name": "rw.ext4.data", "size": 4, "sha256": "zz"}}
		})), "no valid SHA-256", false},
		{"symlink entry", link.Bytes(), "not a regular file", false},
		{"wrong checksum", archive(t, meta(nil), [2]string{"rw.ext4.data", "DATA"}), "does not match its SHA-256", false},
		{"short data", archive(t, meta(nil), [2]string{"rw.ext4.data", "da"}), "is 2 bytes, not the 4", false},
		{"entry other than the listed", archive(t, meta(nil), [2]string{"state", "data"}), `"state" where rw.ext4.data`, false},
		{"snapshot entry damaged", archive(t, meta(func(m map[string]any) {
			m["kind"] = "snapshot"
			m["files"] = snapshotFiles("{}", "[]")
		}), [2]string{"rw.ext4.data", "data"}, [2]string{"snapshot.json", "{}"}, [2]string{"machine.json", "{}"}, [2]string{"state", "{}"}),
			"machine.json does not match its SHA-256", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			parent, err := readAll(t, c.arc, boxLimits)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error with %q", err, c.want)
			}
			if errors.Is(err, boxarchive.ErrLimit) != c.limit {
				t.Errorf("%v: wraps ErrLimit: %v, want %v", err, !c.limit, c.limit)
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 1 {
				t.Errorf("the archive wrote %d entries beside the directory it was read into", len(ents)-1)
			}
		})
	}
}

// ustarHeader is a raw ustar header block (archive/tar's writer does not
// write the records a sparse entry needs).
func ustarHeader(name string, typ byte, size int) []byte {
	b := make([]byte, 512)
	copy(b[0:], name)
	copy(b[100:], "0000600\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	copy(b[148:], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func padBlock(b []byte) []byte {
	if r := len(b) % 512; r != 0 {
		b = append(b, make([]byte, 512-r)...)
	}
	return b
}

func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	for {
		s := fmt.Sprintf("%d %s=%s\n", n, k, v)
		if len(s) == n {
			return s
		}
		n = len(s)
	}
}

// TestHostileArchiveSparseBomb: a tar entry in GNU sparse format (PAX
// GNU.sparse.* records) reads as its full "real" size of zeros, which
// archive/tar expands without bound: a 4 KiB archive would write the
// whole disk (or state file) the manifest declares onto the host. Such an
// entry is refused and leaves no disk file.
func TestHostileArchiveSparseBomb(t *testing.T) {
	const real = 16 << 20
	m, _ := json.Marshal(meta(func(m map[string]any) {
		m["disk"] = map[string]any{"size": real, "extents": [][2]int64{{0, real}}}
		m["files"] = []map[string]any{{"name": "rw.ext4.data", "size": real, "sha256": sum(string(make([]byte, real)))}}
	}))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: boxarchive.MetaName, Size: int64(len(m)), Mode: 0o600, Typeflag: tar.TypeReg})
	tw.Write(m)
	tw.Flush()
	pax := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", "rw.ext4.data") + paxRecord("GNU.sparse.realsize", fmt.Sprint(real))
	buf.Write(ustarHeader("PaxHeaders/rw.ext4.data", tar.TypeXHeader, len(pax)))
	buf.Write(padBlock([]byte(pax)))
	// The sparse map (one 4-byte data region at the end), then the data.
	body := append(padBlock([]byte(fmt.Sprintf("1\n%d\n4\n", real-4))), 0, 0, 0, 0)
	buf.Write(ustarHeader("GNUSparseFile.0/rw.ext4.data", tar.TypeReg, len(body)))
	buf.Write(padBlock(body))
	buf.Write(make([]byte, 1024))
	t.Logf("archive: %d bytes for %d bytes of disk data", buf.Len(), real)

	parent, err := readAll(t, buf.Bytes(), boxLimits)
	if err == nil || !strings.Contains(err.Error(), "sparse") {
		t.Errorf("read of a sparse tar entry: %v, want it refused as sparse", err)
	}
	if _, err := os.Stat(filepath.Join(parent, "dir", boxarchive.DiskFile)); !os.IsNotExist(err) {
		t.Errorf("a refused sparse entry left a disk file: %v", err)
	}
}

// TestHostileArchiveLimits: the limits come from the caller, who reads
// the manifest's box configuration first; its error refuses the archive
// as is, before any entry is read, and the sizes it gives bound the
// disk and RAM image.
func TestHostileArchiveLimits(t *testing.T) {
	errCap := errors.New("over the host's memory cap")
	arc := archive(t, meta(nil), [2]string{"rw.ext4.data", "data"})
	var seen string
	_, err := readAll(t, arc, func(m *boxarchive.Manifest) (boxarchive.Limits, error) {
		seen = string(m.Config)
		return boxarchive.Limits{}, errCap
	})
	if !errors.Is(err, errCap) || seen != `{"any":"thing"}` {
		t.Errorf("limits refused the box: %v (config %q), want its error", err, seen)
	}
	// The same archive for a box with an 8 MiB disk.
	_, err = readAll(t, arc, func(*boxarchive.Manifest) (boxarchive.Limits, error) {
		return boxarchive.Limits{DiskBytes: 8 << 20, MemoryBytes: 512 << 20}, nil
	})
	if err == nil || !strings.Contains(err.Error(), "not the 8 MiB") {
		t.Errorf("a 16 MiB disk for a box of 8 MiB: %v", err)
	}
}

// TestHostileArchiveCheckFile: a snapshot archive's JSON entries go to
// Limits.CheckFile (airlock checks the kernel command line there) once
// their checksums match, before the next entry is read; its error
// refuses the archive.
func TestHostileArchiveCheckFile(t *testing.T) {
	const snap, machine = `{"agent_version":"1"}`, `{"config":{"Cmdline":"init=/bin/sh"}}`
	arc := archive(t, meta(func(m map[string]any) {
		m["kind"] = "snapshot"
		m["files"] = snapshotFiles(snap, machine)
	}), [2]string{"rw.ext4.data", "data"}, [2]string{"snapshot.json", snap}, [2]string{"machine.json", machine}, [2]string{"state", "{}"})
	errBad := errors.New("the kernel command line has \"init=/bin/sh\"")
	var got []string
	parent, err := readAll(t, arc, func(*boxarchive.Manifest) (boxarchive.Limits, error) {
		return boxarchive.Limits{DiskBytes: 16 << 20, MemoryBytes: 512 << 20, CheckFile: func(name string, b []byte) error {
			got = append(got, name+"="+string(b))
			if name == boxarchive.MachineFile {
				return errBad
			}
			return nil
		}}, nil
	})
	if !errors.Is(err, errBad) {
		t.Errorf("CheckFile refused machine.json: %v, want its error", err)
	}
	if want := []string{"snapshot.json=" + snap, "machine.json=" + machine}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("CheckFile saw %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(parent, "dir", boxarchive.StateFile)); !os.IsNotExist(err) {
		t.Errorf("the entry after a refused one was read: %v", err)
	}
}

// TestWriteRead: what Write writes of a sparse disk and a snapshot
// directory (with a sparse RAM image), Read and Extract give back: the
// same bytes at the same offsets, holes left out of the archive and
// sparse again on disk.
func TestWriteRead(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	sparse := func(name string, size int64, data map[int64]string) {
		f, err := os.Create(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		for off, s := range data {
			if _, err := f.WriteAt([]byte(s), off); err != nil {
				t.Fatal(err)
			}
		}
	}
	sparse(boxarchive.DiskFile, 16<<20, map[int64]string{0: "head", 8 << 20: strings.Repeat("x", 1<<20)})
	sparse(boxarchive.RAMFile, 64<<20, map[int64]string{32 << 20: "ram"})
	files := map[string]string{boxarchive.SnapshotFile: `{"agent_version":"1"}`, boxarchive.MachineFile: `{"config":{}}`, boxarchive.StateFile: "device state"}
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, kind := range []string{boxarchive.KindBox, boxarchive.KindSnapshot} {
		t.Run(kind, func(t *testing.T) {
			snapDir := ""
			if kind == boxarchive.KindSnapshot {
				snapDir = src
			}
			var buf bytes.Buffer
			m := boxarchive.Manifest{Kind: kind, Box: "b1", Image: "docker.io/library/python:slim", ImageDigest: "sha256:" + strings.Repeat("a", 64),
				Config: json.RawMessage(`{"memory_mib":64}`), Exported: time.Now().UTC()}
			st, err := boxarchive.Write(ctx, &buf, m, filepath.Join(src, boxarchive.DiskFile), snapDir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if st.Bytes != int64(buf.Len()) || st.DiskBytes < 1<<20 || st.DiskBytes > 2<<20 || buf.Len() > 3<<20 {
				t.Errorf("stats %+v for an archive of %d bytes of a disk with 1 MiB of data", st, buf.Len())
			}
			if !boxarchive.IsArchive(bytes.NewReader(buf.Bytes())) {
				t.Error("IsArchive: false for what Write wrote")
			}
			rd, err := boxarchive.Read(&buf, func(m *boxarchive.Manifest) (boxarchive.Limits, error) {
				return boxarchive.Limits{DiskBytes: 16 << 20, MemoryBytes: 64 << 20}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var cfg bytes.Buffer
			got := rd.Manifest()
			json.Compact(&cfg, got.Config)
			if got.Kind != kind || got.Box != "b1" || cfg.String() != `{"memory_mib":64}` || got.Version != boxarchive.Version {
				t.Errorf("manifest read back: %+v", got)
			}
			dst := t.TempDir()
			if err := rd.Extract(ctx, dst); err != nil {
				t.Fatal(err)
			}
			want := []string{boxarchive.DiskFile}
			if kind == boxarchive.KindSnapshot {
				want = append(want, boxarchive.SnapshotFile, boxarchive.MachineFile, boxarchive.StateFile, boxarchive.RAMFile)
			}
			ents, _ := os.ReadDir(dst)
			if len(ents) != len(want) {
				t.Errorf("extracted %d files, want %v", len(ents), want)
			}
			for _, name := range want {
				a, _ := os.ReadFile(filepath.Join(src, name))
				b, err := os.ReadFile(filepath.Join(dst, name))
				if err != nil || !bytes.Equal(a, b) {
					t.Errorf("%s: %d bytes read back, %d written (%v)", name, len(b), len(a), err)
				}
			}
			var s unix.Stat_t
			if err := unix.Stat(filepath.Join(dst, boxarchive.DiskFile), &s); err != nil || s.Blocks*512 > 4<<20 {
				t.Errorf("the extracted 16 MiB disk with 1 MiB of data takes %d bytes (%v), want it sparse", s.Blocks*512, err)
			}
		})
	}
}

// TestHostileArchiveHostChecks: the importer's checks of an archive's
// box against the host, with no Runtime.
func TestHostileArchiveHostChecks(t *testing.T) {
	if _, err := boxarchive.BoxLimits(512, boxarchive.MaxDiskMiB+1, nil); !errors.Is(err, boxarchive.ErrLimit) || !strings.Contains(err.Error(), "1 TiB") {
		t.Errorf("a disk over 1 TiB: %v, want boxarchive.ErrLimit", err)
	}
	if l, err := boxarchive.BoxLimits(512, 2048, nil); err != nil || l.MemoryBytes != 512<<20 || l.DiskBytes != 2048<<20 {
		t.Errorf("boxarchive.BoxLimits(512, 2048): %+v, %v", l, err)
	}
	huge := &boxarchive.Manifest{Kind: boxarchive.KindBox, Files: []boxarchive.File{{Name: boxarchive.DiskName, Size: 1 << 60}}}
	if err := boxarchive.CheckFreeSpace(t.TempDir(), huge); !errors.Is(err, boxarchive.ErrLimit) || !strings.Contains(err.Error(), "free some space") {
		t.Errorf("an archive of 1 EiB: %v, want boxarchive.ErrLimit", err)
	}
	valid := func(s string) bool { return s != "" && !strings.Contains(s, "/") }
	if n := boxarchive.SnapshotName(&boxarchive.Manifest{Box: "b1", Snapshot: "../x"}, valid); n != "import-b1" {
		t.Errorf("invalid snapshot name: %q, want import-b1", n)
	}
	if n := boxarchive.SnapshotName(&boxarchive.Manifest{Box: "b1", Snapshot: "snap"}, valid); n != "snap" {
		t.Errorf("valid snapshot name: %q", n)
	}
}

// TestImportWrites: a box archive's disk lands in a temporary directory
// of its own (made if missing) that cleanup removes; a memory archive
// becomes a snapshot whose record is rebuilt from what was checked, with
// the importer's configuration, not the archive's.
func TestImportWrites(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	for name, size := range map[string]int64{boxarchive.DiskFile: 1 << 20, boxarchive.RAMFile: 1 << 20} {
		os.WriteFile(filepath.Join(src, name), []byte(name), 0o600)
		os.Truncate(filepath.Join(src, name), size)
	}
	os.WriteFile(filepath.Join(src, boxarchive.StateFile), []byte("state"), 0o600)
	os.WriteFile(filepath.Join(src, boxarchive.MachineFile), []byte(`{}`), 0o600)
	os.WriteFile(filepath.Join(src, boxarchive.SnapshotFile), []byte(`{"v":1,"name":"x","agent_version":"0.4","driver":"qemu","paused_ns":7}`), 0o600)
	read := func(kind, snapDir string) *boxarchive.Reader {
		var buf bytes.Buffer
		m := boxarchive.Manifest{Kind: kind, Box: "b1", BoxName: "web", Snapshot: "s", Image: "docker.io/library/python:slim",
			ImageDigest: "sha256:" + strings.Repeat("a", 64), Config: json.RawMessage(`{"memory_mib":64}`), Exported: time.Now().UTC()}
		if _, err := boxarchive.Write(ctx, &buf, m, filepath.Join(src, boxarchive.DiskFile), snapDir, nil); err != nil {
			t.Fatal(err)
		}
		rd, err := boxarchive.Read(&buf, func(*boxarchive.Manifest) (boxarchive.Limits, error) {
			return boxarchive.Limits{DiskBytes: 1 << 20, MemoryBytes: 1 << 20}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return rd
	}
	tmpRoot := filepath.Join(t.TempDir(), "tmp")
	disk, cleanup, err := read(boxarchive.KindBox, "").ExtractDisk(ctx, tmpRoot)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(disk); err != nil || !strings.HasPrefix(string(b), boxarchive.DiskFile) || filepath.Dir(filepath.Dir(disk)) != tmpRoot {
		t.Errorf("disk %s: %q %v", disk, b, err)
	}
	cleanup()
	if ents, _ := os.ReadDir(tmpRoot); len(ents) != 0 {
		t.Errorf("cleanup left %v", ents)
	}

	snaps := t.TempDir()
	if err := read(boxarchive.KindSnapshot, src).ImportSnapshot(ctx, snaps, "imported", []byte(`{"v":1,"image":"mine"}`)); err != nil {
		t.Fatal(err)
	}
	m, err := snapmeta.Read(snaps, "imported")
	if err != nil {
		t.Fatal(err)
	}
	var cfg bytes.Buffer
	json.Compact(&cfg, m.Config)
	if m.Name != "imported" || m.Box != "b1" || m.BoxName != "web" || m.AgentVersion != "0.4" || m.Driver != "qemu" || m.PausedNs != 7 ||
		cfg.String() != `{"v":1,"image":"mine"}` || m.DiskBytes == 0 || m.StateBytes == 0 {
		t.Errorf("record %+v", m)
	}
	err = read(boxarchive.KindSnapshot, src).ImportSnapshot(ctx, snaps, "imported", []byte(`{}`))
	if !errors.Is(err, snapmeta.ErrExists) {
		t.Errorf("second import: %v, want ErrExists", err)
	}
}

func TestCheckSnapshotFileRoutesEachEntry(t *testing.T) {
	bad := errors.New("bad cmdline")
	check := boxarchive.CheckSnapshotFile(func(b []byte) error {
		if string(b) == "bad" {
			return bad
		}
		return nil
	})
	if check(boxarchive.MachineFile, []byte("bad")) != bad || check(boxarchive.MachineFile, []byte("ok")) != nil {
		t.Error("machine.json: want the driver's check")
	}
	if check(boxarchive.SnapshotFile, []byte(`{"agent_version":"\u001b[2J"}`)) == nil {
		t.Error("snapshot.json with a control character accepted")
	}
	if check(boxarchive.StateFile, []byte("anything")) != nil {
		t.Error("other entries are not this check's")
	}
}
