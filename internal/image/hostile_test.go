package image_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
)

// The hostile-registry tests: a real registry on loopback whose answers
// the test scripts (imagetest.Registry.Script) lies about sizes, sends
// without end, stalls, redirects. A pull must fail fast with an error that
// says what happened, holding no more than the bounds (MaxManifestBytes,
// MaxConfigBytes, PullOptions.MaxBytes) on the way.

// configBlob pushes a valid linux/amd64 image config with n layers' diff
// ids to repo and returns its descriptor.
func configBlob(t *testing.T, reg *imagetest.Registry, repo string) v1.Descriptor {
	t.Helper()
	b, _ := json.Marshal(v1.ConfigFile{OS: "linux", Architecture: "amd64", RootFS: v1.RootFS{Type: "layers"}})
	d := reg.PushBlob(t, repo, b)
	d.MediaType = types.OCIConfigJSON
	return d
}

// fakeDigest returns a well-formed digest no blob has.
func fakeDigest(i int) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%064x", i+1)}
}

func pullWithin(t *testing.T, ref string, opts image.PullOptions) (*image.Store, error) {
	t.Helper()
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = s.Pull(ctx, ref, opts)
	t.Logf("error: %v", err)
	return s, err
}

// TestHostileRegistryConfigSize: a config that declares no size (-1) or a
// huge one is refused before it is fetched, not read into memory until
// the registry stops.
func TestHostileRegistryConfigSize(t *testing.T) {
	for _, size := range []int64{-1, 1 << 40, image.MaxConfigBytes + 1} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			reg := imagetest.NewRegistry(t)
			cfg := v1.Descriptor{MediaType: types.OCIConfigJSON, Size: size, Digest: fakeDigest(0)}
			var sent atomic.Int64
			reg.Script("/blobs/"+cfg.Digest.String(), imagetest.Endless(128<<20, &sent))
			ref := reg.PushManifest(t, "evil/config:v1", v1.Manifest{Config: cfg})
			_, err := pullWithin(t, ref, image.PullOptions{})
			if !errors.Is(err, image.ErrTooLarge) || !strings.Contains(err.Error(), "config") {
				t.Errorf("config of %d bytes: %v, want ErrTooLarge naming the config", size, err)
			}
			if n := sent.Load(); n > 0 {
				t.Errorf("the registry sent %d bytes of the config", n)
			}
		})
	}
}

// TestHostileRegistryLayerSizes: a layer of negative size (whose stream
// nothing would bound), one past PullOptions.MaxBytes and one past the
// store's free space are refused before any layer is fetched.
func TestHostileRegistryLayerSizes(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int64
		max  int64
		want string
	}{
		{"negative", -1, 0, "must give each layer's size"},
		{"over MaxBytes", 100 << 20, 10 << 20, "10 MiB"},
		{"over free space", 1 << 50, 1 << 60, "free"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := imagetest.NewRegistry(t)
			cfg := configBlob(t, reg, "evil/layer")
			l := v1.Descriptor{MediaType: types.OCILayer, Size: tc.size, Digest: fakeDigest(1)}
			var sent atomic.Int64
			reg.Script("/blobs/"+l.Digest.String(), imagetest.Endless(128<<20, &sent))
			ref := reg.PushManifest(t, "evil/layer:v1", v1.Manifest{Config: cfg, Layers: []v1.Descriptor{l}})
			_, err := pullWithin(t, ref, image.PullOptions{MaxBytes: tc.max})
			if !errors.Is(err, image.ErrTooLarge) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("layer of %d bytes: %v, want ErrTooLarge saying %q", tc.size, err, tc.want)
			}
			if n := sent.Load(); n > 0 {
				t.Errorf("the registry sent %d bytes of the layer", n)
			}
		})
	}
}

// TestHostileRegistryManifestSize: a manifest that goes on and on is cut
// at MaxManifestBytes.
func TestHostileRegistryManifestSize(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	var sent atomic.Int64
	reg.Script("/manifests/big", imagetest.Endless(128<<20, &sent))
	_, err := pullWithin(t, reg.Host+"/evil/manifest:big", image.PullOptions{})
	if !errors.Is(err, image.ErrTooLarge) || !strings.Contains(err.Error(), "manifest big") {
		t.Errorf("endless manifest: %v, want ErrTooLarge naming it", err)
	}
	// What the socket buffers held besides the 4 MiB read.
	if n := sent.Load(); n > 32<<20 {
		t.Errorf("the registry sent %d MiB of the manifest", n>>20)
	}
}

