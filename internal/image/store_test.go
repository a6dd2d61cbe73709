package image_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
)

func testImage(t *testing.T) (base, top []byte) {
	base = imagetest.Tar(t,
		imagetest.Entry{Name: "etc/"},
		imagetest.Entry{Name: "etc/a", Body: "a"},
		imagetest.Entry{Name: "etc/b", Body: "bee"},
	)
	top = imagetest.Tar(t,
		imagetest.Entry{Name: "etc/.wh.a"},
		imagetest.Entry{Name: "etc/c", Body: "sea"},
	)
	return base, top
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"python:slim":                      "docker.io/library/python:slim",
		"python":                           "docker.io/library/python:latest",
		"docker.io/library/python:3.12":    "docker.io/library/python:3.12",
		"index.docker.io/foo/bar":          "docker.io/foo/bar:latest",
		"ghcr.io/o/r":                      "ghcr.io/o/r:latest",
		"localhost:5000/x:y":               "localhost:5000/x:y",
		"127.0.0.1:5000/a/b/c:t":           "127.0.0.1:5000/a/b/c:t",
		"python:slim@sha256:" + hex64('a'): "docker.io/library/python@sha256:" + hex64('a'),
	} {
		got, err := image.Normalize(in)
		if err != nil || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := image.Normalize("UPPER/case"); err == nil {
		t.Errorf("Normalize accepted an invalid name")
	}
}

func hex64(c byte) string { return strings.Repeat(string(c), 64) }

func TestPullResolveTagRemove(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base, top := testImage(t)
	ref := reg.Push(t, "test/app:v1", imagetest.Image(t, []string{"sh"}, base, top))
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ref); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("Resolve before pull: %v, want ErrNotFound", err)
	}
	var mu sync.Mutex
	progress := map[string]int64{}
	img, err := s.Pull(context.Background(), ref, image.PullOptions{Progress: func(d string, done, total int64) {
		mu.Lock()
		progress[d] = done
		mu.Unlock()
		if total >= 0 && done > total {
			t.Errorf("progress %s: %d > %d", d, done, total)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if img.Ref != ref || img.Source != "pulled from "+ref || !strings.HasPrefix(img.Digest, "sha256:") {
		t.Errorf("pulled image = %+v", img)
	}
	if len(img.Config.Cmd) != 1 || img.Config.Cmd[0] != "sh" || img.Config.WorkingDir != "/work" || img.Created.IsZero() || img.Size <= 0 {
		t.Errorf("config = %+v", img)
	}
	if len(progress) != 2 {
		t.Errorf("progress reported for %d layers, want 2", len(progress))
	}
	gets := reg.BlobGets()
	if gets == 0 {
		t.Fatalf("no blob GETs counted")
	}

	// A second pull downloads no blobs.
	img2, err := s.Pull(context.Background(), ref, image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if reg.BlobGets() != gets {
		t.Errorf("second pull made %d blob GETs", reg.BlobGets()-gets)
	}
	if img2.Digest != img.Digest {
		t.Errorf("digest changed: %s vs %s", img2.Digest, img.Digest)
	}

	// Resolve by name, digest prefix and digest reference.
	for _, r := range []string{ref, img.Digest, img.Digest[7:19], strings.TrimSuffix(ref, ":v1") + "@" + img.Digest} {
		got, err := s.Resolve(r)
		if err != nil {
			t.Errorf("Resolve(%q): %v", r, err)
			continue
		}
		if got.Digest != img.Digest {
			t.Errorf("Resolve(%q) = %s", r, got.Digest)
		}
	}

	layers, err := s.Layers(img)
	if err != nil || len(layers) != 2 {
		t.Fatalf("Layers = %v, %v", layers, err)
	}
	rc, err := layers[0].Open()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	buf.ReadFrom(rc)
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), base) {
		t.Errorf("layer 0 round trip differs")
	}

	if err := s.Tag(ref, "mine:latest"); err != nil {
		t.Fatal(err)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].Ref != ref || list[1].Ref != "docker.io/library/mine:latest" {
		t.Fatalf("List = %v, %v", list, err)
	}
	if list[1].Source != img.Source {
		t.Errorf("tag lost the source: %q", list[1].Source)
	}
	// What a removal takes away: one name of two keeps the content; a
	// digest takes every name.
	if im, untag, last, err := s.Untags("mine"); err != nil || im.Digest != img.Digest || len(untag) != 1 || untag[0] != "docker.io/library/mine:latest" || last {
		t.Errorf("Untags(mine) = %v %v %v", untag, last, err)
	}
	if _, untag, last, err := s.Untags(img.Digest); err != nil || len(untag) != 2 || !last {
		t.Errorf("Untags(digest) = %v %v %v", untag, last, err)
	}
	if _, _, _, err := s.Untags("nosuch"); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("Untags(nosuch): %v", err)
	}
	if err := s.Remove("mine"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ref); err != nil {
		t.Fatalf("removing the other name removed %s: %v", ref, err)
	}
	if err := s.Remove(ref); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(s.Dir(), "blobs", "sha256"))
	if len(ents) != 0 {
		t.Errorf("%d blobs left after removing every image", len(ents))
	}
	if err := s.Remove(ref); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("second Remove: %v", err)
	}
}

