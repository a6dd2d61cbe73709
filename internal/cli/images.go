package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/imagebuild"
	"github.com/airlock-run/airlock/internal/rootfs"
)

// The image verbs: pull, images, rmi, import, save, and the "image" group
// (image ls, pull, rm, import, save, build-debian), as in the Docker CLI.
func init() {
	extraCommands = append(extraCommands, newPullCmd, newImagesCmd, newRmiCmd, newImportCmd, newSaveCmd, newImageCmd)
}

// openImages opens the image store the runtime uses by default:
// $AIRLOCK_IMAGES, else AIRLOCK_HOME/images.
func openImages() (*image.Store, error) {
	return image.Open(defaults.Images())
}

// pullWithProgress returns an airlock.Options.Pull hook that pulls a missing
// image while showing per-layer progress on w (bars on a terminal, one line
// per layer otherwise). openRuntime uses it so that 'run' and 'create'
// show what they download.
func pullWithProgress(ctx context.Context, w io.Writer) airlock.PullEvents {
	var p *progress
	return airlock.PullEvents{
		Start: func(ref string) {
			fmt.Fprintf(w, "Unable to find image '%s' locally; pulling it\n", ref)
			p = newProgress(ctx, w, "downloaded")
		},
		Progress: func(layer string, done, total int64) { p.update(layer, done, total) },
		Done: func(ref, digest string, err error) {
			p.finish(err == nil)
			if err == nil {
				fmt.Fprintf(w, "Pulled %s (%s)\n", ref, shortDigest(digest))
			}
		},
	}
}

// pull pulls ref into s with progress on w.
func pull(ctx context.Context, s *image.Store, ref string, opts image.PullOptions, w io.Writer) (*image.Image, error) {
	p := newProgress(ctx, w, "downloaded")
	opts.Progress = p.update
	img, err := s.Pull(ctx, ref, opts)
	p.finish(err == nil)
	return img, err
}

func newPullCmd() *cobra.Command {
	var insecure bool
	cmd := &cobra.Command{
		Use:   "pull [--insecure] IMAGE",
		Short: "Download an image from a registry",
		Long: `Download an image from a registry into the local image store
(AIRLOCK_HOME/images). Layers already present are not downloaded again.
Credentials come from Docker's config.json ('airlock login', 'docker login'). Registries on
loopback (localhost, 127.0.0.1) may use plain HTTP; others need --insecure.

Where no registry is reachable, pull on a machine where it is, 'airlock save'
the image there and 'airlock import' it here, or build a Debian image locally
with 'airlock image build-debian'.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := openImages()
			if err != nil {
				return err
			}
			img, err := pull(cmd.Context(), s, args[0], image.PullOptions{Insecure: insecure}, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Pulled %s (%s, %s)\n", img.Ref, shortDigest(img.Digest), humanize.Bytes(uint64(img.Size)))
			return nil
		},
	}
	cmd.Flags().BoolVar(&insecure, "insecure", false, "allow plain HTTP and unverified TLS to the registry")
	return cmd
}

func newImagesCmd() *cobra.Command {
	var lf listFormat
	var noTrunc bool
	cmd := &cobra.Command{
		Use:   "images [REPOSITORY[:TAG]]",
		Short: "List local images",
		Long: `List the images in the local store. SOURCE says where each came from:
pulled from a registry, imported from a file, or built locally (for example
from Debian packages, which is not the same image as the registry's).

--format json prints one JSON object per image; a Go template one line per
image (--format '{{.Repository}}:{{.Tag}} {{.Size}}'). Fields: Ref,
Repository, Tag, Digest, Size (bytes), Created, Source.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := openImages()
			if err != nil {
				return err
			}
			imgs, lerr := s.List()
			if len(args) == 1 {
				imgs, err = filterImages(imgs, args[0])
				if err != nil {
					return err
				}
			}
			rows := make([]imageRow, 0, len(imgs))
			seen := map[string]bool{}
			for _, img := range imgs {
				if lf.quiet && seen[img.Digest] {
					continue
				}
				seen[img.Digest] = true
				rows = append(rows, rowOfImage(img))
			}
			err = writeList(cmd.OutOrStdout(), lf, rows, []column[imageRow]{
				{"REPOSITORY", func(r imageRow) string { return r.Repository }},
				{"TAG", func(r imageRow) string { return r.Tag }},
				{"DIGEST", func(r imageRow) string { return digestColumn(r.Digest, noTrunc) }},
				{"SIZE", func(r imageRow) string { return humanize.Bytes(uint64(r.Size)) }},
				{"CREATED", func(r imageRow) string {
					if r.Created.IsZero() {
						return "N/A"
					}
					return humanize.Time(r.Created)
				}},
				{"SOURCE", func(r imageRow) string { return r.Source }},
			}, 2)
			if err != nil {
				return err
			}
			if lerr != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "airlock: some images could not be read:", lerr)
				return &ExitError{1}
			}
			return nil
		},
	}
	lf.add(cmd, "image digests")
	cmd.Flags().BoolVar(&noTrunc, "no-trunc", false, "print full digests")
	return cmd
}

