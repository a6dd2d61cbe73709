package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	airlockcli "github.com/airlock-run/airlock/internal/cli"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/store"
)

// airlock runs the CLI with args and returns its stdout, stderr and error.
func airlock(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	root := airlockcli.NewRoot(airlockcli.Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

func mustAirlock(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, err := airlock(t, args...)
	if err != nil {
		t.Fatalf("airlock %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errs)
	}
	return out
}

// TestImageVerbs runs images, import, save, rmi and pull against a
// temporary AIRLOCK_HOME; no VM is booted.
func TestImageVerbs(t *testing.T) {
	home, cache := t.TempDir(), t.TempDir()
	t.Setenv("AIRLOCK_HOME", home)
	t.Setenv("AIRLOCK_CACHE", cache)
	t.Setenv("AIRLOCK_IMAGES", "")
	work := t.TempDir()

	img := imagetest.Image(t, []string{"/bin/hello"}, imagetest.Tar(t,
		imagetest.Entry{Name: "bin/"},
		imagetest.Entry{Name: "bin/hello", Body: "#!/bin/sh\necho hi\n", Mode: 0o755},
	))
	dockerTar := filepath.Join(work, "small.tar")
	if err := tarball.WriteToFile(dockerTar, name.MustParseReference("example.com/test/small:v1"), img); err != nil {
		t.Fatal(err)
	}
	ociDir := filepath.Join(work, "oci")
	lp, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil { // no name recorded: needs --tag
		t.Fatal(err)
	}

	if out := mustAirlock(t, "images"); strings.TrimSpace(out) != "REPOSITORY   TAG   DIGEST   SIZE   CREATED   SOURCE" {
		t.Errorf("empty images = %q", out)
	}

	out := mustAirlock(t, "import", dockerTar)
	if !strings.Contains(out, "Imported example.com/test/small:v1 (sha256:") {
		t.Errorf("import docker tar: %q", out)
	}
	if _, errs, err := airlock(t, "import", ociDir); err == nil || !strings.Contains(errs+err.Error(), "no name") {
		t.Errorf("import of an unnamed layout without --tag: %v %q", err, errs)
	}
	out = mustAirlock(t, "import", ociDir, "--tag", "other:1")
	if !strings.Contains(out, "Imported docker.io/library/other:1") {
		t.Errorf("import layout: %q", out)
	}

	out = mustAirlock(t, "images")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("images:\n%s", out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`^REPOSITORY +TAG +DIGEST +SIZE +CREATED +SOURCE$`),
		regexp.MustCompile(`^example\.com/test/small +v1 +[0-9a-f]{12} +\d+ B +\d+ years ago +imported from ` + regexp.QuoteMeta(dockerTar) + `$`),
		regexp.MustCompile(`^other +1 +[0-9a-f]{12} +\d+ B +\d+ years ago +imported from ` + regexp.QuoteMeta(ociDir) + `$`),
	} {
		found := false
		for _, l := range lines {
			found = found || want.MatchString(l)
		}
		if !found {
			t.Errorf("images: no line matches %s:\n%s", want, out)
		}
	}
	if out := mustAirlock(t, "images", "other"); strings.Contains(out, "small") || !strings.Contains(out, "other") {
		t.Errorf("images other:\n%s", out)
	}
	digests := strings.Fields(mustAirlock(t, "images", "-q"))
	if len(digests) != 1 || len(digests[0]) != 12 {
		t.Errorf("images -q = %q, want one short digest (both names share the image)", digests)
	}

	saved := filepath.Join(work, "saved.tar")
	mustAirlock(t, "save", "example.com/test/small:v1", "-o", saved)
	if fi, err := os.Stat(saved); err != nil || fi.Size() == 0 {
		t.Fatalf("save wrote nothing: %v", err)
	}
	if _, errs, err := airlock(t, "save", "nope:1", "-o", filepath.Join(work, "nope.tar")); err == nil || !strings.Contains(err.Error(), "no such image") {
		t.Errorf("save of a missing image: %v %q", err, errs)
	}
	if _, err := os.Stat(filepath.Join(work, "nope.tar")); err == nil {
		t.Errorf("failed save left a file")
	}

	// rmi: a shared name is only untagged.
	out = mustAirlock(t, "rmi", "example.com/test/small:v1")
	if !strings.Contains(out, "Untagged: example.com/test/small:v1") || strings.Contains(out, "Deleted") {
		t.Errorf("rmi of a shared name: %q", out)
	}

	// rmi is refused while a box uses the image, unless -f.
	s, err := image.Open(filepath.Join(home, "images"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := s.Resolve("other:1")
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(filepath.Join(home, "state.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Insert(context.Background(), &store.Box{ID: "0123456789ab", Image: "other:1", ImageDigest: other.Digest,
		Config: []byte("{}"), State: store.StateStopped, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	base := rootfs.BasePath(cache, other.Digest)
	os.MkdirAll(filepath.Dir(base), 0o755)
	os.WriteFile(base, []byte("fake base"), 0o644)
	_, errs, err := airlock(t, "rmi", "other:1")
	if err == nil || !strings.Contains(errs, "used by box(es) 0123456789ab") || !strings.Contains(errs, "rmi -f") {
		t.Errorf("rmi of an image in use: %v %q", err, errs)
	}
	if _, err := s.Resolve("other:1"); err != nil {
		t.Errorf("refused rmi removed the image: %v", err)
	}
	out, errs, err = airlock(t, "rmi", "-f", "other:1")
	if err != nil || !strings.Contains(out, "Deleted: "+other.Digest) || !strings.Contains(errs, "cannot start again") {
		t.Errorf("rmi -f: %v %q %q", err, out, errs)
	}
	if _, err := os.Stat(base); err != nil {
		t.Errorf("rmi -f removed the base a box still uses: %v", err)
	}

	// Import what was saved: the name comes back from the tarball.
	out = mustAirlock(t, "import", saved)
	if !strings.Contains(out, "Imported example.com/test/small:v1") {
		t.Errorf("import of a saved tarball: %q", out)
	}
	if out := mustAirlock(t, "images"); !strings.Contains(out, "imported from "+saved) {
		t.Errorf("images after re-import:\n%s", out)
	}
	if _, errs, err := airlock(t, "rmi", "nope:1"); err == nil || !strings.Contains(errs, "no such image") {
		t.Errorf("rmi of a missing image: %v %q", err, errs)
	}
}

// TestPullVerb pulls from a loopback registry without a terminal: one line
// per layer, then the result; an unreachable registry says what to do.
func TestPullVerb(t *testing.T) {
	home, cache := t.TempDir(), t.TempDir()
	t.Setenv("AIRLOCK_HOME", home)
	t.Setenv("AIRLOCK_CACHE", cache)
	t.Setenv("AIRLOCK_IMAGES", "")
	reg := imagetest.NewRegistry(t)
	l1 := imagetest.Tar(t, imagetest.Entry{Name: "a", Body: strings.Repeat("a", 100000)})
	l2 := imagetest.Tar(t, imagetest.Entry{Name: "b", Body: "b"})
	ref := reg.Push(t, "test/app:v1", imagetest.Image(t, []string{"/a"}, l1, l2))

	out, errs, err := airlock(t, "pull", ref)
	if err != nil {
		t.Fatalf("pull: %v %s", err, errs)
	}
	if !strings.HasPrefix(out, "Pulled "+ref+" (sha256:") {
		t.Errorf("pull stdout %q", out)
	}
	if n := len(regexp.MustCompile(`(?m)^[0-9a-f]{12}: downloaded \d`).FindAllString(errs, -1)); n != 2 {
		t.Errorf("pull stderr: want 2 layer lines:\n%s", errs)
	}
	_, errs, err = airlock(t, "pull", ref)
	if err != nil || strings.Count(errs, "already present") != 2 {
		t.Errorf("second pull: %v\n%s", err, errs)
	}
	if out := mustAirlock(t, "images"); !strings.Contains(out, "pulled from "+ref) {
		t.Errorf("images after pull:\n%s", out)
	}

	_, _, err = airlock(t, "pull", "127.0.0.1:1/test/none:v1")
	if err == nil || !strings.Contains(err.Error(), "airlock import") || !strings.Contains(err.Error(), "build-debian") {
		t.Errorf("pull from an unreachable registry: %v", err)
	}
}