// TestHostileRegistryStall: a registry that stops sending (headers never
// come, a blob stops halfway, a blob trickles a few bytes at a time) fails
// the pull after PullOptions.StallTimeout, naming the registry and what it
// was sending.
func TestHostileRegistryStall(t *testing.T) {
	head := []byte("\x1f\x8b partial layer")
	trickle := func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(head)+1<<20))
		w.WriteHeader(http.StatusOK)
		for {
			if _, err := w.Write([]byte("0123456789")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-req.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	for _, tc := range []struct {
		name   string
		layer  bool // scripts the layer blob, else the manifest
		script http.HandlerFunc
		want   string
	}{
		{"no headers", false, imagetest.Stall(false, nil), "manifest v1"},
		{"blob halfway", true, imagetest.Stall(true, head), "blob sha256:"},
		{"blob trickle", true, trickle, "blob sha256:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := imagetest.NewRegistry(t)
			cfg := configBlob(t, reg, "evil/stall")
			l := v1.Descriptor{MediaType: types.OCILayer, Size: int64(len(head) + 1<<20), Digest: fakeDigest(2)}
			if tc.layer {
				reg.Script("/blobs/"+l.Digest.String(), tc.script)
			} else {
				reg.Script("/manifests/v1", tc.script)
			}
			ref := reg.PushManifest(t, "evil/stall:v1", v1.Manifest{Config: cfg, Layers: []v1.Descriptor{l}})
			t0 := time.Now()
			_, err := pullWithin(t, ref, image.PullOptions{StallTimeout: 500 * time.Millisecond})
			if !errors.Is(err, image.ErrStalled) || !strings.Contains(err.Error(), reg.Host) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("stalled registry: %v, want ErrStalled naming %s and %q", err, reg.Host, tc.want)
			}
			if d := time.Since(t0); d > 15*time.Second {
				t.Errorf("the pull took %s to give up", d)
			}
		})
	}
}

// TestHostileRegistryManyLayers: an image of more than MaxLayers layers is
// refused, and one of many layers fetches them with a few goroutines, not
// one each.
func TestHostileRegistryManyLayers(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	cfg := configBlob(t, reg, "evil/many")
	var ls []v1.Descriptor
	for i := range image.MaxLayers + 1 {
		ls = append(ls, v1.Descriptor{MediaType: types.OCILayer, Size: 10, Digest: fakeDigest(100 + i)})
	}
	ref := reg.PushManifest(t, "evil/many:all", v1.Manifest{Config: cfg, Layers: ls})
	if _, err := pullWithin(t, ref, image.PullOptions{}); !errors.Is(err, image.ErrTooLarge) || !strings.Contains(err.Error(), "layers") {
		t.Errorf("%d layers: %v, want ErrTooLarge", len(ls), err)
	}
	if n := reg.BlobGets(); n > 1 {
		t.Errorf("%d blob requests for an image refused by its manifest", n)
	}

	// 400 layers whose blobs stall: the pull runs a few at a time.
	ls = ls[:400]
	for _, l := range ls {
		reg.Script("/blobs/"+l.Digest.String(), imagetest.Stall(false, nil))
	}
	ref = reg.PushManifest(t, "evil/many:some", v1.Manifest{Config: cfg, Layers: ls})
	base := runtime.NumGoroutine()
	var peak atomic.Int64
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
				if n := int64(runtime.NumGoroutine()); n > peak.Load() {
					peak.Store(n)
				}
			}
		}
	}()
	_, err := pullWithin(t, ref, image.PullOptions{StallTimeout: time.Second})
	close(done)
	if !errors.Is(err, image.ErrStalled) {
		t.Errorf("stalling layers: %v, want ErrStalled", err)
	}
	// The registry's own handlers and the connections count too: a few
	// per layer in flight.
	t.Logf("goroutines: %d before, %d at the peak of the pull", base, peak.Load())
	if grew := peak.Load() - int64(base); grew > 80 {
		t.Errorf("goroutines grew by %d during a pull of %d layers", grew, len(ls))
	}
}

// TestHostileRegistryErrorBody: an error response's body (which could be
// anything a redirect or the registry chose to show) stays out of the
// error; its status says what happened.
func TestHostileRegistryErrorBody(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusNotFound, http.StatusUnauthorized} {
		reg := imagetest.NewRegistry(t)
		reg.Script("/manifests/v1", imagetest.Fail(status, "SECRET-FROM-THE-INTRANET "+strings.Repeat("x", 100)))
		_, err := pullWithin(t, reg.Host+"/evil/body:v1", image.PullOptions{})
		if err == nil || strings.Contains(err.Error(), "SECRET") || !strings.Contains(err.Error(), fmt.Sprintf("HTTP %d", status)) || !strings.Contains(err.Error(), reg.Host) {
			t.Errorf("HTTP %d: %v, want the status and registry, not the body", status, err)
		}
	}
}

