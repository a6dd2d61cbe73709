package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gofrs/flock"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/renameio/v2"
)

// Annotation keys written on index.json entries.
const (
	// AnnotationRefName is the OCI standard annotation holding the normalized
	// reference of an index entry.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationSource holds where the image came from (Image.Source).
	AnnotationSource = "run.airlock.image.source"
	// AnnotationAdded holds when the name was added to the store (RFC 3339).
	AnnotationAdded = "run.airlock.image.added"
)

// ErrNotFound is wrapped by errors for images that are not in the store
// (Resolve, Remove, Tag, Save) or not in the registry (Pull).
var ErrNotFound = errors.New("image not found")

// ErrDigestMismatch is wrapped by errors for blobs whose content does not
// match their digest or size (corrupt or truncated downloads, damaged files).
var ErrDigestMismatch = errors.New("content does not match its digest")

// Store is a local OCI image store rooted at a directory. See the package
// documentation for the layout. A Store is safe for concurrent use by several
// goroutines and several processes (flock on lock files under the directory).
type Store struct {
	dir string
}

// Image describes an image in the store.
type Image struct {
	// Ref is the normalized reference, e.g. "docker.io/library/python:slim"
	// or "localhost:5000/x@sha256:...".
	Ref string
	// Digest is the manifest digest, "sha256:<64 hex>".
	Digest string
	// Config is the runtime part of the image configuration.
	Config ImageConfig
	// Size is the total size in bytes of the blobs the image uses as stored
	// (manifest, config and layers, compressed as stored).
	Size int64
	// Created is the creation time recorded in the image config (zero if
	// absent).
	Created time.Time
	// Source says where the image came from: "pulled from REF", "imported
	// from FILE", "built locally from Debian packages (SUITE): PKGS".
	Source string
}

// ImageConfig is the part of the OCI image config a runtime needs
// (https://github.com/opencontainers/image-spec/blob/main/config.md).
type ImageConfig struct {
	// Env is the default environment, "KEY=value" entries.
	Env []string
	// WorkingDir is the default working directory ("" means /).
	WorkingDir string
	// User is the default user, "uid[:gid]" or "name[:group]" ("" means root).
	User string
	// Entrypoint and Cmd are the default argv parts, as in Docker.
	Entrypoint, Cmd []string
	// Labels are the image labels (may be nil).
	Labels map[string]string
}

// Open opens the store in dir, creating the directory and an empty OCI
// layout if needed. The default directory is defaults.Images().
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("image store: no directory given")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{dir, filepath.Join(dir, "blobs", "sha256"), filepath.Join(dir, "tmp"), filepath.Join(dir, "locks")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
	}
	s := &Store{dir: dir}
	layoutFile := filepath.Join(dir, "oci-layout")
	if _, err := os.Stat(layoutFile); errors.Is(err, os.ErrNotExist) {
		if err := s.writeFileAtomic(layoutFile, []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
	}
	if _, err := os.Stat(s.indexPath()); errors.Is(err, os.ErrNotExist) {
		err := s.withLock(context.Background(), func() error {
			if _, err := os.Stat(s.indexPath()); err == nil {
				return nil
			}
			return s.writeIndex(&v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex})
		})
		if err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
	}
	return s, nil
}

// Dir returns the store's directory (absolute).
func (s *Store) Dir() string { return s.dir }

func (s *Store) indexPath() string { return filepath.Join(s.dir, "index.json") }

// blobPath returns the path of a blob; digest is "sha256:<hex>".
func (s *Store) blobPath(h v1.Hash) string {
	return filepath.Join(s.dir, "blobs", h.Algorithm, h.Hex)
}

// withLock runs fn holding the store's exclusive index lock.
func (s *Store) withLock(ctx context.Context, fn func() error) error {
	l := flock.New(filepath.Join(s.dir, "lock"))
	if _, err := l.TryLockContext(ctx, 20*time.Millisecond); err != nil {
		return fmt.Errorf("lock image store: %w", err)
	}
	defer l.Unlock()
	return fn()
}

