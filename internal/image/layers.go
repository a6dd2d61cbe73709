package image

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/dustin/go-humanize"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Layer is one filesystem layer of a stored image.
type Layer struct {
	// Digest is the digest of the blob as stored ("sha256:...", usually of
	// the compressed tar).
	Digest string
	// DiffID is the digest of the uncompressed tar, from the image config.
	DiffID string
	// MediaType is the layer media type from the manifest.
	MediaType string
	// Size is the stored blob size in bytes.
	Size int64

	store *Store
	hash  v1.Hash
}

// Open returns the layer as an uncompressed tar stream (gzip and zstd blobs
// are decompressed; the format is detected from the content). The blob is
// verified against Digest while it is read: reading to the end or Close
// returns an error wrapping ErrDigestMismatch if it is damaged, so callers
// must check Close's error.
func (l Layer) Open() (io.ReadCloser, error) {
	rc, err := l.store.openBlob(l.hash, l.Size)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(rc, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
		return &layerReader{r: zr, closers: []func() error{zr.Close, rc.Close}}, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
		return &layerReader{r: zr, closers: []func() error{func() error { zr.Close(); return nil }, rc.Close}}, nil
	}
	return &layerReader{r: br, closers: []func() error{rc.Close}}, nil
}

type layerReader struct {
	r       io.Reader
	closers []func() error
}

func (l *layerReader) Read(p []byte) (int, error) { return l.r.Read(p) }

func (l *layerReader) Close() error {
	var first error
	for _, c := range l.closers {
		if err := c(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Layers returns the image's layers in application order, oldest (base)
// first. Foreign (non-distributable) layers are not supported and make it
// fail.
func (s *Store) Layers(img *Image) ([]Layer, error) {
	h, err := v1.NewHash(img.Digest)
	if err != nil {
		return nil, fmt.Errorf("image %s: bad digest: %w", img.Ref, err)
	}
	m, _, err := s.manifest(h)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Ref, err)
	}
	cfgBytes, err := s.readBlob(m.Config.Digest, m.Config.Size)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", img.Ref, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(cfgBytes))
	if err != nil {
		return nil, fmt.Errorf("image %s: parse config: %w", img.Ref, err)
	}
	out := make([]Layer, 0, len(m.Layers))
	for i, d := range m.Layers {
		if !d.MediaType.IsDistributable() {
			return nil, fmt.Errorf("image %s: layer %s is a foreign layer (%s), which airlock does not support", img.Ref, d.Digest, d.MediaType)
		}
		l := Layer{Digest: d.Digest.String(), MediaType: string(d.MediaType), Size: d.Size, store: s, hash: d.Digest}
		if i < len(cf.RootFS.DiffIDs) {
			l.DiffID = cf.RootFS.DiffIDs[i].String()
		}
		out = append(out, l)
	}
	return out, nil
}

// storedImage implements partial.CompressedImageCore over the store's blobs.
type storedImage struct {
	s      *Store
	raw    []byte
	m      *v1.Manifest
	digest v1.Hash
}

func (s *Store) v1Image(img *Image) (v1.Image, error) {
	h, err := v1.NewHash(img.Digest)
	if err != nil {
		return nil, err
	}
	m, raw, err := s.manifest(h)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(&storedImage{s: s, raw: raw, m: m, digest: h})
}

func (si *storedImage) RawConfigFile() ([]byte, error) {
	return si.s.readBlob(si.m.Config.Digest, si.m.Config.Size)
}

func (si *storedImage) MediaType() (types.MediaType, error) {
	if si.m.MediaType != "" {
		return si.m.MediaType, nil
	}
	return types.OCIManifestSchema1, nil
}

func (si *storedImage) RawManifest() ([]byte, error) { return si.raw, nil }

func (si *storedImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == si.m.Config.Digest {
		return &storedLayer{s: si.s, d: si.m.Config}, nil
	}
	for _, d := range si.m.Layers {
		if d.Digest == h {
			return &storedLayer{s: si.s, d: d}, nil
		}
	}
	return nil, fmt.Errorf("blob %s is not part of manifest %s", h, si.digest)
}

type storedLayer struct {
	s *Store
	d v1.Descriptor
}

func (l *storedLayer) Digest() (v1.Hash, error)            { return l.d.Digest, nil }
func (l *storedLayer) Size() (int64, error)                { return l.d.Size, nil }
func (l *storedLayer) MediaType() (types.MediaType, error) { return l.d.MediaType, nil }
func (l *storedLayer) Compressed() (io.ReadCloser, error)  { return l.s.openBlob(l.d.Digest, l.d.Size) }

// ProgressFunc receives per-blob progress: the blob digest, bytes done so far
// and the total bytes (-1 if unknown). Blobs already present are reported
// once with done == total. Calls are serialized (never concurrent).
type ProgressFunc func(digest string, done, total int64)

// WriteImage stores a go-containerregistry image (its manifest, config and
// layer blobs, each verified) under the name ref with the given Source text,
// and returns the stored image. Blobs already present are not read again.
// It is how images built in-process (package imagebuild) are stored.
func (s *Store) WriteImage(ctx context.Context, ref string, img v1.Image, source string, progress ProgressFunc) (*Image, error) {
	norm, err := Normalize(ref)
	if err != nil {
		return nil, err
	}
	gl := s.gcLock()
	if err := gl.RLock(); err != nil {
		return nil, err
	}
	defer gl.Unlock()
	desc, err := s.storeImage(ctx, img, progress, DefaultMaxImageBytes)
	if err != nil {
		return nil, err
	}
	nd, err := s.setName(ctx, norm, *desc, source)
	if err != nil {
		return nil, err
	}
	return s.describe(norm, nd)
}

// storeImage writes img's blobs (config and layers first, the manifest last)
// and returns the manifest descriptor; an image declaring more than
// maxBytes (see checkManifest) is refused first. The caller holds the gc
// lock shared.
func (s *Store) storeImage(ctx context.Context, img v1.Image, progress ProgressFunc, maxBytes int64) (*v1.Descriptor, error) {
	raw, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return nil, err
	}
	if mt != types.OCIManifestSchema1 && mt != types.DockerManifestSchema2 {
		return nil, fmt.Errorf("unsupported manifest media type %q (want an OCI or Docker v2 image manifest)", mt)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parse manifest: %w", err)
	}
	if err := s.checkManifest(m, maxBytes); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	report := func(d v1.Hash, done, total int64) {
		if progress == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		progress(d.String(), done, total)
	}
	// Config.
	cfg := m.Config
	if err := s.ensureBlob(ctx, cfg.Digest, cfg.Size, func() (io.ReadCloser, error) {
		b, err := img.RawConfigFile()
		if err != nil {
			return nil, fmt.Errorf("read config %s: %w", cfg.Digest, err)
		}
		return io.NopCloser(bytes.NewReader(b)), nil
	}, nil); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	// Layers, by 3 workers: the first error stops the others.
	var todo []v1.Descriptor
	for _, ld := range m.Layers {
		if !ld.MediaType.IsDistributable() {
			return nil, fmt.Errorf("layer %s is a foreign layer (%s), which airlock does not support", ld.Digest, ld.MediaType)
		}
		if s.hasBlob(ld.Digest, ld.Size) {
			report(ld.Digest, ld.Size, ld.Size)
			continue
		}
		todo = append(todo, ld)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan v1.Descriptor)
	errc := make(chan error, layerWorkers)
	var wg sync.WaitGroup
	for range min(layerWorkers, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ld := range next {
				report(ld.Digest, 0, ld.Size)
				err := s.ensureBlob(wctx, ld.Digest, ld.Size, func() (io.ReadCloser, error) {
					l, err := img.LayerByDigest(ld.Digest)
					if err != nil {
						return nil, err
					}
					return l.Compressed()
				}, func(done int64) { report(ld.Digest, done, ld.Size) })
				if err != nil {
					errc <- fmt.Errorf("layer: %w", err)
					cancel()
					return
				}
			}
		}()
	}
