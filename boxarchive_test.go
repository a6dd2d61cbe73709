package airlock_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// privateImages gives the test an image store of its own holding the
// default image, so that committed images never reach the shared store.
func privateImages(t *testing.T) string { return vmtest.PrivateImages(t) }

// TestExportImportCommitQEMU: a box's writable layer becomes an image
// layer (new, changed, deleted files, a replaced directory, links) that a
// new box runs from; a box exported without memory is imported into
// another home, stopped, and boots with its files; one exported with
// memory is imported running, its processes included.
func TestExportImportCommitQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	images := privateImages(t)
	open := func() *airlock.Runtime {
		r, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: images, Warn: func(string) {}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	r := open()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	shIn(t, b, `echo kept > /root/new && ln /root/new /root/hard && ln -s new /root/lnk &&
rm /etc/issue && rm -rf /usr/share/doc && mkdir /usr/share/doc && echo only > /usr/share/doc/only &&
echo changed >> /etc/debian_version && mkdir -p /opt/app/sub && echo deep > /opt/app/sub/f`)
	check := func(b *airlock.Box, what string) {
		t.Helper()
		got := shIn(t, b, `cat /root/new /root/hard; readlink /root/lnk; ls /usr/share/doc; tail -n1 /etc/debian_version
cat /opt/app/sub/f; [ -e /etc/issue ] && echo issue-still-there; [ -e /usr/share/doc/debian ] && echo doc-still-there; true`)
		if want := "kept\nkept\nnew\nonly\nchanged\ndeep"; got != want {
			t.Errorf("%s: got\n%s\nwant\n%s", what, got, want)
		}
	}

	// Commit, running.
	t0 := time.Now()
	ref := "airlock-test/commit-" + hex.EncodeToString(randBytes(4)) + ":v1"
	cr, err := b.Commit(ctx, ref, airlock.CommitOptions{Comment: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("commit of a running box: %s (paused %s), %d entries, %d whiteouts, %d bytes", time.Since(t0).Round(time.Millisecond),
		cr.Paused.Round(time.Microsecond), cr.Entries, cr.Whiteouts, cr.Bytes)
	// Removing the image also removes its root filesystem base from the
	// (shared) cache.
	t.Cleanup(func() { r.RemoveImage(context.Background(), ref, true) })
	if cr.Whiteouts != 2 || cr.Image.Digest == "" {
		t.Errorf("commit: %+v (want 2 whiteouts: /etc/issue and the opaque /usr/share/doc)", cr)
	}
	imgs, err := r.ListImages()
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, im := range imgs {
		listed = listed || (im.Digest == cr.Image.Digest && strings.HasSuffix(im.Ref, strings.TrimPrefix(ref, "airlock-test/")))
	}
	if !listed {
		t.Errorf("ListImages does not show %s: %+v", ref, imgs)
	}
	t0 = time.Now()
	c, err := r.Create(ctx, airlock.BoxOptions{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first box of the committed image (root filesystem base built): %s", time.Since(t0).Round(time.Millisecond))
	check(c, "box of the committed image")
	c.Remove(ctx, true)

	// Export without memory, import in another home: stopped, boots with
	// the files.
	var buf bytes.Buffer
	t0 = time.Now()
	st, err := b.Export(ctx, &buf, airlock.ExportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("export without memory: %d bytes (disk data %d) in %s, paused %s", st.Bytes, st.DiskBytes, time.Since(t0).Round(time.Millisecond), st.Paused)
	if int64(buf.Len()) != st.Bytes || st.Bytes > 64<<20 {
		t.Errorf("archive of %d bytes, stats say %d (a 4 GiB disk's holes must stay out)", buf.Len(), st.Bytes)
	}
	if !airlock.IsBoxArchive(bytes.NewReader(buf.Bytes())) {
		t.Error("IsBoxArchive is false for an export")
	}
	r2 := open()
	res, err := r2.ImportBox(ctx, bytes.NewReader(buf.Bytes()), airlock.ImportOptions{Name: "imported"})
	if err != nil {
		t.Fatal(err)
	}
	info, _ := res.Box.Info(ctx)
	if info.State != "created" && info.State != "stopped" {
		t.Errorf("imported box is %q, want it not running", info.State)
	}
	if err := res.Box.Start(ctx); err != nil {
		t.Fatal(err)
	}
	check(res.Box, "imported box")
	res.Box.Remove(ctx, true)

	// Export with memory: the import runs on with the box's process.
	drawn := shIn(t, b, holder)
	buf.Reset()
	t0 = time.Now()
	st, err = b.Export(ctx, &buf, airlock.ExportOptions{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("export with memory: %d bytes (disk %d, state %d) in %s, paused %s", st.Bytes, st.DiskBytes, st.StateBytes,
		time.Since(t0).Round(time.Millisecond), st.Paused.Round(time.Millisecond))
	if snaps, _ := r.Snapshots(ctx); len(snaps) != 0 {
		t.Errorf("export left snapshots behind: %+v", snaps)
	}
	t0 = time.Now()
	res, err = r2.ImportBox(ctx, bytes.NewReader(buf.Bytes()), airlock.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("import with memory (restore): %s", time.Since(t0).Round(time.Millisecond))
	t.Cleanup(func() { res.Box.Remove(context.Background(), true) })
	if res.Snapshot != "import-"+b.ID() && res.Snapshot != b.ID() {
		t.Errorf("snapshot name %q", res.Snapshot)
	}
	if got := askHolder(t, res.Box); got != drawn {
		t.Errorf("imported box's process holds %q, want %q (the exported one's memory)", got, drawn)
	}
	check(res.Box, "box imported with memory")
	// The same archive again: its snapshot name is taken.
	if _, err := r2.ImportBox(ctx, bytes.NewReader(buf.Bytes()), airlock.ImportOptions{}); !errors.Is(err, airlock.ErrSnapshotExists) {
		t.Errorf("second import: %v, want ErrSnapshotExists", err)
	}
	// As on another host, whose kernel is another one (another file of
	// other content): refused clearly, and no snapshot is left.
	other := rewriteArchive(t, buf.Bytes(), "machine.json", func(b []byte) []byte {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		f := m["files"].([]any)[0].(map[string]any)
		if f["sha256"] == nil {
			t.Errorf("the exported machine.json has no content digest of the kernel: %v", f)
		}
		f["inode"] = f["inode"].(float64) + 1
		f["sha256"] = strings.Repeat("0", 64)
		out, _ := json.Marshal(m)
		return out
	})
	r3 := open()
	_, err = r3.ImportBox(ctx, bytes.NewReader(other), airlock.ImportOptions{})
	if err == nil || !strings.Contains(err.Error(), "guest kernel here") || !strings.Contains(err.Error(), "without memory") {
		t.Errorf("import of a memory archive from another host: %v", err)
	} else {
		t.Logf("memory archive from another host: %v", err)
	}
	if snaps, _ := r3.Snapshots(ctx); len(snaps) != 0 {
		t.Errorf("a refused import left snapshots: %+v", snaps)
	}
}

// rewriteArchive returns arc with entry name's content replaced by
// edit's, and its size and checksum in airlock-box.json updated.
func rewriteArchive(t *testing.T, arc []byte, name string, edit func([]byte) []byte) []byte {
	t.Helper()
	type ent struct {
		name string
		data []byte
	}
	var ents []ent
	tr := tar.NewReader(bytes.NewReader(arc))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if h.Name == name {
			b = edit(b)
		}
		ents = append(ents, ent{h.Name, b})
	}
	var meta map[string]any
	if err := json.Unmarshal(ents[0].data, &meta); err != nil {
		t.Fatal(err)
	}
	for _, f := range meta["files"].([]any) {
		f := f.(map[string]any)
		for _, e := range ents {
			if e.name == f["name"] {
				sum := sha256.Sum256(e.data)
				f["size"], f["sha256"] = len(e.data), hex.EncodeToString(sum[:])
			}
		}
	}
	ents[0].data, _ = json.Marshal(meta)
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, e := range ents {
		tw.WriteHeader(&tar.Header{Name: e.name, Size: int64(len(e.data)), Mode: 0o600, Typeflag: tar.TypeReg})
		tw.Write(e.data)
	}
	tw.Close()
	return out.Bytes()
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// archive builds a box archive from meta (marshalled) and entries.
func archive(t *testing.T, meta any, entries ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	raw, _ := json.Marshal(meta)
	all := append([][2]string{{"airlock-box.json", string(raw)}}, entries...)
	for _, e := range all {
		tw.WriteHeader(&tar.Header{Name: e[0], Size: int64(len(e[1])), Mode: 0o600, Typeflag: tar.TypeReg})
		io.WriteString(tw, e[1])
	}
	tw.Close()
	return buf.Bytes()
}

// TestImportRefusesHostileArchives: ImportBox refuses what
// internal/boxarchive refuses (its TestHostileArchiveRefused has the
// format's cases: entries out of place, links, sizes past the box's, data
// outside the disk, a wrong checksum), sizing the disk and RAM image from
// the archive's box configuration, and an unknown image; a refused archive
// leaves no box; a well-formed one is imported without the host resources
// its configuration names.
func TestImportRefusesHostileArchives(t *testing.T) {
	ctx := context.Background()
	r := openRuntime(t, "")
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	cfg := json.RawMessage(`{"v":1,"image":"python:slim","cpus":1,"memory_mib":512,"disk_mib":16,"network":"none","volumes":[{"source":"/","target":"/host"}]}`)
	meta := func(mut func(m map[string]any)) map[string]any {
		m := map[string]any{"v": 1, "kind": "box", "box": "b1", "image": "docker.io/library/python:slim",
			"image_digest": "sha256:" + strings.Repeat("0", 64), "config": cfg,
			"disk":  map[string]any{"size": 16 << 20, "extents": [][2]int64{{4096, 4}}},
			"files": []map[string]any{{"name": "rw.ext4.data", "size": 4, "sha256": sum("data")}}}
		if mut != nil {
			mut(m)
		}
		return m
	}
	// withRAM lists the entries of a snapshot archive with a RAM image of
	// ramData bytes.
	withRAM := func(ramData int64) []map[string]any {
		return []map[string]any{{"name": "rw.ext4.data", "size": 4, "sha256": sum("data")},
			{"name": "snapshot.json", "size": 2, "sha256": sum("{}")}, {"name": "machine.json", "size": 2, "sha256": sum("{}")},
			{"name": "state", "size": 2, "sha256": sum("{}")}, {"name": "ram.data", "size": ramData, "sha256": sum("")}}
	}
	// The format's own checks are internal/boxarchive's tests
	// (TestHostileArchiveRefused); here, that ImportBox applies them and
	// the root package's own.
	cases := []struct {
		name string
		arc  []byte
		want string
	}{
		{"not an archive", []byte("hello"), "read archive"},
		{"unknown image", archive(t, meta(nil), [2]string{"rw.ext4.data", "data"}), "not in the image store"},
		{"disk bigger than the box's", archive(t, meta(func(m map[string]any) {
			m["disk"] = map[string]any{"size": 1 << 40, "extents": [][2]int64{}}
		})), "not the 16 MiB"},
		{"RAM image bigger than the box's memory", archive(t, meta(func(m map[string]any) {
			m["kind"] = "snapshot"
			m["ram"] = map[string]any{"size": 1 << 40, "extents": [][2]int64{}}
			m["files"] = withRAM(4096)
		})), "not the 512 MiB"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := r.ImportBox(ctx, bytes.NewReader(c.arc), airlock.ImportOptions{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error with %q", err, c.want)
			}
		})
	}

	// With the real image: a symlink entry, a wrong checksum and data
	// short of the declared size are refused while the disk is read,
	// before the box is recorded, and leave no box.
	s, err := vmtest.OpenImages()
	if err != nil {
		t.Skip(err)
	}
	img, err := s.Resolve(vmtest.DefaultImage)
	if err != nil {
		t.Skipf("the rest needs %s: %v", vmtest.DefaultImage, err)
	}
	real := func(mut func(m map[string]any)) map[string]any {
		return meta(func(m map[string]any) {
			m["image_digest"] = img.Digest
			if mut != nil {
				mut(m)
			}
		})
	}
	var link bytes.Buffer
	tw := tar.NewWriter(&link)
	raw, _ := json.Marshal(real(nil))
	tw.WriteHeader(&tar.Header{Name: "airlock-box.json", Size: int64(len(raw)), Typeflag: tar.TypeReg})
	tw.Write(raw)
	tw.WriteHeader(&tar.Header{Name: "rw.ext4.data", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"})
	tw.Close()
	for name, arc := range map[string][]byte{
		"symlink entry":  link.Bytes(),
		"wrong checksum": archive(t, real(nil), [2]string{"rw.ext4.data", "DATA"}),
		"short data":     archive(t, real(nil), [2]string{"rw.ext4.data", "da"}),
	} {
		if _, err := r.ImportBox(ctx, bytes.NewReader(arc), airlock.ImportOptions{}); err == nil {
			t.Errorf("%s: imported", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if boxes, _ := r.List(ctx); len(boxes) != 0 {
		t.Errorf("refused imports left boxes: %+v", boxes)
	}

	// A well-formed archive is imported, stopped, its data where the map
	// says, without the host bind mount its configuration asked for.
	res, err := r.ImportBox(ctx, bytes.NewReader(archive(t, real(nil), [2]string{"rw.ext4.data", "data"})), airlock.ImportOptions{Name: "ok"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := res.Box.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State == "running" || len(info.Options.Volumes) != 0 || info.Name != "ok" || info.Options.DiskSizeMiB != 16 {
		t.Errorf("imported box: %+v", info)
	}
	disk, err := os.ReadFile(filepath.Join(r.Home(), "boxes", res.Box.ID(), "rw.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	if len(disk) != 16<<20 || string(disk[4096:4100]) != "data" || disk[4100] != 0 {
		t.Errorf("imported disk: %d bytes, %q at 4096", len(disk), disk[4096:4104])
	}
}

// hostCache makes a cache directory as another host would have it: its own
// copy of the guest kernel (the same kernel package: same bytes, another
// file), and nothing else, so that the agent disk and the image's root
// filesystem base are built anew there.
func hostCache(t *testing.T) string {
	t.Helper()
	k, _, err := assets.FindKernel("")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cache")
	kd := filepath.Join(dir, "kernel")
	if err := os.MkdirAll(kd, 0o755); err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(k.Path)
	for _, suffix := range []string{"", ".info", ".config"} {
		if b, err := os.ReadFile(k.Path + suffix); err == nil {
			if err := os.WriteFile(filepath.Join(kd, name+suffix), b, 0o755); err != nil {
				t.Fatal(err)
			}
		} else if suffix == "" {
			t.Fatal(err)
		}
	}
	if k.Kind == assets.KernelAirlock {
		os.Symlink(name, filepath.Join(kd, "vmlinux-airlock"))
	} else {
		t.Skipf("the kernel %s is not the airlock kernel (%s): this test builds the airlock kernel's agent disk", k.Path, k.Kind)
	}
	return dir
}

// TestMemoryArchiveOtherHostQEMU: a box exported with memory on one host
// restores on another host with the same image, agent and kernel, whose
// agent disk and root filesystem base were built there anew (a second home,
// cache and image store): its background process and that process's
// Python variable are alive; the boot disks built on the two hosts are the
// same bytes.
func TestMemoryArchiveOtherHostQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	type host struct {
		r     *airlock.Runtime
		cache string
	}
	open := func() host {
		cache := hostCache(t)
		r, err := airlock.Open(airlock.Options{Home: t.TempDir(), CacheDir: cache, ImagesDir: privateImages(t), Warn: func(string) {}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return host{r, cache}
	}
	a := open()
	t0 := time.Now()
	b, err := a.r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	t.Logf("host A: first box (agent disk and base built) %s", time.Since(t0).Round(time.Millisecond))
	drawn := shIn(t, b, holder)
	shIn(t, b, `echo from-a > /root/file`)
	var buf bytes.Buffer
	t0 = time.Now()
	st, err := b.Export(ctx, &buf, airlock.ExportOptions{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("host A: export with memory %d bytes in %s (paused %s)", st.Bytes, time.Since(t0).Round(time.Millisecond), st.Paused.Round(time.Millisecond))
	b.Remove(ctx, true)

	h := open()
	// Host B builds its boot disks when its first box needs them: here,
	// in the import's restore check.
	t0 = time.Now()
	res, err := h.r.ImportBox(ctx, bytes.NewReader(buf.Bytes()), airlock.ImportOptions{Name: "moved"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Box.Remove(context.Background(), true) })
	t.Logf("host B: import with memory (agent disk and base built, hashed, restored) %s", time.Since(t0).Round(time.Millisecond))
	if got := askHolder(t, res.Box); got != drawn {
		t.Errorf("host B's box: the Python process holds %q, want %q (host A's memory)", got, drawn)
	}
	if got := shIn(t, res.Box, `cat /root/file; echo ok > /root/after; cat /root/after`); got != "from-a\nok" {
		t.Errorf("host B's box: files %q", got)
	}
	// Again on host B, its disks built and their digests memoized: the
	// cost of a restore.
	t0 = time.Now()
	res2, err := h.r.ImportBox(ctx, bytes.NewReader(buf.Bytes()), airlock.ImportOptions{Snapshot: "again"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("host B: second import with memory %s", time.Since(t0).Round(time.Millisecond))
	if got := askHolder(t, res2.Box); got != drawn {
		t.Errorf("host B's second box: the Python process holds %q, want %q", got, drawn)
	}
	res2.Box.Remove(ctx, true)
	// The two hosts' boot disks: other files, the same bytes.
	for _, glob := range []string{"initrd/agent-*.erofs", "rootfs/*.erofs"} {
		pa, _ := filepath.Glob(filepath.Join(a.cache, glob))
		pb, _ := filepath.Glob(filepath.Join(h.cache, glob))
		if len(pa) != 1 || len(pb) != 1 {
			t.Fatalf("%s: host A has %v, host B %v", glob, pa, pb)
		}
		ba, _ := os.ReadFile(pa[0])
		bb, _ := os.ReadFile(pb[0])
		if !bytes.Equal(ba, bb) || len(ba) == 0 {
			t.Errorf("%s built on the two hosts differ (%d and %d bytes)", glob, len(ba), len(bb))
		}
	}
}