// gcLock returns the lock taken shared by writers (pull, import, build) and
// exclusive by garbage collection, so blobs being written are never collected.
func (s *Store) gcLock() *flock.Flock { return flock.New(filepath.Join(s.dir, "gc.lock")) }

func (s *Store) writeFileAtomic(path string, data []byte) error {
	f, err := renameio.NewPendingFile(path, renameio.WithTempDir(filepath.Dir(path)), renameio.WithStaticPermissions(0o644))
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.CloseAtomicallyReplace()
}

func (s *Store) readIndex() (*v1.IndexManifest, error) {
	b, err := os.ReadFile(s.indexPath())
	if err != nil {
		return nil, fmt.Errorf("read image index: %w", err)
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("parse image index %s: %w", s.indexPath(), err)
	}
	return idx, nil
}

func (s *Store) writeIndex(idx *v1.IndexManifest) error {
	sort.SliceStable(idx.Manifests, func(i, j int) bool {
		return idx.Manifests[i].Annotations[AnnotationRefName] < idx.Manifests[j].Annotations[AnnotationRefName]
	})
	b, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return s.writeFileAtomic(s.indexPath(), b)
}

// setName points the normalized reference ref at the manifest desc, replacing
// any previous entry with that name.
func (s *Store) setName(ctx context.Context, ref string, desc v1.Descriptor, source string) (v1.Descriptor, error) {
	var d v1.Descriptor
	err := s.withLock(ctx, func() error {
		idx, err := s.readIndex()
		if err != nil {
			return err
		}
		out := idx.Manifests[:0]
		for _, m := range idx.Manifests {
			if m.Annotations[AnnotationRefName] != ref {
				out = append(out, m)
			}
		}
		d = v1.Descriptor{
			MediaType: desc.MediaType,
			Size:      desc.Size,
			Digest:    desc.Digest,
			Platform:  desc.Platform,
			Annotations: map[string]string{
				AnnotationRefName: ref,
				AnnotationSource:  source,
				AnnotationAdded:   time.Now().UTC().Format(time.RFC3339),
			},
		}
		idx.Manifests = append(out, d)
		return s.writeIndex(idx)
	})
	return d, err
}

// lookup finds the index entry for a user reference: by normalized name, or
// by (short) manifest digest.
func (s *Store) lookup(ref string) (*v1.Descriptor, string, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, "", err
	}
	norm, perr := Normalize(ref)
	if perr == nil {
		for i, m := range idx.Manifests {
			if m.Annotations[AnnotationRefName] == norm {
				return &idx.Manifests[i], norm, nil
			}
		}
		// name@sha256:...: any local manifest with that digest, preferably in
		// the same repository.
		if at := strings.Index(norm, "@"); at >= 0 {
			dg := norm[at+1:]
			var found *v1.Descriptor
			for i, m := range idx.Manifests {
				if m.Digest.String() != dg {
					continue
				}
				if repoOf(m.Annotations[AnnotationRefName]) == repoOf(norm) {
					return &idx.Manifests[i], norm, nil
				}
				if found == nil {
					found = &idx.Manifests[i]
				}
			}
			if found != nil {
				return found, norm, nil
			}
		}
	}
	if hexPrefix.MatchString(ref) {
		want := ref
		if !strings.HasPrefix(want, "sha256:") {
			want = "sha256:" + want
		}
		var match *v1.Descriptor
		for i, m := range idx.Manifests {
			if strings.HasPrefix(m.Digest.String(), want) {
				if match != nil && match.Digest != m.Digest {
					return nil, "", fmt.Errorf("image %q is ambiguous: it matches %s and %s", ref, match.Digest, m.Digest)
				}
				if match == nil {
					match = &idx.Manifests[i]
				}
			}
		}
		if match != nil {
			return match, match.Annotations[AnnotationRefName], nil
		}
	}
	if perr != nil {
		return nil, "", perr
	}
	return nil, "", fmt.Errorf("image %q: %w in %s", norm, ErrNotFound, s.dir)
}