func TestPullCorruptBlobRejected(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base, top := testImage(t)
	img := imagetest.Image(t, nil, base, top)
	ref := reg.Push(t, "test/bad:v1", img)
	ls, _ := img.Layers()
	d, _ := ls[1].Digest()
	reg.Corrupt(d.String())
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Pull(context.Background(), ref, image.PullOptions{})
	if !errors.Is(err, image.ErrDigestMismatch) {
		t.Fatalf("Pull of a corrupt blob: %v, want ErrDigestMismatch", err)
	}
	t.Logf("error: %v", err)
	if _, err := os.Stat(filepath.Join(s.Dir(), "blobs", "sha256", d.Hex)); err == nil {
		t.Errorf("corrupt blob was kept")
	}
	if _, err := s.Resolve(ref); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("image named after a failed pull: %v", err)
	}
}

func TestStoredBlobDamageDetected(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base, top := testImage(t)
	ref := reg.Push(t, "test/app:v1", imagetest.Image(t, nil, base, top))
	s, _ := image.Open(t.TempDir())
	img, err := s.Pull(context.Background(), ref, image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := s.Layers(img)
	p := filepath.Join(s.Dir(), "blobs", "sha256", strings.TrimPrefix(layers[0].Digest, "sha256:"))
	b, _ := os.ReadFile(p)
	b[len(b)-3] ^= 0x55
	os.WriteFile(p, b, 0o644)
	rc, err := layers[0].Open()
	if err == nil {
		_, rerr := bytes.NewBuffer(nil).ReadFrom(rc)
		err = errors.Join(rerr, rc.Close())
	}
	if !errors.Is(err, image.ErrDigestMismatch) {
		t.Errorf("reading a damaged blob: %v, want ErrDigestMismatch", err)
	}
}

func TestConcurrentPulls(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base, top := testImage(t)
	ref := reg.PushIndex(t, "test/multi:v1", imagetest.Image(t, nil, base, top), "linux/arm64", "linux/amd64")
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	digests := make([]string, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := image.Open(dir) // separate Store values, as separate processes would have
			if err != nil {
				errs[i] = err
				return
			}
			img, err := s.Pull(context.Background(), ref, image.PullOptions{})
			errs[i] = err
			if img != nil {
				digests[i] = img.Digest
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("pull %d: %v", i, err)
		}
		if digests[i] != digests[0] {
			t.Errorf("pull %d digest %s != %s", i, digests[i], digests[0])
		}
	}
	// Layers were fetched once each (plus the config), not once per pull.
	if n := reg.BlobGets(); n > 3 {
		t.Errorf("%d blob GETs for 4 concurrent pulls of a 2-layer image", n)
	}
	s, _ := image.Open(dir)
	if list, err := s.List(); err != nil || len(list) != 1 {
		t.Errorf("List = %v, %v", list, err)
	}
}

func TestPullNoAmd64(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base, _ := testImage(t)
	ref := reg.PushIndex(t, "test/arm:v1", imagetest.Image(t, nil, base), "linux/arm64")
	s, _ := image.Open(t.TempDir())
	_, err := s.Pull(context.Background(), ref, image.PullOptions{})
	t.Logf("error: %v", err)
	if !errors.Is(err, image.ErrNoPlatform) || !strings.Contains(err.Error(), "linux/arm64") {
		t.Errorf("Pull: %v, want ErrNoPlatform listing linux/arm64", err)
	}
}

func TestPullErrors(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s, _ := image.Open(t.TempDir())
	_, err := s.Pull(context.Background(), reg.Host+"/no/such:tag", image.PullOptions{})
	if !errors.Is(err, image.ErrNotFound) {
		t.Errorf("missing image: %v, want ErrNotFound", err)
	}
	// A closed loopback port: unreachable.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = s.Pull(context.Background(), addr+"/x/y:z", image.PullOptions{})
	t.Logf("error: %v", err)
	if !errors.Is(err, image.ErrUnreachable) || !strings.Contains(err.Error(), "airlock import") || !strings.Contains(err.Error(), "not a local image") {
		t.Errorf("unreachable registry: %v", err)
	}
}

func TestSaveImport(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base, top := testImage(t)
	ref := reg.Push(t, "test/app:v1", imagetest.Image(t, []string{"sh"}, base, top))
	s, _ := image.Open(t.TempDir())
	img, err := s.Pull(context.Background(), ref, image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "app.tar")
	f, _ := os.Create(tarPath)
	if err := s.Save(ref, f); err != nil {
		t.Fatal(err)
	}
	f.Close()

	s2, _ := image.Open(t.TempDir())
	imgs, err := s2.Import(context.Background(), tarPath, image.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Ref != ref || imgs[0].Source != "imported from "+tarPath || imgs[0].Config.Cmd[0] != "sh" {
		t.Fatalf("imported %+v", *imgs[0])
	}
	layers, err := s2.Layers(imgs[0])
	if err != nil || len(layers) != 2 || layers[0].DiffID == "" {
		t.Fatalf("layers %v %v", layers, err)
	}
	orig, _ := s.Layers(img)
	if layers[1].DiffID != orig[1].DiffID {
		t.Errorf("diff ids differ after save/import")
	}

	// Import the first store as an OCI layout folder, renamed.
	s3, _ := image.Open(t.TempDir())
	imgs, err = s3.Import(context.Background(), s.Dir(), image.ImportOptions{Ref: "copied:1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Ref != "docker.io/library/copied:1" || imgs[0].Digest != img.Digest {
		t.Fatalf("layout import %+v", imgs)
	}
	// And without a rename, names come from the layout annotations.
	imgs, err = s3.Import(context.Background(), s.Dir(), image.ImportOptions{})
	if err != nil || len(imgs) != 1 || imgs[0].Ref != ref {
		t.Fatalf("layout import by annotation %+v %v", imgs, err)
	}
}

func TestPullUnauthorized(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
	}))
	defer srv.Close()
	s, _ := image.Open(t.TempDir())
	_, err := s.Pull(context.Background(), strings.TrimPrefix(srv.URL, "http://")+"/private/app:v1", image.PullOptions{})
	t.Logf("error: %v", err)
	if !errors.Is(err, image.ErrUnauthorized) || !strings.Contains(err.Error(), "airlock login "+strings.TrimPrefix(srv.URL, "http://")) {
		t.Errorf("Pull from a registry that wants credentials: %v", err)
	}
}

func TestImportOCIArchive(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base, top := testImage(t)
	ref := reg.Push(t, "test/app:v1", imagetest.Image(t, []string{"sh"}, base, top))
	s, _ := image.Open(t.TempDir())
	img, err := s.Pull(context.Background(), ref, image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Tar up the store's OCI layout (index.json, oci-layout, blobs/).
	archive := filepath.Join(t.TempDir(), "app.oci.tar")
	if out, err := exec.Command("tar", "-C", s.Dir(), "-cf", archive, "oci-layout", "index.json", "blobs").CombinedOutput(); err != nil {
		t.Skipf("tar: %v: %s", err, out)
	}
	s2, _ := image.Open(t.TempDir())
	imgs, err := s2.Import(context.Background(), archive, image.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Ref != ref || imgs[0].Digest != img.Digest || !strings.HasPrefix(imgs[0].Source, "imported from ") {
		t.Fatalf("imported %+v", imgs)
	}
	// Not an image at all.
	junk := filepath.Join(t.TempDir(), "junk.tar")
	os.WriteFile(junk, []byte("not a tar"), 0o644)
	if _, err := s2.Import(context.Background(), junk, image.ImportOptions{}); err == nil {
		t.Errorf("imported junk")
	}
}