feed:
	for _, ld := range todo {
		select {
		case next <- ld:
		case <-wctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h, err := s.putBytes(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return &v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: h}, nil
}

// layerWorkers is how many layers a pull or import fetches at once.
const layerWorkers = 3

// checkManifest refuses an image whose manifest declares more than the
// host should hold: more than MaxLayers layers, a config of unknown size
// or over MaxConfigBytes, a layer of negative size (no bound on its
// stream), a total over maxBytes, or more missing bytes than the store's
// filesystem has free. Each error wraps ErrTooLarge and says the limit.
func (s *Store) checkManifest(m *v1.Manifest, maxBytes int64) error {
	if len(m.Layers) > MaxLayers {
		return fmt.Errorf("the image has %d layers, more than the %d airlock accepts: %w", len(m.Layers), MaxLayers, ErrTooLarge)
	}
	if m.Config.Size < 0 || m.Config.Size > MaxConfigBytes {
		return fmt.Errorf("the image config %s declares %d bytes; airlock accepts configs of 0 to %s: %w",
			m.Config.Digest, m.Config.Size, humanize.IBytes(MaxConfigBytes), ErrTooLarge)
	}
	total, missing := m.Config.Size, int64(0)
	if !s.hasBlob(m.Config.Digest, m.Config.Size) {
		missing = m.Config.Size
	}
	for _, l := range m.Layers {
		if l.Size < 0 {
			return fmt.Errorf("layer %s declares %d bytes; a registry must give each layer's size: %w", l.Digest, l.Size, ErrTooLarge)
		}
		if l.Size > maxBytes-total {
			return fmt.Errorf("the image declares more than %s (layer %s alone: %s), the most this pull accepts: %w",
				humanize.IBytes(uint64(maxBytes)), l.Digest, humanize.IBytes(uint64(l.Size)), ErrTooLarge)
		}
		total += l.Size
		if !s.hasBlob(l.Digest, l.Size) {
			missing += l.Size
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err == nil {
		if free := int64(st.Bavail) * int64(st.Bsize); free >= 0 && missing > free {
			return fmt.Errorf("the image needs %s more in %s, whose filesystem has %s free: free space or set AIRLOCK_IMAGES to a larger store: %w",
				humanize.IBytes(uint64(missing)), s.dir, humanize.IBytes(uint64(free)), ErrTooLarge)
		}
	}
	return nil
}