// TestHostileRegistryRedirectChecked: PullOptions.CheckAddr sees every
// host a pull connects to, with its address after name resolution: the
// registry's own, a redirect's and the token realm's. (go-containerregistry
// refuses redirects and realms to private IP literals itself, not names
// that resolve to them, as localhost does here.)
func TestHostileRegistryRedirectChecked(t *testing.T) {
	base, top := testImage(t)
	// Only the registry's own literal address passes.
	only := func(host string, a netip.Addr) error {
		if host != "127.0.0.1" {
			return fmt.Errorf("%s is not the registry", host)
		}
		return nil
	}
	reg := imagetest.NewRegistry(t)
	ref := reg.Push(t, "test/app:v1", imagetest.Image(t, nil, base, top))
	if _, err := pullWithin(t, ref, image.PullOptions{CheckAddr: only}); err != nil {
		t.Fatalf("pull from an allowed address: %v", err)
	}
	// By name: the check gets the resolved address.
	local := strings.Replace(ref, "127.0.0.1", "localhost", 1)
	if _, err := pullWithin(t, local, image.PullOptions{CheckAddr: only}); !errors.Is(err, image.ErrAddressRefused) || !strings.Contains(err.Error(), "localhost (127.0.0.1)") {
		t.Errorf("registry by name: %v, want ErrAddressRefused naming localhost (127.0.0.1)", err)
	}
	// A redirect to a name, and a token realm there.
	otherHost := strings.Replace(imagetest.NewRegistry(t).Host, "127.0.0.1", "localhost", 1)
	reg2 := imagetest.NewRegistry(t)
	reg2.Script("/manifests/v1", imagetest.Redirect("http://"+otherHost+"/v2/test/app/manifests/v1"))
	if _, err := pullWithin(t, reg2.Host+"/test/app:v1", image.PullOptions{CheckAddr: only}); !errors.Is(err, image.ErrAddressRefused) || !strings.Contains(err.Error(), "localhost (127.0.0.1)") {
		t.Errorf("redirect: %v, want ErrAddressRefused naming localhost", err)
	}
	reg3 := imagetest.NewRegistry(t)
	reg3.Script("/v2/", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+otherHost+`/token",service="x"`)
		w.WriteHeader(http.StatusUnauthorized)
	})
	if _, err := pullWithin(t, reg3.Host+"/test/app:v1", image.PullOptions{CheckAddr: only}); !errors.Is(err, image.ErrAddressRefused) || !strings.Contains(err.Error(), "localhost (127.0.0.1)") {
		t.Errorf("token realm: %v, want ErrAddressRefused naming localhost", err)
	}
}

// TestHostileRegistryRemoveDuringStall: a pull that a registry holds open
// (it keeps the store's gc lock while it downloads) does not hold up
// removing another image: Remove leaves the freed blobs for later.
func TestHostileRegistryRemoveDuringStall(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base, top := testImage(t)
	good := reg.Push(t, "test/app:v1", imagetest.Image(t, nil, base, top))
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(context.Background(), good, image.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := configBlob(t, reg, "evil/slow")
	l := v1.Descriptor{MediaType: types.OCILayer, Size: 1 << 20, Digest: fakeDigest(3)}
	started := make(chan struct{}, 1)
	stall := imagetest.Stall(false, nil)
	reg.Script("/blobs/"+l.Digest.String(), func(w http.ResponseWriter, req *http.Request) {
		started <- struct{}{}
		stall(w, req)
	})
	slow := reg.PushManifest(t, "evil/slow:v1", v1.Manifest{Config: cfg, Layers: []v1.Descriptor{l}})
	ctx, cancel := context.WithCancel(context.Background())
	pulled := make(chan error, 1)
	go func() {
		_, err := s.Pull(ctx, slow, image.PullOptions{StallTimeout: time.Minute})
		pulled <- err
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the stalling blob was never asked for")
	}
	t0 := time.Now()
	if err := s.Remove(good); err != nil {
		t.Errorf("Remove during a stalled pull: %v", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("Remove waited %s for a stalled pull", d)
	}
	if _, err := s.Resolve(good); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("removed image still resolves: %v", err)
	}
	cancel()
	<-pulled
	// With the pull gone, GC frees what Remove left.
	if n, err := s.GC(); err != nil || n == 0 {
		t.Errorf("GC after the pull: freed %d, %v", n, err)
	}
}
