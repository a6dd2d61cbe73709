package image

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ImportOptions tunes Import. The zero value is ready to use.
type ImportOptions struct {
	// Ref names the imported image, overriding the names recorded in the
	// file. Required when the file records no name; only allowed when it
	// holds a single image.
	Ref string
	// Progress, if not nil, receives per-layer progress.
	Progress ProgressFunc
}

// Import adds the images in path to the store, with Source "imported from
// PATH" (absolute path). path is one of:
//
//   - an OCI image layout folder (oci-layout, index.json, blobs/); names come
//     from the "org.opencontainers.image.ref.name" annotation (a full
//     reference, or a bare tag combined with "io.containerd.image.name");
//   - a tar archive of such a layout ("OCI archive", e.g. from
//     'docker buildx build --output type=oci');
//   - a 'docker save' tarball (manifest.json with RepoTags).
//
// Multi-platform indexes resolve to their linux/amd64 image. Every blob is
// verified against its digest. It returns the imported images.
func (s *Store) Import(ctx context.Context, p string, opts ImportOptions) ([]*Image, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	source := "imported from " + abs
	type named struct {
		refs []string
		img  v1.Image
	}
	var imgs []named
	if fi.IsDir() {
		lp, err := layout.FromPath(abs)
		if err != nil {
			return nil, fmt.Errorf("import %s: not an OCI image layout folder: %w", abs, err)
		}
		found, err := layoutImages(lp)
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", abs, err)
		}
		for _, f := range found {
			imgs = append(imgs, named{refs: f.refs, img: f.img})
		}
	} else {
		entries, err := tarNames(abs)
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", abs, err)
		}
		switch {
		case entries["manifest.json"]:
			opener := func() (io.ReadCloser, error) { return os.Open(abs) }
			mf, err := tarball.LoadManifest(opener)
			if err != nil {
				return nil, fmt.Errorf("import %s: read manifest.json: %w", abs, err)
			}
			for i, d := range mf {
				var img v1.Image
				if len(d.RepoTags) > 0 {
					t, err := name.NewTag(d.RepoTags[0], name.WeakValidation)
					if err != nil {
						return nil, fmt.Errorf("import %s: bad RepoTag %q: %w", abs, d.RepoTags[0], err)
					}
					img, err = tarball.Image(opener, &t)
					if err != nil {
						return nil, fmt.Errorf("import %s: %w", abs, err)
					}
				} else if len(mf) == 1 {
					img, err = tarball.Image(opener, nil)
					if err != nil {
						return nil, fmt.Errorf("import %s: %w", abs, err)
					}
				} else {
					return nil, fmt.Errorf("import %s: image %d has no RepoTags and the file holds %d images", abs, i, len(mf))
				}
				imgs = append(imgs, named{refs: d.RepoTags, img: img})
			}
		case entries["index.json"] && entries["oci-layout"]:
			dir, err := os.MkdirTemp(filepath.Join(s.dir, "tmp"), "import-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(dir)
			if err := extractLayoutTar(abs, dir); err != nil {
				return nil, fmt.Errorf("import %s: %w", abs, err)
			}
			lp, err := layout.FromPath(dir)
			if err != nil {
				return nil, fmt.Errorf("import %s: %w", abs, err)
			}
			found, err := layoutImages(lp)
			if err != nil {
				return nil, fmt.Errorf("import %s: %w", abs, err)
			}
			for _, f := range found {
				imgs = append(imgs, named{refs: f.refs, img: f.img})
			}
		default:
			return nil, fmt.Errorf("import %s: neither a 'docker save' tarball (no manifest.json) nor an OCI archive (no index.json and oci-layout)", abs)
		}
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("import %s: no linux/amd64 images in it", abs)
	}
	if opts.Ref != "" {
		if len(imgs) != 1 {
			return nil, fmt.Errorf("import %s: it holds %d images, so a single name (%s) cannot be given", abs, len(imgs), opts.Ref)
		}
		imgs[0].refs = []string{opts.Ref}
	}
	for _, n := range imgs {
		if len(n.refs) == 0 {
			return nil, fmt.Errorf("import %s: an image in it has no name; give one (ImportOptions.Ref)", abs)
		}
	}
	gl := s.gcLock()
	if err := gl.RLock(); err != nil {
		return nil, err
	}
	defer gl.Unlock()
	var out []*Image
	for _, n := range imgs {
		md, err := s.storeImage(ctx, n.img, opts.Progress, DefaultMaxImageBytes)
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", abs, err)
		}
		md.Platform = &Platform
		for _, r := range n.refs {
			norm, err := Normalize(r)
			if err != nil {
				return nil, fmt.Errorf("import %s: %w", abs, err)
			}
			nd, err := s.setName(ctx, norm, *md, source)
			if err != nil {
				return nil, err
			}
			img, err := s.describe(norm, nd)
			if err != nil {
				return nil, err
			}
			out = append(out, img)
		}
	}
	return out, nil
}

