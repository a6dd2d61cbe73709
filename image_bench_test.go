package airlock_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// BenchmarkRootfsBase measures, in one run (use -benchtime=1x):
//
//   - building the rootfs base of the default image (rootfs.Base into an
//     empty cache) against a bare mkfs.erofs of the same image already
//     unpacked into a folder (target: base/mkfs <= 1.2);
//   - creating a second box of an image whose base is cached against the
//     first box, which built it (the base must not be rebuilt).
//
// rootfs.Base is itself unpack.Image to a folder plus mkfs.erofs, so the
// base/mkfs ratio reported here is honest and well above the 1.2 target:
// most of the time is the unpack (thousands of files written to disk).
// erofs-utils 1.5 (Debian bookworm) has no tar input; erofs-utils >= 1.7
// (mkfs.erofs --tar) would remove the unpack step. A hand-written erofs
// writer met the target but was removed (it re-implemented mkfs.erofs), and
// github.com/erofs/go-erofs v0.3.1 cannot store hard links, replace a path
// from a later layer, or keep a layer's own entries in an opaque directory.
//
// go test -run '^$' -bench BenchmarkRootfsBase -benchtime=1x .
func BenchmarkRootfsBase(b *testing.B) {
	vmtest.Require(b)
	if _, err := osexec.LookPath("mkfs.erofs"); err != nil {
		b.Skip("mkfs.erofs not installed (erofs-utils)")
	}
	ctx := context.Background()
	s, err := vmtest.OpenImages()
	if err != nil {
		b.Fatal(err)
	}
	img, err := s.Resolve(vmtest.DefaultImage)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		// Base vs bare mkfs.erofs.
		cache := b.TempDir()
		t0 := time.Now()
		p, err := rootfs.Base(ctx, s, img, cache)
		if err != nil {
			b.Fatal(err)
		}
		base := time.Since(t0)
		baseFi, _ := os.Stat(p)

		tree := filepath.Join(b.TempDir(), "root")
		os.Mkdir(tree, 0o755)
		t0 = time.Now()
		if err := unpack.Image(ctx, s, img, tree, unpack.Options{}); err != nil {
			b.Fatal(err)
		}
		unpacked := time.Since(t0)
		out := filepath.Join(b.TempDir(), "bare.erofs")
		args := []string{"--quiet"}
		if os.Geteuid() != 0 {
			args = append(args, "--all-root")
		}
		cmd := osexec.Command("mkfs.erofs", append(args, out, tree)...)
		var msg bytes.Buffer
		cmd.Stdout, cmd.Stderr = &msg, &msg
		t0 = time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("mkfs.erofs: %v: %s", err, msg.String())
		}
		mkfs := time.Since(t0)
		mkfsFi, _ := os.Stat(out)
		os.RemoveAll(filepath.Dir(tree))

		// First box (builds the base) vs second box (cached base).
		first, second, rebuilt := boxStarts(b, s, img)

		b.ReportMetric(0, "ns/op")
		b.ReportMetric(base.Seconds()/mkfs.Seconds(), "base/mkfs")
		b.ReportMetric(second.Seconds()/first.Seconds(), "box2/box1")
		b.ReportMetric(base.Seconds(), "base-s")
		b.ReportMetric(mkfs.Seconds(), "mkfs-s")
		b.ReportMetric(first.Seconds(), "box1-s")
		b.ReportMetric(second.Seconds(), "box2-s")
		var tbl strings.Builder
		fmt.Fprintf(&tbl, "\n%-44s %8s %10s\n", "step ("+img.Ref+")", "seconds", "size MiB")
		fmt.Fprintf(&tbl, "%-44s %8.2f %10d\n", "rootfs.Base, empty cache", base.Seconds(), size(baseFi)>>20)
		fmt.Fprintf(&tbl, "%-44s %8.2f %10s\n", "unpack.Image to a folder (not in mkfs)", unpacked.Seconds(), "")
		fmt.Fprintf(&tbl, "%-44s %8.2f %10d\n", "bare mkfs.erofs of that folder", mkfs.Seconds(), size(mkfsFi)>>20)
		fmt.Fprintf(&tbl, "%-44s %8.2f %10s\n", "ratio base/mkfs (target <= 1.2)", base.Seconds()/mkfs.Seconds(), "")
		fmt.Fprintf(&tbl, "%-44s %8.2f %10s\n", "first box (builds the base)", first.Seconds(), "")
		fmt.Fprintf(&tbl, "%-44s %8.2f %10s\n", "second box (cached base)", second.Seconds(), "")
		fmt.Fprintf(&tbl, "%-44s %8.2f %10s\n", "ratio second/first", second.Seconds()/first.Seconds(), "")
		b.Log(tbl.String())
		if rebuilt {
			b.Errorf("the second box rebuilt the rootfs base")
		}
	}
}

func size(fi os.FileInfo) int64 {
	if fi == nil {
		return 0
	}
	return fi.Size()
}

// boxStarts creates two boxes of a fresh variant of img (same layers, a
// config label that changes its digest, so its base is not cached yet) and
// returns how long each Create took and whether the second rebuilt the
// base.
func boxStarts(b *testing.B, s *image.Store, img *image.Image) (first, second time.Duration, rebuilt bool) {
	ctx := context.Background()
	def := defaultImage(b)
	cf, err := def.ConfigFile()
	if err != nil {
		b.Fatal(err)
	}
	cf = cf.DeepCopy()
	if cf.Config.Labels == nil {
		cf.Config.Labels = map[string]string{}
	}
	cf.Config.Labels["run.airlock.bench"] = time.Now().Format(time.RFC3339Nano)
	v, err := mutate.ConfigFile(def, cf)
	if err != nil {
		b.Fatal(err)
	}
	home := b.TempDir()
	vs, err := image.Open(filepath.Join(home, "images"))
	if err != nil {
		b.Fatal(err)
	}
	vimg, err := vs.WriteImage(ctx, "bench/variant:1", v, "bench variant of "+img.Ref, nil)
	if err != nil {
		b.Fatal(err)
	}
	r, err := airlock.Open(airlock.Options{Home: home, ImagesDir: vs.Dir(), Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	basePath := rootfs.BasePath(defaults.Cache(), vimg.Digest)
	defer rootfs.RemoveBase(ctx, defaults.Cache(), vimg.Digest)
	create := func() time.Duration {
		t0 := time.Now()
		bx, err := r.Create(ctx, airlock.BoxOptions{Image: "bench/variant:1"})
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		if res, err := bx.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil || res.ExitCode != 0 {
			b.Fatalf("exec in box: %v %+v", err, res)
		}
		r.Remove(ctx, bx.ID(), true)
		return d
	}
	first = create()
	fi1, err := os.Stat(basePath)
	if err != nil {
		b.Fatalf("no base after the first box: %v", err)
	}
	second = create()
	fi2, err := os.Stat(basePath)
	rebuilt = err != nil || !os.SameFile(fi1, fi2) || !fi1.ModTime().Equal(fi2.ModTime())
	return first, second, rebuilt
}
