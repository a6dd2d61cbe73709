package qemu

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSealedSnapshotFilesByContent: a sealed snapshot (SealSnapshot) takes
// a boot file of the same content at another path (another host's cache),
// and refuses one of other content naming it; an unsealed one takes only
// the very same file.
func TestSealedSnapshotFilesByContent(t *testing.T) {
	dir := t.TempDir()
	d := &Driver{o: Options{CacheDir: filepath.Join(dir, "cache")}}
	write := func(name, body string) fileID {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		id, err := idOf(p)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	kernel, base := write("kernel", "kernel bytes"), write("base", "base bytes")
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o700)
	meta := `{"qemu_version":"x","files":[` + idJSON(kernel) + `,` + idJSON(base) + `]}`
	if err := os.WriteFile(filepath.Join(snap, snapMachine), []byte(meta), 0o600); err != nil {
		t.Fatal(err)
	}
	otherKernel, otherBase := write("kernel2", "kernel bytes"), write("base2", "base BYTES")
	mm, _ := readMeta(snap)
	if err := d.sameFiles(mm.Files, []fileID{otherKernel, base}); err == nil {
		t.Error("an unsealed snapshot took another kernel file")
	}
	if err := d.SealSnapshot(t.Context(), snap); err != nil {
		t.Fatal(err)
	}
	mm, _ = readMeta(snap)
	if mm.Files[0].SHA256 == "" || mm.Files[1].SHA256 == "" {
		t.Fatalf("sealed files have no digests: %+v", mm.Files)
	}
	if err := d.sameFiles(mm.Files, []fileID{kernel, base}); err != nil {
		t.Errorf("the same files: %v", err)
	}
	if err := d.sameFiles(mm.Files, []fileID{otherKernel, base}); err != nil {
		t.Errorf("a kernel of the same content elsewhere: %v", err)
	}
	err := d.sameFiles(mm.Files, []fileID{otherKernel, otherBase})
	if err == nil || !strings.Contains(err.Error(), "root filesystem base here") {
		t.Errorf("a base of other content: %v", err)
	}
	// A sealed snapshot whose file changed since it was taken.
	write("kernel", "kernel bytes, rebuilt")
	os.WriteFile(filepath.Join(snap, snapMachine), []byte(meta), 0o600)
	if err := d.SealSnapshot(t.Context(), snap); err == nil {
		t.Error("SealSnapshot sealed a kernel that changed since the snapshot")
	}
}

func idJSON(f fileID) string {
	b, _ := json.Marshal(f)
	return string(b)
}

func TestNetdevState(t *testing.T) {
	const nic = "virtio-net-device.0: index=0,type=nic,model=virtio-net-device,macaddr=52:54:00:12:34:56\r\n"
	for _, c := range []struct{ info, want string }{
		{nic + " \\ net0: index=0,type=stream,\r\n", ""},
		{nic + " \\ net0: index=0,type=stream,unix:/b/net.sock\r\n", "unix:/b/net.sock"},
		{nic + " \\ net0: index=0,type=stream,listening\r\n", "listening"},
	} {
		got, ok := netdevState(c.info, "net0")
		if !ok || got != c.want {
			t.Errorf("netdevState(%q) = %q, %v; want %q", c.info, got, ok, c.want)
		}
	}
	if _, ok := netdevState(nic, "net0"); ok {
		t.Error("found net0 in output without it")
	}
}