// Resolve finds an image in the store, without any network access. ref is a
// name ("python:slim", normalized with Normalize), a digest reference
// ("name@sha256:..."), or a manifest digest or unique prefix of one
// ("sha256:ab12", "ab12", at least 4 hex digits). It returns an error
// wrapping ErrNotFound when the image is absent.
func (s *Store) Resolve(ref string) (*Image, error) {
	desc, norm, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	return s.describe(norm, *desc)
}

// describe builds an Image from an index descriptor by reading its manifest
// and config blobs.
func (s *Store) describe(ref string, desc v1.Descriptor) (*Image, error) {
	m, rawMan, err := s.manifest(desc.Digest)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	cfgBytes, err := s.readBlob(m.Config.Digest, m.Config.Size)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", ref, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(cfgBytes))
	if err != nil {
		return nil, fmt.Errorf("image %s: parse config: %w", ref, err)
	}
	size := int64(len(rawMan)) + int64(len(cfgBytes))
	for _, l := range m.Layers {
		size += l.Size
	}
	return &Image{
		Ref:    ref,
		Digest: desc.Digest.String(),
		Config: ImageConfig{
			Env:        cf.Config.Env,
			WorkingDir: cf.Config.WorkingDir,
			User:       cf.Config.User,
			Entrypoint: cf.Config.Entrypoint,
			Cmd:        cf.Config.Cmd,
			Labels:     cf.Config.Labels,
		},
		Size:    size,
		Created: cf.Created.Time,
		Source:  desc.Annotations[AnnotationSource],
	}, nil
}

