package rootfs

import (
	"context"
	"fmt"
	"os"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/scratch"
)

// CommitLayer stores in images, as ref, base with one more layer: the
// upper layer of disk, a box's writable layer that nothing writes while
// it is read (UpperLayerWith with tool, within lim). The layer is made in
// scratchDir and removed once stored.
func CommitLayer(ctx context.Context, images *image.Store, base *image.Image, ref, disk, scratchDir string,
	lim unpack.Limits, tool ToolRunner, opts image.CommitOptions) (*image.Image, LayerStats, error) {
	layer, err := scratch.CreateTemp(scratchDir, "commit", ".tar")
	if err != nil {
		return nil, LayerStats{}, err
	}
	defer os.Remove(layer.Name())
	defer layer.Close()
	st, err := UpperLayerWith(ctx, disk, scratchDir, layer, lim, tool)
	if err != nil {
		return nil, st, err
	}
	if err := layer.Close(); err != nil {
		return nil, st, err
	}
	img, err := images.AppendLayer(ctx, base, ref, layer.Name(), opts)
	if err != nil {
		return nil, st, fmt.Errorf("store the image: %w", err)
	}
	return img, st, nil
}
