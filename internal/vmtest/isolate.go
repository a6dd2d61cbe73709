package vmtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/sparse"
)

// The user's directories as the environment named them before Isolate
// moved the test binary onto its own: the image store VM tests boot from
// (read only) and the cache that holds the guest kernel.
var shared struct {
	once          sync.Once
	images, cache string
}

func captureShared() {
	shared.once.Do(func() {
		shared.images = defaults.Images()
		shared.cache = defaults.Cache()
		if shared.images != "" {
			shared.images, _ = filepath.Abs(shared.images)
		}
		if shared.cache != "" {
			shared.cache, _ = filepath.Abs(shared.cache)
		}
	})
}

// isolatedEnv are the variables that point airlock (the library, `airlock
// serve` and the CLI) at a user's home, image store, server or token. Isolate
// replaces AIRLOCK_HOME and AIRLOCK_CACHE and unsets the others, so that a
// test that takes a default gets the test binary's own directories and
// never reaches the user's server.
var isolatedEnv = []string{"AIRLOCK_HOME", "AIRLOCK_IMAGES", "AIRLOCK_CACHE", "AIRLOCK_SOCKET", "AIRLOCK_TOKEN", "AIRLOCK_URL"}

// Isolate gives the test binary a home and an image store of its own,
// whatever the environment says: it records the user's image store and
// cache (for ImagesDir and the guest kernel), then points AIRLOCK_HOME at a
// new temporary directory, unsets AIRLOCK_IMAGES (the store is then
// AIRLOCK_HOME/images), AIRLOCK_SOCKET, AIRLOCK_TOKEN and AIRLOCK_URL, and
// pins AIRLOCK_CACHE to the user's cache (kernels and rootfs bases: content
// addressed, rebuilt on demand; a test that must not share it sets its
// own). Call it first in TestMain (Main does); the returned function, for
// after m.Run, removes the temporary directory and reports an error when
// the user's image store gained or lost images while the tests ran.
func Isolate() (done func() error, err error) {
	captureShared()
	dir, err := os.MkdirTemp("", "airlock-test-home-")
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(shared.images, "index.json")); err != nil {
		// No shared store (hack/setup.sh not run): VM tests skip, and
		// the tests that open ImagesDir get an empty one of their own
		// rather than creating one in the user's home.
		shared.images = filepath.Join(dir, "shared-images")
	}
	before := storeRefs(shared.images)
	for _, k := range isolatedEnv {
		os.Unsetenv(k)
	}
	os.Setenv("AIRLOCK_HOME", filepath.Join(dir, "home"))
	if shared.cache != "" {
		os.Setenv("AIRLOCK_CACHE", shared.cache)
	}
	return func() error {
		KillHome(dir)
		os.RemoveAll(dir)
		after := storeRefs(shared.images)
		if added, removed := diff(before, after); len(added)+len(removed) > 0 {
			return fmt.Errorf("the tests changed the shared image store %s (added %q, removed %q): a test wrote to vmtest.ImagesDir(), which is read only; give it its own store (vmtest.PrivateImages) — or another process changed the store while the tests ran", shared.images, added, removed)
		}
		return nil
	}, nil
}

// storeRefs lists the images of the store at dir (name@digest), read
// from its index.json without opening (and so creating) the store.
func storeRefs(dir string) []string {
	if dir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return nil
	}
	var idx struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if json.Unmarshal(b, &idx) != nil {
		return []string{"unreadable index.json"}
	}
	var out []string
	for _, m := range idx.Manifests {
		out = append(out, m.Annotations["org.opencontainers.image.ref.name"]+"@"+m.Digest)
	}
	slices.Sort(out)
	return out
}

func diff(before, after []string) (added, removed []string) {
	for _, a := range after {
		if !slices.Contains(before, a) {
			added = append(added, a)
		}
	}
	for _, b := range before {
		if !slices.Contains(after, b) {
			removed = append(removed, b)
		}
	}
	return added, removed
}

// ImagesDir is the shared image store that VM tests boot their images
// from: the user's (AIRLOCK_IMAGES, else ~/.airlock/images, as the
// environment said before Isolate), where hack/setup.sh builds them; where
// the user has none, an empty directory of the test binary's. Tests
// only read it; a test that pulls, commits, imports, tags or removes images
// uses PrivateImages.
func ImagesDir() string {
	captureShared()
	return shared.images
}

// PrivateImages returns a new image store of the test's own holding the
// shared store's images (hard links to its blobs, or copies where hard
// links fail), for tests that write images.
func PrivateImages(t interface {
	Helper()
	TempDir() string
	Fatalf(string, ...any)
}) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "images")
	if err := copyStore(ImagesDir(), dir); err != nil {
		t.Fatalf("copy the image store: %v", err)
	}
	return dir
}

// copyStore copies the image store src to dst: blobs are hard-linked where
// the filesystem allows (they are never rewritten in place), everything
// else (index.json, rewritten by rename; locks) is copied.
func copyStore(src, dst string) error {
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case fi.IsDir():
			return os.MkdirAll(to, 0o755)
		case !fi.Mode().IsRegular():
			return nil
		case strings.HasPrefix(rel, "blobs"+string(filepath.Separator)):
			if os.Link(p, to) == nil {
				return nil
			}
		}
		return sparse.CopyFile(p, to, fi.Mode().Perm())
	})
}

// OpenImages opens the shared image store (ImagesDir) for reading. Unlike
// image.Open it creates nothing: where no store exists it returns an
// error saying to run hack/setup.sh.
func OpenImages() (*image.Store, error) {
	dir := ImagesDir()
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, fmt.Errorf("no image store at %s (run hack/setup.sh): %w", dir, err)
	}
	return image.Open(dir)
}
