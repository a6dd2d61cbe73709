// Package imagebuild builds OCI images locally, without a registry, so
// airlock works where no registry is reachable. BuildDebian makes a
// single-layer Debian image from packages with mmdebstrap.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/airlock-run/airlock/internal/image"
)

// Labels written into the config of images built by BuildDebian.
const (
	// LabelSuite records the Debian suite ("bookworm").
	LabelSuite = "run.airlock.debian.suite"
	// LabelPackages records the requested packages, space separated.
	LabelPackages = "run.airlock.debian.packages"
	// LabelMirror records the mirror ("" means mmdebstrap's default,
	// deb.debian.org with updates and security).
	LabelMirror = "run.airlock.debian.mirror"
)

// DefaultSuite is the Debian suite BuildDebian uses when none is given.
const DefaultSuite = "bookworm"

// DefaultPath is the PATH of built images, as in the official Docker images.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// DebianOptions describes a Debian image to build.
type DebianOptions struct {
	// Suite is the Debian suite; "" means DefaultSuite (bookworm).
	Suite string
	// Packages are installed on top of the minbase variant (names as apt
	// knows them, e.g. "python3", "python3-pip").
	Packages []string
	// Tag names the image in the store ("python:slim"); required.
	Tag string
	// Mirror is the apt mirror URI; "" means http://deb.debian.org/debian
	// plus the suite's -updates and -security archives.
	Mirror string
	// Cmd is the image's default command; nil means ["python3"] when
	// python3 is installed, else ["/bin/bash"].
	Cmd []string
	// KeepDocs keeps /usr/share/doc, man pages, info and locales, which
	// are left out by default as in Debian's -slim images.
	KeepDocs bool
	// Progress, if not nil, receives mmdebstrap's output and progress lines.
	Progress io.Writer
}