// filterImages keeps the images whose repository (and tag, when given)
// match ref, as 'docker images python' or 'docker images python:slim' do.
func filterImages(imgs []*image.Image, ref string) ([]*image.Image, error) {
	repo, tag := ref, ""
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		repo, tag = ref[:i], ref[i+1:]
	}
	norm, err := image.Normalize(repo)
	if err != nil {
		return nil, err
	}
	norm = strings.TrimSuffix(norm, ":latest")
	var out []*image.Image
	for _, img := range imgs {
		r, t := refParts(img.Ref)
		if r == norm && (tag == "" || t == tag) {
			out = append(out, img)
		}
	}
	return out, nil
}

// refParts splits a normalized reference into repository and tag ("" for
// digest references).
func refParts(ref string) (repo, tag string) {
	if i := strings.Index(ref, "@"); i >= 0 {
		return ref[:i], ""
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:]
	}
	return ref, ""
}

// splitRef gives the REPOSITORY and TAG columns for a normalized
// reference, shortening Docker Hub names as Docker does.
func splitRef(ref string) (repo, tag string) {
	repo, tag = refParts(ref)
	if tag == "" {
		tag = "<none>"
	}
	if r, ok := strings.CutPrefix(repo, image.DockerHub+"/"); ok {
		repo = strings.TrimPrefix(r, "library/")
	}
	return repo, tag
}

// shortDigest returns "sha256:" and the first 12 hex digits of a digest.
func shortDigest(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12]
	}
	return d
}

func digestColumn(d string, full bool) string {
	if full {
		return d
	}
	return strings.TrimPrefix(shortDigest(d), "sha256:")
}

func newRmiCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rmi [-f] IMAGE...",
		Short: "Remove local images",
		Long: `Remove images from the local store, by name or by digest (prefix). Removing
a name that another name shares only untags it. An image that boxes use is
not removed unless -f is given; those boxes keep running but cannot be
started again until the image is pulled or imported again.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := openRuntime(cmd)
			if err != nil {
				return err
			}
			defer r.Close()
			failed := false
			for _, a := range args {
				if err := removeImage(cmd, r, a, force); err != nil {
					report(cmd.ErrOrStderr(), err, "")
					failed = true
				}
			}
			if failed {
				return &ExitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "remove images even when boxes use them")
	return cmd
}

// removeImage removes one name (or, for a digest, every name of that
// image) with Runtime.RemoveImage and reports what went.
func removeImage(cmd *cobra.Command, r *airlock.Runtime, ref string, force bool) error {
	res, err := r.RemoveImage(cmd.Context(), ref, force)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	for _, n := range res.Untagged {
		fmt.Fprintln(out, "Untagged:", n)
	}
	if res.Deleted == "" {
		return nil // another name still holds it
	}
	fmt.Fprintln(out, "Deleted:", res.Deleted)
	if len(res.UsedBy) > 0 {
		fmt.Fprintf(cmd.ErrOrStderr(), "airlock: warning: box(es) %s still use %s; they keep running but cannot start again until it is pulled or imported again\n",
			strings.Join(res.UsedBy, ", "), shortDigest(res.Deleted))
	}
	if res.BaseErr != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "airlock: warning: root filesystem base not removed:", res.BaseErr)
	}
	return nil
}

func newImportCmd() *cobra.Command {
	var tag string
	var bi boxImport
	cmd := &cobra.Command{
		Use:   "import PATH [--tag IMAGE]",
		Short: "Add images from an OCI layout folder, an OCI archive or a 'docker save' tarball",
		Long: `Add the images in PATH to the local store. PATH is an OCI image layout folder,
a tar archive of one (an "OCI archive", e.g. from 'docker buildx build
--output type=oci') or a 'docker save' / 'airlock save' tarball. Names come
from the file; --tag names the image instead (required when the file
records no name). Multi-platform images import their linux/amd64 variant.` + boxImportHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ok, err := importBoxArchive(cmd, args[0], bi); ok {
				return err
			}
			s, err := openImages()
			if err != nil {
				return err
			}
			p := newProgress(cmd.Context(), cmd.ErrOrStderr(), "imported")
			imgs, err := s.Import(cmd.Context(), args[0], image.ImportOptions{Ref: tag, Progress: p.update})
			p.finish(err == nil)
			if err != nil {
				return err
			}
			for _, img := range imgs {
				fmt.Fprintf(cmd.OutOrStdout(), "Imported %s (%s, %s)\n", img.Ref, shortDigest(img.Digest), humanize.Bytes(uint64(img.Size)))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&tag, "tag", "t", "", "name for the imported image")
	bi.register(cmd)
	return cmd
}

func newSaveCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "save IMAGE -o FILE.tar",
		Short: "Write an image to a 'docker save'-compatible tarball",
		Long: `Write an image to a tarball that 'docker load' and 'airlock import' read.
Without -o the tarball goes to standard output (never to a terminal).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := openImages()
			if err != nil {
				return err
			}
			if output == "" || output == "-" {
				out := cmd.OutOrStdout()
				if isTerminal(out) {
					return fmt.Errorf("refusing to write a tarball to a terminal: give a file with -o FILE.tar, or redirect the output")
				}
				return s.Save(args[0], out)
			}
			return saveFile(s, args[0], output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write to this file instead of standard output")
	return cmd
}

// saveFile writes the tarball to a temporary file beside path and renames it
// into place, so a failed save leaves no partial file.
func saveFile(s *image.Store, ref, path string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("save: %w", err)
	}
	defer os.Remove(f.Name())
	if err := s.Save(ref, f); err != nil {
		f.Close()
		if errors.Is(err, image.ErrNotFound) {
			return fmt.Errorf("no such image %q (see 'airlock images'): %w", ref, err)
		}
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("save: %w", err)
	}
	return os.Rename(f.Name(), path)
}

