package airlock_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/cli"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// defaultImage returns the default python:slim image as a go-containerregistry
// image read straight from the shared store (an OCI layout), so its layers
// are used as stored, without recompressing them.
func defaultImage(t testing.TB) v1.Image {
	t.Helper()
	s, err := vmtest.OpenImages()
	if err != nil {
		t.Fatal(err)
	}
	def, err := s.Resolve(vmtest.DefaultImage)
	if err != nil {
		t.Fatal(err)
	}
	h, err := v1.NewHash(def.Digest)
	if err != nil {
		t.Fatal(err)
	}
	img, err := layout.Path(s.Dir()).Image(h)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func tarLayer(t testing.TB, entries ...imagetest.Entry) v1.Layer {
	t.Helper()
	b := imagetest.Tar(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// layeredImage is python:slim plus two layers exercising the layer
// changeset rules, with its own Env, WorkingDir, User and Cmd.
func layeredImage(t testing.TB) v1.Image {
	t.Helper()
	lower := tarLayer(t,
		imagetest.Entry{Name: "opt/layered/"},
		imagetest.Entry{Name: "opt/layered/keep", Body: "keep\n"},
		imagetest.Entry{Name: "opt/layered/gone", Body: "gone\n"},
		imagetest.Entry{Name: "opt/layered/dir/"},
		imagetest.Entry{Name: "opt/layered/dir/old"},
		imagetest.Entry{Name: "opt/layered/dir/sub/"},
		imagetest.Entry{Name: "opt/layered/dir/sub/older"},
		imagetest.Entry{Name: "opt/layered/work/"},
	)
	upper := tarLayer(t,
		imagetest.Entry{Name: "etc/.wh.debian_version"}, // a file of the base image
		imagetest.Entry{Name: "opt/layered/.wh.gone"},   // a file of the layer below
		imagetest.Entry{Name: "opt/layered/dir/"},       // replaced: opaque
		imagetest.Entry{Name: "opt/layered/dir/.wh..wh..opq"},
		imagetest.Entry{Name: "opt/layered/dir/new", Body: "new\n"},
		imagetest.Entry{Name: "opt/layered/hard", Type: tar.TypeLink, Linkname: "opt/layered/keep"}, // across layers
		imagetest.Entry{Name: "opt/layered/same", Body: "same\n"},
		imagetest.Entry{Name: "opt/layered/same-link", Type: tar.TypeLink, Linkname: "opt/layered/same"}, // within the layer
		imagetest.Entry{Name: "opt/layered/sym", Type: tar.TypeSymlink, Linkname: "keep"},
		imagetest.Entry{Name: "opt/layered/abs-sym", Type: tar.TypeSymlink, Linkname: "/opt/layered/dir/new"},
	)
	img, err := mutate.AppendLayers(defaultImage(t), lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.Env = append(cf.Config.Env, "LAYERED=yes")
	cf.Config.WorkingDir = "/opt/layered/work"
	cf.Config.User = "nobody"
	cf.Config.Entrypoint = nil
	cf.Config.Cmd = []string{"sh", "-c", `echo "cmd-ran $LAYERED $(pwd) $(id -u)"`}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// runCLI runs the airlock CLI in-process.
func runCLI(args ...string) (string, string, error) {
	var out, errb bytes.Buffer
	root := cli.NewRoot(cli.Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

// TestBoxFromRegistryImage pulls an image with whiteouts, an opaque
// directory, hard links and symlinks from a loopback registry into an empty
// store, boots a box from it and checks the merged tree and the image config
// from inside the box. It also checks that 'airlock rmi' refuses the image
// while the box uses it.
func TestBoxFromRegistryImage(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	reg := imagetest.NewRegistry(t)
	ref := reg.Push(t, "test/layered:1", layeredImage(t))

	home := t.TempDir()
	// The CLI below works on this home; its store starts empty.
	t.Setenv("AIRLOCK_HOME", home)
	t.Setenv("AIRLOCK_IMAGES", "")
	r, err := airlock.Open(airlock.Options{Home: home, ImagesDir: filepath.Join(home, "images"), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	store, err := image.Open(filepath.Join(home, "images"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Resolve(ref); !errors.Is(err, image.ErrNotFound) {
		t.Fatalf("store not empty: %v", err)
	}

	b, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Name: "layered"})
	if err != nil {
		t.Fatal(err)
	}
	info, _ := b.Info(ctx)
	// The base built for this image lives in the shared cache: drop it.
	t.Cleanup(func() { rootfs.RemoveBase(context.Background(), defaults.Cache(), info.ImageDigest) })
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
	img, err := store.Resolve(ref)
	if err != nil || !strings.HasPrefix(img.Source, "pulled from ") {
		t.Fatalf("image not pulled into the box's store: %v %+v", err, img)
	}

	sh := func(t *testing.T, script string) string {
		t.Helper()
		res := exec(t, b, airlock.ExecOptions{}, "sh", "-c", script)
		if res.ExitCode != 0 {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", script, res.ExitCode, res.Stdout, res.Stderr)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	t.Run("whiteout", func(t *testing.T) {
		got := sh(t, `for f in /etc/debian_version /opt/layered/gone /opt/layered/keep; do if [ -e $f ]; then echo "$f here"; else echo "$f gone"; fi; done`)
		if want := "/etc/debian_version gone\n/opt/layered/gone gone\n/opt/layered/keep here"; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("opaque dir", func(t *testing.T) {
		if got := sh(t, "ls -A /opt/layered/dir; cat /opt/layered/dir/new"); got != "new\nnew" {
			t.Errorf("dir holds %q, want only new", got)
		}
	})
	t.Run("hard links", func(t *testing.T) {
		got := strings.Fields(sh(t, "cd /opt/layered && stat -c '%i %h' keep hard same same-link && cat hard same-link"))
		if len(got) != 10 || got[0] != got[2] || got[4] != got[6] || got[0] == got[4] ||
			got[1] != "2" || got[3] != "2" || got[5] != "2" || got[7] != "2" || got[8] != "keep" || got[9] != "same" {
			t.Errorf("stat %%i %%h of keep hard same same-link, then contents: %q", got)
		}
	})
	t.Run("symlinks", func(t *testing.T) {
		if got := sh(t, "cd /opt/layered && readlink sym abs-sym && cat sym abs-sym"); got != "keep\n/opt/layered/dir/new\nkeep\nnew" {
			t.Errorf("got %q", got)
		}
	})
	t.Run("config", func(t *testing.T) {
		if got := sh(t, `echo "$LAYERED $(pwd) $(id -u) $(python3 -c 'print(6*7)')"`); got != "yes /opt/layered/work 65534 42" {
			t.Errorf("env, working dir, user (and the base layer's python3): %q", got)
		}
		argv := b.DefaultCommand()
		if !slices.Equal(argv, []string{"sh", "-c", `echo "cmd-ran $LAYERED $(pwd) $(id -u)"`}) {
			t.Fatalf("DefaultCommand = %q", argv)
		}
		res := exec(t, b, airlock.ExecOptions{}, argv[0], argv[1:]...)
		if got := strings.TrimSpace(string(res.Stdout)); res.ExitCode != 0 || got != "cmd-ran yes /opt/layered/work 65534" {
			t.Errorf("default command: exit %d, %q %q", res.ExitCode, got, res.Stderr)
		}
	})
	t.Run("rmi refused while in use", func(t *testing.T) {
		_, errs, err := runCLI("rmi", ref)
		if err == nil || !strings.Contains(errs, "used by box(es) "+b.ID()) {
			t.Fatalf("rmi of an image in use: %v %q", err, errs)
		}
		if _, err := store.Resolve(ref); err != nil {
			t.Fatalf("refused rmi removed the image: %v", err)
		}
		if err := r.Remove(ctx, b.ID(), true); err != nil {
			t.Fatal(err)
		}
		base := rootfs.BasePath(defaults.Cache(), img.Digest)
		if _, err := os.Stat(base); err != nil {
			t.Fatalf("no rootfs base: %v", err)
		}
		out, errs, err := runCLI("rmi", ref)
		if err != nil || !strings.Contains(out, "Deleted: "+img.Digest) {
			t.Fatalf("rmi once unused: %v %q %q", err, out, errs)
		}
		if _, err := os.Stat(base); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("rmi left the rootfs base: %v", err)
		}
	})
}

// TestImageLayerEscape checks that a pulled image whose layers try to write
// outside the root — a "../" name, a hard link to "../", or a file under a
// symlink that points out of the root — cannot: building its root
// filesystem fails with ErrUnsafePath or stays inside the tree, and nothing
// appears outside. (internal/image/unpack's TestUnsafe covers more cases at
// unit level.)
func TestImageLayerEscape(t *testing.T) {
	if testing.Short() {
		t.Skip("builds root filesystems")
	}
	reg := imagetest.NewRegistry(t)
	work := t.TempDir()
	victim := filepath.Join(work, "victim")
	for _, c := range []struct {
		name   string
		layers [][]byte
		refuse bool
	}{
		{"dotdot", [][]byte{imagetest.Tar(t, imagetest.Entry{Name: "../escape", Body: "pwned"})}, true},
		{"deep dotdot", [][]byte{imagetest.Tar(t, imagetest.Entry{Name: "a/../../../../../../../../" + strings.TrimPrefix(victim, "/"), Body: "pwned"})}, true},
		{"hard link out", [][]byte{imagetest.Tar(t, imagetest.Entry{Name: "h", Type: tar.TypeLink, Linkname: "../../../../../../../../etc/passwd"})}, true},
		{"symlink parent", [][]byte{
			imagetest.Tar(t, imagetest.Entry{Name: "evil", Type: tar.TypeSymlink, Linkname: "../../../../../../../../" + strings.TrimPrefix(work, "/")}),
			imagetest.Tar(t, imagetest.Entry{Name: "evil/victim", Body: "pwned"}),
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := reg.Push(t, "test/escape-"+strings.ReplaceAll(c.name, " ", "-")+":1", imagetest.Image(t, []string{"/bin/sh"}, c.layers...))
			s, err := image.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			img, err := s.Pull(context.Background(), ref, image.PullOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cache := filepath.Join(work, "cache")
			_, err = rootfs.Base(context.Background(), s, img, cache)
			if c.refuse && !errors.Is(err, unpack.ErrUnsafePath) {
				t.Errorf("Base: %v, want ErrUnsafePath", err)
			}
			if !c.refuse && err != nil {
				t.Errorf("Base: %v", err)
			}
			for _, p := range []string{victim, filepath.Join(cache, "escape"), filepath.Join(cache, "rootfs", "escape"), filepath.Join(filepath.Dir(cache), "escape")} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was written outside the root", p)
				}
			}
		})
	}
}

// TestBoxDiskSize fills a box's 64 MiB writable layer: the writer gets
// ENOSPC inside the box, and the box keeps answering.
func TestBoxDiskSize(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	r := openRuntime(t, "")
	b, err := r.Create(ctx, airlock.BoxOptions{DiskSizeMiB: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove(context.Background(), b.ID(), true) })
	res := exec(t, b, airlock.ExecOptions{}, "dd", "if=/dev/zero", "of=/var/tmp/big", "bs=1M", "count=100")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left on device") {
		t.Fatalf("writing 100 MB to a 64 MiB disk: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	res = exec(t, b, airlock.ExecOptions{}, "sh", "-c", "echo alive; rm /var/tmp/big && echo ok > /var/tmp/small && cat /var/tmp/small")
	if res.ExitCode != 0 || string(res.Stdout) != "alive\nok\n" {
		t.Fatalf("after ENOSPC: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}