var pkgName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+(:[a-z0-9]+)?$`)
var suiteName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// BuildDebian builds a Debian image with mmdebstrap (variant minbase, the
// given packages, tar output, run as root), stores it in store under
// opts.Tag with Source "built locally from Debian packages (SUITE): PKGS",
// and returns it.
//
// The image is one gzip layer without device nodes, with Env PATH (see
// DefaultPath) and LANG=C.UTF-8, and labels LabelSuite, LabelPackages and
// LabelMirror. Apt lists and caches are removed. When python3 is among the
// packages it is made to behave like the official python:slim image:
// /usr/local/bin/python and python3 link to /usr/bin/python3, pip and pip3
// to /usr/bin/pip3 (when python3-pip is installed), and
// /usr/lib/python3*/EXTERNALLY-MANAGED is removed so 'pip install' works.
//
// It needs mmdebstrap (apt-get install mmdebstrap), network access to the
// mirror, and root (or working user namespaces). Cancelling ctx kills
// mmdebstrap.
func BuildDebian(ctx context.Context, store *image.Store, opts DebianOptions) (*image.Image, error) {
	if opts.Tag == "" {
		return nil, fmt.Errorf("build-debian: a tag is required")
	}
	if _, err := image.Normalize(opts.Tag); err != nil {
		return nil, fmt.Errorf("build-debian: %w", err)
	}
	suite := opts.Suite
	if suite == "" {
		suite = DefaultSuite
	}
	if !suiteName.MatchString(suite) {
		return nil, fmt.Errorf("build-debian: invalid suite %q", suite)
	}
	for _, p := range opts.Packages {
		if !pkgName.MatchString(p) {
			return nil, fmt.Errorf("build-debian: invalid package name %q", p)
		}
	}
	mm, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return nil, fmt.Errorf("build-debian: mmdebstrap not found: install it (apt-get install mmdebstrap)")
	}
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	hasPython := slices.Contains(opts.Packages, "python3")
	hasPip := slices.Contains(opts.Packages, "python3-pip")

	// Not in the store's tmp/: mmdebstrap mounts /dev, /proc and /sys
	// inside its chroot there, and nothing may ever RemoveAll through them.
	work, err := os.MkdirTemp("", "airlock-build-debian-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := removeUnmounted(work); err != nil {
			fmt.Fprintf(progress, "build-debian: not removing %s: %v\n", work, err)
		}
	}()
	rawTar := filepath.Join(work, "rootfs.tar")

	args := []string{"--variant=minbase", "--format=tar", "--aptopt=Acquire::Retries \"3\""}
	if len(opts.Packages) > 0 {
		args = append(args, "--include="+strings.Join(opts.Packages, ","))
	}
	if !opts.KeepDocs {
		for _, p := range []string{
			"path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
			"path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
			"path-exclude=/usr/share/locale/*", "path-include=/usr/share/locale/locale.alias",
			"path-exclude=/usr/share/lintian/*", "path-exclude=/usr/share/linda/*",
		} {
			args = append(args, "--dpkgopt="+p)
		}
	}
	if hasPython {
		hook := `mkdir -p "$1/usr/local/bin" && ln -sfn /usr/bin/python3 "$1/usr/local/bin/python" && ln -sfn /usr/bin/python3 "$1/usr/local/bin/python3" && rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED`
		if hasPip {
			hook += ` && ln -sfn /usr/bin/pip3 "$1/usr/local/bin/pip" && ln -sfn /usr/bin/pip3 "$1/usr/local/bin/pip3"`
		}
		args = append(args, "--customize-hook="+hook)
	}
	args = append(args, `--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/tmp/* "$1"/var/tmp/*`)
	args = append(args, suite, rawTar)
	if opts.Mirror != "" {
		args = append(args, opts.Mirror)
	}
	fmt.Fprintf(progress, "build-debian: mmdebstrap %s\n", strings.Join(quoteArgs(args), " "))
	start := time.Now()
	cmd := exec.CommandContext(ctx, mm, args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+work)
	// On cancel, let mmdebstrap unmount and clean up before it exits.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 2 * time.Minute
	var tail tailBuffer
	cmd.Stdout = io.MultiWriter(progress, &tail)
	cmd.Stderr = io.MultiWriter(progress, &tail)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("build-debian: mmdebstrap failed: %w\n%s", err, tail.String())
	}
	fmt.Fprintf(progress, "build-debian: mmdebstrap done in %s\n", time.Since(start).Round(time.Second))

	layerPath := filepath.Join(work, "layer.tar.gz")
	skipped, err := filterLayer(rawTar, layerPath)
	if err != nil {
		return nil, fmt.Errorf("build-debian: %w", err)
	}
	os.Remove(rawTar)
	if skipped > 0 {
		fmt.Fprintf(progress, "build-debian: left out %d device nodes (the guest has devtmpfs)\n", skipped)
	}
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("build-debian: %w", err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, fmt.Errorf("build-debian: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: time.Now().UTC().Truncate(time.Second)}
	cf.Author = "airlock build-debian"
	cmdv := opts.Cmd
	if cmdv == nil {
		cmdv = []string{"/bin/bash"}
		if hasPython {
			cmdv = []string{"python3"}
		}
	}
	cf.Config = v1.Config{
		Env: []string{DefaultPath, "LANG=C.UTF-8"},
		Cmd: cmdv,
		Labels: map[string]string{
			LabelSuite:    suite,
			LabelPackages: strings.Join(opts.Packages, " "),
			LabelMirror:   opts.Mirror,
		},
	}
	cf.History = []v1.History{{
		Created:   cf.Created,
		CreatedBy: "mmdebstrap --variant=minbase --include=" + strings.Join(opts.Packages, ",") + " " + suite,
		Comment:   "airlock build-debian",
	}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	source := fmt.Sprintf("built locally from Debian packages (%s): %s", suite, strings.Join(opts.Packages, " "))
	fmt.Fprintf(progress, "build-debian: storing %s\n", opts.Tag)
	out, err := store.WriteImage(ctx, opts.Tag, img, source, nil)
	if err != nil {
		return nil, fmt.Errorf("build-debian: store: %w", err)
	}
	fmt.Fprintf(progress, "build-debian: %s %s (%d MiB) in %s\n", out.Ref, out.Digest, out.Size>>20, time.Since(start).Round(time.Second))
	return out, nil
}

// filterLayer copies the mmdebstrap tarball at in to a gzip-compressed
// layer at out: names lose their "./" prefix, the root entry and device
// nodes are dropped. It returns the number of device nodes dropped.
func filterLayer(in, out string) (int, error) {
	f, err := os.Open(in)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	o, err := os.Create(out)
	if err != nil {
		return 0, err
	}
	defer o.Close()
	zw, err := gzip.NewWriterLevel(o, gzip.DefaultCompression)
	if err != nil {
		return 0, err
	}
	tr := tar.NewReader(f)
	tw := tar.NewWriter(zw)
	skipped := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("read mmdebstrap output: %w", err)
		}
		h.Name = strings.TrimPrefix(h.Name, "./")
		if h.Name == "" || h.Name == "." {
			continue
		}
		if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
			skipped++
			continue
		}
		if h.Typeflag == tar.TypeLink {
			h.Linkname = strings.TrimPrefix(h.Linkname, "./")
		}
		h.Format = tar.FormatUnknown // let the writer pick USTAR, PAX or GNU
		if err := tw.WriteHeader(h); err != nil {
			return 0, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	if err := zw.Close(); err != nil {
		return 0, err
	}
	return skipped, o.Close()
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \"'$*&") {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		} else {
			out[i] = a
		}
	}
	return out
}

// tailBuffer keeps the last 8 KiB written to it, for error messages.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 8<<10 {
		t.b = t.b[len(t.b)-8<<10:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(bytes.TrimSpace(t.b)) }

// removeUnmounted removes dir recursively unless something is mounted
// below it (a killed mmdebstrap can leave its chroot's /dev bind-mounted, and
// removing through that would delete the host's device nodes).
func removeUnmounted(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("cannot check for mounts: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			return fmt.Errorf("%s is still mounted; unmount it and remove the folder by hand", f[4])
		}
	}
	return os.RemoveAll(dir)
}