// newImageCmd is the "image" group, with Docker's "image ls/pull/rm/..."
// spellings and the airlock-only build-debian.
func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Manage images",
		Args:  cobra.NoArgs,
	}
	ls := newImagesCmd()
	ls.Use, ls.Aliases = "ls [REPOSITORY[:TAG]]", []string{"list"}
	rm := newRmiCmd()
	rm.Use = "rm [-f] IMAGE..."
	cmd.AddCommand(ls, rm, newPullCmd(), newImportCmd(), newSaveCmd(), newBuildDebianCmd())
	return cmd
}

func newBuildDebianCmd() *cobra.Command {
	var (
		opts   imagebuild.DebianOptions
		noBase bool
	)
	cmd := &cobra.Command{
		Use:   "build-debian --packages P1,P2 --tag IMAGE [--suite SUITE] [--mirror URL]",
		Short: "Build a Debian image locally from packages (no registry needed)",
		Long: `Build a single-layer Debian image with mmdebstrap (minbase plus the given
packages) and store it under --tag, then build its root filesystem base so
the first box starts fast. It needs mmdebstrap, root (or user namespaces)
and access to a Debian mirror (--mirror for a local or proxied one).

The image is recorded as built locally from Debian packages, and 'airlock
images' says so: a local python:slim built this way is Debian's python3, not
the registry's python:slim. With python3 among the packages it is made to
behave like python:slim (python, python3, pip on PATH; pip install works).

Example:
  airlock image build-debian --tag python:slim \
      --packages python3,python3-pip,ca-certificates,procps`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := openImages()
			if err != nil {
				return err
			}
			errw := cmd.ErrOrStderr()
			opts.Progress = errw
			img, err := imagebuild.BuildDebian(cmd.Context(), s, opts)
			if err != nil {
				if strings.Contains(err.Error(), "mmdebstrap failed") {
					return fmt.Errorf("%w\ncheck the package names, and that the mirror is reachable (use --mirror for a local or proxied one)", err)
				}
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Built %s (%s, %s)\nSource: %s\n", img.Ref, shortDigest(img.Digest), humanize.Bytes(uint64(img.Size)), img.Source)
			if noBase {
				return nil
			}
			p, err := rootfs.BaseWith(cmd.Context(), s, img, defaults.Cache(), rootfs.BaseOptions{Note: func(m string) { fmt.Fprintln(errw, m) }})
			if err != nil {
				return fmt.Errorf("the image was stored, but its root filesystem base could not be built (boxes will retry): %w", err)
			}
			fmt.Fprintf(out, "Root filesystem base: %s\n", p)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringSliceVar(&opts.Packages, "packages", nil, "Debian packages to install, comma-separated (required)")
	fl.StringVarP(&opts.Tag, "tag", "t", "", "name for the image, e.g. python:slim (required)")
	fl.StringVar(&opts.Suite, "suite", imagebuild.DefaultSuite, "Debian suite")
	fl.StringVar(&opts.Mirror, "mirror", "", "apt mirror URL (default: deb.debian.org with updates and security)")
	fl.BoolVar(&opts.KeepDocs, "keep-docs", false, "keep /usr/share/doc, man pages and locales")
	fl.BoolVar(&noBase, "no-base", false, "do not build the root filesystem base now")
	cmd.MarkFlagRequired("packages")
	cmd.MarkFlagRequired("tag")
	return cmd
}

// imageRow is one image as images lists it; its fields are what --format
// templates and --format json see.
type imageRow struct {
	Ref        string
	Repository string
	Tag        string
	Digest     string
	Size       int64 // bytes, as stored
	Created    time.Time
	Source     string
}

func rowOfImage(img *image.Image) imageRow {
	repo, tag := splitRef(img.Ref)
	return imageRow{Ref: img.Ref, Repository: repo, Tag: tag, Digest: img.Digest, Size: img.Size, Created: img.Created, Source: img.Source}
}