// manifest reads and verifies a manifest blob.
func (s *Store) manifest(h v1.Hash) (*v1.Manifest, []byte, error) {
	raw, err := s.readBlob(h, -1)
	if err != nil {
		return nil, nil, fmt.Errorf("manifest: %w", err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("parse manifest %s: %w", h, err)
	}
	return m, raw, nil
}

// List returns every named image in the store, sorted by Ref. Entries whose
// blobs are unreadable are skipped with their error joined into err, so a
// damaged entry does not hide the others.
func (s *Store) List() ([]*Image, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	var out []*Image
	var errs []error
	for _, m := range idx.Manifests {
		img, err := s.describe(m.Annotations[AnnotationRefName], m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ref < out[j].Ref })
	return out, errors.Join(errs...)
}

// Tag gives the image src (any form Resolve accepts) the additional name dst
// (normalized; an existing dst name is replaced). The new name keeps src's
// Source.
func (s *Store) Tag(src, dst string) error {
	desc, _, err := s.lookup(src)
	if err != nil {
		return err
	}
	norm, err := Normalize(dst)
	if err != nil {
		return err
	}
	_, err = s.setName(context.Background(), norm, *desc, desc.Annotations[AnnotationSource])
	return err
}

// Remove removes a name from the store. If ref is a bare digest or digest
// prefix, every name pointing at that manifest is removed. Blobs no longer
// used by any name are then deleted, unless a pull, import or build is
// writing to the store at the time (it holds the gc lock for as long as
// its registry sends): then they are left for a later Remove or GC rather
// than waited for. It returns an error wrapping ErrNotFound when nothing
// matches.
func (s *Store) Remove(ref string) error {
	desc, norm, err := s.lookup(ref)
	if err != nil {
		return err
	}
	byDigest := hexPrefix.MatchString(ref) && norm != mustNormalize(ref)
	err = s.withLock(context.Background(), func() error {
		idx, err := s.readIndex()
		if err != nil {
			return err
		}
		out := idx.Manifests[:0]
		for _, m := range idx.Manifests {
			if m.Annotations[AnnotationRefName] == norm || (byDigest && m.Digest == desc.Digest) {
				continue
			}
			out = append(out, m)
		}
		idx.Manifests = out
		return s.writeIndex(idx)
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), removeGCWait)
	defer cancel()
	_, err = s.gc(ctx)
	if errors.Is(err, errStoreBusy) {
		return nil
	}
	return err
}

// removeGCWait is how long Remove waits for writers before it leaves the
// blobs it freed for later.
const removeGCWait = 2 * time.Second

// errStoreBusy: the gc lock was not free within the caller's time.
var errStoreBusy = errors.New("image store busy: a pull, import or build is writing to it")

func mustNormalize(ref string) string {
	n, _ := Normalize(ref)
	return n
}

// GC deletes blobs not referenced by any named image and temporary files
// left by crashed writers more than a day ago, waiting for running pulls, imports and builds to finish first. It
// returns the number of bytes freed.
func (s *Store) GC() (int64, error) {
	return s.gc(context.Background())
}

// gc is GC waiting for the gc lock until ctx ends (errStoreBusy then).
func (s *Store) gc(ctx context.Context) (int64, error) {
	gl := s.gcLock()
	if ok, err := gl.TryLockContext(ctx, 50*time.Millisecond); !ok || err != nil {
		if ctx.Err() != nil {
			return 0, errStoreBusy
		}
		return 0, fmt.Errorf("lock image store for gc: %w", err)
	}
	defer gl.Unlock()
	keep := map[string]bool{}
	idx, err := s.readIndex()
	if err != nil {
		return 0, err
	}
	for _, d := range idx.Manifests {
		keep[d.Digest.Hex] = true
		m, _, err := s.manifest(d.Digest)
		if err != nil {
			// Keep what we cannot read rather than guess.
			return 0, fmt.Errorf("gc: %s: %w", d.Annotations[AnnotationRefName], err)
		}
		keep[m.Config.Digest.Hex] = true
		for _, l := range m.Layers {
			keep[l.Digest.Hex] = true
		}
	}
	var freed int64
	blobDir := filepath.Join(s.dir, "blobs", "sha256")
	ents, err := os.ReadDir(blobDir)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		if keep[e.Name()] {
			continue
		}
		if fi, err := e.Info(); err == nil {
			freed += fi.Size()
		}
		if err := os.Remove(filepath.Join(blobDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return freed, err
		}
	}
	// Stale temporary files of crashed writers: only our own kinds (blob
	// files, import folders of plain files), and only when old, since
	// writers do not hold the gc lock while they fill them.
	tmps, _ := os.ReadDir(filepath.Join(s.dir, "tmp"))
	for _, e := range tmps {
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < 24*time.Hour {
			continue
		}
		p := filepath.Join(s.dir, "tmp", e.Name())
		switch {
		case strings.HasPrefix(e.Name(), "blob-") && fi.Mode().IsRegular():
			os.Remove(p)
		case strings.HasPrefix(e.Name(), "import-") && fi.IsDir():
			os.RemoveAll(p)
		}
	}
	return freed, nil
}

// Untags returns what Remove(ref) takes away: the image ref names, the
// names it removes (ref itself when ref is one of its names; every name
// of the image for a digest) and whether no name is left for its content
// then. Errors: ErrNotFound.
func (s *Store) Untags(ref string) (img *Image, untag []string, last bool, err error) {
	if img, err = s.Resolve(ref); err != nil {
		return nil, nil, false, err
	}
	all, err := s.List()
	if err != nil {
		return nil, nil, false, err
	}
	var names []string
	byName := false
	norm, nerr := Normalize(ref)
	for _, o := range all {
		if o.Digest != img.Digest {
			continue
		}
		names = append(names, o.Ref)
		if nerr == nil && o.Ref == norm {
			byName = true
		}
	}
	untag = names
	if byName {
		untag = []string{norm}
	}
	return img, untag, len(untag) >= len(names), nil
}
