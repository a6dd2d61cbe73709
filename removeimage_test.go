package airlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// TestRemoveImage: untag a shared name, refuse while a box uses the
// image, remove it and its root filesystem base (in Options.CacheDir) when
// forced.
func TestRemoveImage(t *testing.T) {
	ctx := context.Background()
	images, cache := t.TempDir(), t.TempDir()
	s, err := image.Open(images)
	if err != nil {
		t.Fatal(err)
	}
	img, err := s.WriteImage(ctx, "test/rmi:v1", imagetest.Image(t, []string{"sh"}), "test image", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Tag("test/rmi:v1", "test/rmi:other"); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	r, err := airlock.OpenWithDriver(airlock.Options{Home: home, ImagesDir: images, CacheDir: cache, Warn: func(string) {}},
		fake.New(os.Getenv("AIRLOCK_AGENT")))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := r.Create(ctx, airlock.BoxOptions{Image: "test/rmi:v1"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(ctx, true)
	base := rootfs.BasePath(cache, img.Digest)
	os.MkdirAll(filepath.Dir(base), 0o755)
	os.WriteFile(base, []byte("a base"), 0o644)

	res, err := r.RemoveImage(ctx, "test/rmi:other", false)
	if err != nil || len(res.Untagged) != 1 || res.Deleted != "" {
		t.Fatalf("untag of a shared name: %+v %v", res, err)
	}
	_, err = r.RemoveImage(ctx, "test/rmi:v1", false)
	var iu *airlock.ImageInUseError
	if !errors.Is(err, airlock.ErrImageInUse) || !errors.As(err, &iu) || len(iu.Boxes) != 1 || iu.Boxes[0] != b.ID() {
		t.Fatalf("removal of an image in use: %v", err)
	}
	if _, err := s.Resolve("test/rmi:v1"); err != nil {
		t.Fatalf("refused removal removed the image: %v", err)
	}
	res, err = r.RemoveImage(ctx, "test/rmi:v1", true)
	if err != nil || res.Deleted != img.Digest || len(res.UsedBy) != 1 {
		t.Fatalf("forced removal: %+v %v", res, err)
	}
	if _, err := r.RemoveImage(ctx, "test/rmi:v1", false); !errors.Is(err, airlock.ErrImageNotFound) {
		t.Fatalf("removal of a missing image: %v", err)
	}

	// Without users, the base goes too, from Options.CacheDir.
	img2, err := s.WriteImage(ctx, "test/rmi:v2", imagetest.Image(t, []string{"true"}), "test image", nil)
	if err != nil {
		t.Fatal(err)
	}
	base2 := rootfs.BasePath(cache, img2.Digest)
	os.MkdirAll(filepath.Dir(base2), 0o755)
	os.WriteFile(base2, []byte("a base"), 0o644)
	if res, err := r.RemoveImage(ctx, "test/rmi:v2", false); err != nil || res.Deleted != img2.Digest || res.BaseErr != nil {
		t.Fatalf("removal: %+v %v", res, err)
	}
	if _, err := os.Stat(base2); !os.IsNotExist(err) {
		t.Fatalf("base left in the cache: %v", err)
	}

	// A snapshot of a box of the image (its record, as Box.Snapshot
	// writes it; the fake driver cannot take one) holds it too.
	img3, err := s.WriteImage(ctx, "test/rmi:v3", imagetest.Image(t, []string{"true"}), "test image", nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(home, "snapshots", "keep")
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "snapshot.json"), []byte(`{"v":1,"name":"keep","box":"0123456789ab","image":"test/rmi:v3","image_digest":"`+img3.Digest+`"}`), 0o600)
	_, err = r.RemoveImage(ctx, "test/rmi:v3", false)
	if !errors.Is(err, airlock.ErrImageInUse) || !errors.As(err, &iu) || len(iu.Snapshots) != 1 || iu.Snapshots[0] != "keep" ||
		!strings.Contains(err.Error(), "snapshot rm") {
		t.Fatalf("removal of an image a snapshot restores from: %v", err)
	}
	if res, err := r.RemoveImage(ctx, "test/rmi:v3", true); err != nil || res.Deleted != img3.Digest {
		t.Fatalf("forced removal: %+v %v", res, err)
	}
}
