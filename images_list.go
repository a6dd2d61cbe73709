package airlock

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/airlock-run/airlock/internal/image"
)

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

type pullCheckKey struct{}

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
	return context.WithValue(ctx, pullCheckKey{}, check)
}

func pullCheck(ctx context.Context) func(string, netip.Addr) error {
	f, _ := ctx.Value(pullCheckKey{}).(func(string, netip.Addr) error)
	return f
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

// PullImage pulls ref (Docker name resolution; plain HTTP for loopback
// registries) into the store, reporting through ev (its fields may be
// nil), and returns the stored image. Blobs already stored are not
// downloaded again. Errors wrap ErrImageNotFound when the registry has no
// such image or cannot be reached.
func (r *Runtime) PullImage(ctx context.Context, ref string, ev PullEvents) (ImageInfo, error) {
	if ev.Start != nil {
		ev.Start(ref)
	}
	t0 := time.Now()
	img, err := r.images.Pull(ctx, ref, image.PullOptions{Progress: ev.Progress, CheckAddr: pullCheck(ctx)})
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
		return ImageInfo{}, fmt.Errorf("%w: %w", ErrImageNotFound, err)
	}
	return imageInfo(img), nil
}