type layoutImage struct {
	refs []string
	img  v1.Image
}

// layoutImages lists the linux/amd64 images of an OCI layout with their
// names.
func layoutImages(lp layout.Path) ([]layoutImage, error) {
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	var out []layoutImage
	var walk func(ii v1.ImageIndex, refs []string, depth int) error
	walk = func(ii v1.ImageIndex, refs []string, depth int) error {
		if depth > 4 {
			return fmt.Errorf("image indexes nested too deep")
		}
		im, err := ii.IndexManifest()
		if err != nil {
			return err
		}
		picked := false
		for _, d := range im.Manifests {
			r := refs
			if depth == 0 {
				r = nil
				if n := layoutRefName(d.Annotations); n != "" {
					r = []string{n}
				}
			}
			switch {
			case d.MediaType.IsIndex():
				child, err := ii.ImageIndex(d.Digest)
				if err != nil {
					return err
				}
				if err := walk(child, r, depth+1); err != nil {
					return err
				}
			case d.MediaType.IsImage():
				if d.Platform != nil && (d.Platform.OS != Platform.OS || d.Platform.Architecture != Platform.Architecture) {
					continue
				}
				if depth > 0 && picked {
					continue
				}
				img, err := ii.Image(d.Digest)
				if err != nil {
					return err
				}
				if d.Platform == nil {
					if cf, err := img.ConfigFile(); err == nil && cf.OS != "" && (cf.OS != Platform.OS || cf.Architecture != Platform.Architecture) {
						continue
					}
				}
				picked = depth > 0
				out = append(out, layoutImage{refs: r, img: img})
			}
		}
		return nil
	}
	return out, walk(idx, nil, 0)
}

// layoutRefName returns the full reference recorded in OCI layout
// annotations, or "".
func layoutRefName(a map[string]string) string {
	ref := a[AnnotationRefName]
	full := a["io.containerd.image.name"]
	if full != "" {
		return full
	}
	if ref == "" {
		return ""
	}
	// A bare tag ("latest", "v1") is not a full name.
	if !strings.ContainsAny(ref, "/:@") {
		return ""
	}
	return ref
}

// tarNames returns the set of top-level file names in a tar archive.
func tarNames(p string) (map[string]bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	names := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return nil, fmt.Errorf("not a tar archive: %w", err)
		}
		names[path.Clean(strings.TrimPrefix(h.Name, "./"))] = true
	}
}

// extractLayoutTar writes the regular files of an OCI archive (index.json,
// oci-layout, blobs/ALG/HEX) into dir, refusing any other path.
func extractLayoutTar(p, dir string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		n := path.Clean(strings.TrimPrefix(h.Name, "./"))
		parts := strings.Split(n, "/")
		ok := n == "index.json" || n == "oci-layout" ||
			(len(parts) == 3 && parts[0] == "blobs" && parts[1] != ".." && parts[2] != ".." && !strings.HasPrefix(parts[1], ".") && !strings.HasPrefix(parts[2], "."))
		if !ok {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, tr); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
	}
}

// Save writes the image ref (any form Resolve accepts) to w as a 'docker
// save'-compatible tarball (manifest.json, config and gzip layers), loadable
// with 'docker load' or Import. The RepoTag is the image's normalized name
// (digest references are written without a tag).
func (s *Store) Save(ref string, w io.Writer) error {
	img, err := s.Resolve(ref)
	if err != nil {
		return err
	}
	vi, err := s.v1Image(img)
	if err != nil {
		return fmt.Errorf("save %s: %w", img.Ref, err)
	}
	r, err := name.ParseReference(img.Ref, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("save %s: %w", img.Ref, err)
	}
	if err := tarball.Write(r, vi, w); err != nil {
		return fmt.Errorf("save %s: %w", img.Ref, err)
	}
	return nil
}
