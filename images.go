package airlock

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/snapmeta"
)

// ErrImageInUse: the image's content would be removed while boxes use it.
var ErrImageInUse = errors.New("image is used by boxes")

// PullEvents hear about an image pull that Create starts because the image
// is missing from the store. Any of them may be nil.
type PullEvents struct {
	// Start is called before the pull of ref begins.
	Start func(ref string)
	// Progress reports bytes of one layer (by digest) downloaded so far.
	Progress func(layer string, done, total int64)
	// Done is called when the pull has ended: with the stored name and
	// manifest digest, or with the error.
	Done func(ref, digest string, err error)
}

// ImageRemoval is what RemoveImage did.
type ImageRemoval struct {
	// Untagged are the names removed.
	Untagged []string
	// Deleted is the manifest digest whose content was removed, "" when
	// another name still holds it.
	Deleted string
	// UsedBy are the boxes that still use the deleted image (force): they
	// keep running but cannot start again until the image is back.
	UsedBy []string
	// BaseErr, when not nil, says why the image's cached root filesystem
	// base could not be removed (the image itself is gone).
	BaseErr error
}

// RemoveImage removes one image name or, for a digest, every name of that
// image, and the image's content and cached root filesystem base when no
// name is left for it. It refuses with ErrImageInUse (naming the boxes)
// when the content would go while boxes use it, unless force is set.
// Errors: ErrImageNotFound when no image has that name or digest.
func (r *Runtime) RemoveImage(ctx context.Context, ref string, force bool) (*ImageRemoval, error) {
	s := r.images
	img, untag, last, err := s.Untags(ref)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return nil, fmt.Errorf("no such image %q in the local store: %w", ref, ErrImageNotFound)
		}
		return nil, err
	}
	res := &ImageRemoval{Untagged: untag}
	// The content goes when no name is left for it.
	if last {
		users, err := r.db.ImageInUse(ctx, img.Digest)
		if err != nil {
			return nil, fmt.Errorf("boxes using image %s: %w", ref, err)
		}
		snaps := snapmeta.OfImage(r.snapshotsDir(), img.Digest)
		if (len(users) > 0 || len(snaps) > 0) && !force {
			return nil, &ImageInUseError{Ref: ref, Digest: img.Digest, Boxes: users, PoolBoxes: r.poolBoxIDs(ctx, users), Snapshots: snaps}
		}
		res.UsedBy = users
	}
	if err := s.Remove(ref); err != nil {
		return nil, err
	}
	if _, err := s.Resolve(img.Digest); !errors.Is(err, image.ErrNotFound) {
		res.UsedBy = nil
		return res, nil // another name still holds it
	}
	res.Deleted = img.Digest
	if len(res.UsedBy) == 0 {
		res.BaseErr = rootfs.RemoveBase(ctx, r.opts.CacheDir, img.Digest)
	}
	return res, nil
}

// ImageInUseError is RemoveImage's refusal; it matches ErrImageInUse.
type ImageInUseError struct {
	Ref, Digest string
	Boxes       []string // ids of the boxes that use it
	// PoolBoxes are those of Boxes that are warm-pool boxes (not listed;
	// Runtime.PoolBoxes, airlock system df -v).
	PoolBoxes []string
	// Snapshots are the names of the memory snapshots of boxes of the
	// image: a restore needs it.
	Snapshots []string
}

func (e *ImageInUseError) Error() string {
	d := e.Digest
	if len(d) > 19 {
		d = d[:19]
	}
	if len(e.Boxes) == 0 {
		return fmt.Sprintf("image %s (%s) is used by snapshot(s) %s, which restore from it: remove them first (airlock snapshot rm), or force the removal (they can then no longer be restored)",
			e.Ref, d, strings.Join(e.Snapshots, ", "))
	}
	if len(e.PoolBoxes) > 0 {
		return fmt.Sprintf("image %s (%s) is used by box(es) %s, of which %s are warm-pool boxes (not listed: see airlock system df -v; they go when the process holding the pool, such as airlock serve --pool, exits): remove the others and stop that process first, or force the removal",
			e.Ref, d, strings.Join(e.Boxes, ", "), strings.Join(e.PoolBoxes, ", "))
	}
	return fmt.Sprintf("image %s (%s) is used by box(es) %s: remove them first, or force the removal", e.Ref, d, strings.Join(e.Boxes, ", "))
}

