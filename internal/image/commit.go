package image

import (
	"context"
	"fmt"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// CommitOptions describe the layer AppendLayer adds.
type CommitOptions struct {
	// Comment and CreatedBy go into the layer's history entry
	// (`docker history` shows CreatedBy).
	Comment, CreatedBy string
	// Created is the new image's creation time (default: now).
	Created time.Time
	// Source is the new name's Image.Source text.
	Source string
}

// AppendLayer stores, under the name ref, the image base plus one layer:
// the uncompressed tar at layerPath (an OCI changeset: whiteouts as
// ".wh." files), gzip-compressed. The new image keeps base's
// configuration (environment, entrypoint, user) and manifest type, with
// a history entry for the layer. ref is normalized as in Tag; an existing
// name is moved to the new image.
func (s *Store) AppendLayer(ctx context.Context, base *Image, ref, layerPath string, opts CommitOptions) (*Image, error) {
	bi, err := s.v1Image(base)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", base.Ref, err)
	}
	mt, err := bi.MediaType()
	if err != nil {
		return nil, err
	}
	lmt := types.DockerLayer
	if mt == types.OCIManifestSchema1 {
		lmt = types.OCILayer
	}
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(lmt), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", layerPath, err)
	}
	created := opts.Created
	if created.IsZero() {
		created = time.Now().UTC()
	}
	img, err := mutate.Append(bi, mutate.Addendum{Layer: layer, MediaType: lmt, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: opts.CreatedBy, Comment: opts.Comment}})
	if err != nil {
		return nil, err
	}
	img, err = mutate.CreatedAt(img, v1.Time{Time: created})
	if err != nil {
		return nil, err
	}
	return s.WriteImage(ctx, ref, img, opts.Source, nil)
}
