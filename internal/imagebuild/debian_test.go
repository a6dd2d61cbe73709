package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/unpack"
)

func TestFilterLayer(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666},
		{Name: "./usr/bin/a", Typeflag: tar.TypeReg, Mode: 0o755, Size: 1},
		{Name: "./usr/bin/b", Typeflag: tar.TypeLink, Linkname: "./usr/bin/a"},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.tar"), filepath.Join(dir, "out.tar.gz")
	os.WriteFile(in, buf.Bytes(), 0o644)
	n, err := filterLayer(in, out)
	if err != nil || n != 1 {
		t.Fatalf("filterLayer = %d, %v", n, err)
	}
	f, _ := os.Open(out)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name+">"+h.Linkname)
	}
	if got := strings.Join(names, " "); got != "dev/> usr/bin/a> usr/bin/b>usr/bin/a" {
		t.Errorf("entries = %s", got)
	}
}

// TestBuildDebian builds a real image; it needs mmdebstrap, root and the
// Debian mirror, and takes minutes, so it only runs with
// AIRLOCK_TEST_DEBIAN=1.
func TestBuildDebian(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_DEBIAN") == "" {
		t.Skip("set AIRLOCK_TEST_DEBIAN=1 to build a real Debian image (needs mmdebstrap, root, network)")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("mmdebstrap not installed")
	}
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := BuildDebian(context.Background(), s, DebianOptions{Packages: []string{"python3"}, Tag: "test/py:1", Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	if img.Config.Cmd[0] != "python3" || img.Config.Labels[LabelPackages] != "python3" || !strings.Contains(img.Source, "(bookworm): python3") {
		t.Errorf("image = %+v", img)
	}
	root := t.TempDir()
	if err := unpack.Image(context.Background(), s, img, root, unpack.Options{}); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(filepath.Join(root, "usr/local/bin/python")); err != nil || l != "/usr/bin/python3" {
		t.Errorf("python link = %q, %v", l, err)
	}
	m, _ := filepath.Glob(filepath.Join(root, "usr/lib/python3*/EXTERNALLY-MANAGED"))
	if len(m) != 0 {
		t.Errorf("EXTERNALLY-MANAGED kept: %v", m)
	}
	if os.Geteuid() == 0 {
		out, err := exec.Command("chroot", root, "/usr/local/bin/python", "-c", "print(6*7)").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "42" {
			t.Errorf("python in the image: %q, %v", out, err)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