// Is makes errors.Is(err, ErrImageInUse) true.
func (e *ImageInUseError) Is(target error) bool { return target == ErrImageInUse }

// ImageInfo describes an image in the runtime's store.
type ImageInfo struct {
	// Ref is the normalized reference ("docker.io/library/python:slim").
	Ref string
	// Digest is the manifest digest ("sha256:<64 hex>").
	Digest string
	// Size is the bytes the image's blobs take in the store (compressed).
	Size int64
	// Created is the creation time in the image config (zero if absent).
	Created time.Time
	// Source says where the image came from ("registry", or what built it).
	Source string
}

// WithPullCheck returns a context under which the image pulls PullImage
// and Create make ask check about every address they connect to (the
// registry, each redirect, the token realm): host is the name as it was
// to be reached, addr the address it resolved to, asked at connect time so
// that a name resolving elsewhere later (DNS rebinding) is checked too. An
// error from check refuses that connection and fails the pull with an
// error wrapping check's error. Under a check, pulls connect directly,
// never through an HTTP proxy from the environment. airlock serve applies
// its network grants to the pulls its clients cause this way.
func WithPullCheck(ctx context.Context, check func(host string, addr netip.Addr) error) context.Context {
	return image.WithCheckAddr(ctx, check)
}

func imageInfo(im *image.Image) ImageInfo {
	return ImageInfo{Ref: im.Ref, Digest: im.Digest, Size: im.Size, Created: im.Created, Source: im.Source}
}

// ListImages returns the images in the runtime's store.
func (r *Runtime) ListImages() ([]ImageInfo, error) {
	imgs, err := r.images.List()
	if err != nil {
		return nil, err
	}
	out := make([]ImageInfo, 0, len(imgs))
	for _, im := range imgs {
		out = append(out, imageInfo(im))
	}
	return out, nil
}

// LocalImage finds ref (a name, name@digest or a manifest digest) in the
// runtime's store without any network access. Errors wrap
// ErrImageNotFound when the store has no such image.
func (r *Runtime) LocalImage(ref string) (ImageInfo, error) {
	img, err := r.images.Resolve(ref)
	if errors.Is(err, image.ErrNotFound) {
		return ImageInfo{}, fmt.Errorf("%w: %w", ErrImageNotFound, err)
	}
	if err != nil {
		return ImageInfo{}, err
	}
	return imageInfo(img), nil
}

// PullImage pulls ref (Docker name resolution; plain HTTP for loopback
// registries) into the store, reporting through ev (its fields may be
// nil), and returns the stored image. Blobs already stored are not
// downloaded again. Errors wrap ErrImageNotFound when the registry has no
// such image or cannot be reached.
func (r *Runtime) PullImage(ctx context.Context, ref string, ev PullEvents) (ImageInfo, error) {
	img, err := r.pull(ctx, ref, ev)
	if err != nil {
		return ImageInfo{}, err
	}
	return imageInfo(img), nil
}

// pull pulls ref into the store, reporting through ev and the Observer.
// Errors wrap ErrImageNotFound.
func (r *Runtime) pull(ctx context.Context, ref string, ev PullEvents) (*image.Image, error) {
	if ev.Start != nil {
		ev.Start(ref)
	}
	t0 := time.Now()
	img, err := r.images.Pull(ctx, ref, image.PullOptions{Progress: ev.Progress, CheckAddr: image.CheckAddrOf(ctx)})
	if ev.Done != nil {
		if err != nil {
			ev.Done(ref, "", err)
		} else {
			ev.Done(img.Ref, img.Digest, nil)
		}
	}
	if o := r.opts.Observer; o != nil {
		o.ImagePulled(ImagePullEvent{Ref: ref, Duration: time.Since(t0), Err: err})
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrImageNotFound, err)
	}
	return img, nil
}
