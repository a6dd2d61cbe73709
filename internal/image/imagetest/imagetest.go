// Package imagetest builds small test images from hand-written tar layers
// and serves them from an in-memory loopback registry
// (go-containerregistry's pkg/registry). It is for tests only.
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a test layer. Type defaults to a regular file
// (or a directory when Name ends in "/"); Mode defaults to 0644 for files
// and 0755 for directories.
type Entry struct {
	Name     string
	Type     byte
	Body     string
	Linkname string
	Mode     int64
	Uid, Gid int
	ModTime  time.Time
	Xattrs   map[string]string
	// Devmajor and Devminor are for device nodes.
	Devmajor, Devminor int64
}

// Tar returns the entries as an uncompressed tar archive.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Linkname: e.Linkname, Mode: e.Mode, Uid: e.Uid, Gid: e.Gid, ModTime: e.ModTime, Devmajor: e.Devmajor, Devminor: e.Devminor, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
			if strings.HasSuffix(e.Name, "/") {
				h.Typeflag = tar.TypeDir
			}
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		for k, v := range e.Xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Image builds a linux/amd64 image whose layers are the given tar archives
// (gzip-compressed in the image), oldest first, with Cmd cmd.
func Image(t testing.TB, cmd []string, layers ...[]byte) v1.Image {
	t.Helper()
	return ImageCompressed(t, compression.GZip, cmd, layers...)
}

// ImageCompressed is Image with the layers compressed by comp
// (compression.GZip or compression.ZStd).
func ImageCompressed(t testing.TB, comp compression.Compression, cmd []string, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, b := range layers {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, tarball.WithCompression(comp))
		if err != nil {
			t.Fatal(err)
		}
		img, err = mutate.AppendLayers(img, l)
		if err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: time.Unix(1700000000, 0).UTC()}
	cf.Config.Cmd = cmd
	cf.Config.Env = []string{"PATH=/usr/bin:/bin"}
	cf.Config.WorkingDir = "/work"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Registry is a loopback test registry that counts requests.
type Registry struct {
	// Host is "127.0.0.1:PORT".
	Host string
	// Server is the underlying test server.
	Server *httptest.Server

	blobGets atomic.Int64
	mu       sync.Mutex
	corrupt  map[string]bool
	scripts  []script
}

type script struct {
	suffix string
	h      http.HandlerFunc
}

// NewRegistry starts a registry on loopback, closed when the test ends.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	r := &Registry{corrupt: map[string]bool{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		var sh http.HandlerFunc
		for _, sc := range r.scripts {
			if strings.HasSuffix(req.URL.Path, sc.suffix) {
				sh = sc.h
				break
			}
		}
		r.mu.Unlock()
		if sh != nil && req.Method == http.MethodGet {
			sh(w, req)
			return
		}
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
			r.blobGets.Add(1)
			if os.Getenv("IMAGETEST_DEBUG") != "" {
				log.Printf("blob GET %s", req.URL.Path)
			}
			dg := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]
			r.mu.Lock()
			bad := r.corrupt[dg]
			r.mu.Unlock()
			if bad {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				body := rec.Body.Bytes()
				if len(body) > 0 {
					body[len(body)/2] ^= 0xff
				}
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(body)
				return
			}
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Server.Close)
	r.Host = strings.TrimPrefix(r.Server.URL, "http://")
	return r
}

// BlobGets returns how many blob GET requests the registry has served.
func (r *Registry) BlobGets() int64 { return r.blobGets.Load() }

// Corrupt makes the registry serve the blob with this digest
// ("sha256:...") with one byte flipped.
func (r *Registry) Corrupt(digest string) {
	r.mu.Lock()
	r.corrupt[digest] = true
	r.mu.Unlock()
}

// Push pushes img as repo:tag ("test/app:v1") and returns the full
// reference ("127.0.0.1:PORT/test/app:v1").
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref := r.Host + "/" + repoTag
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

// PushIndex pushes a multi-platform index holding img for each platform
// ("linux/amd64", "linux/arm64") and returns the full reference.
func (r *Registry) PushIndex(t testing.TB, repoTag string, img v1.Image, platforms ...string) string {
	t.Helper()
	var idx v1.ImageIndex = empty.Index
	for _, p := range platforms {
		pl, err := v1.ParsePlatform(p)
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: pl}})
	}
	ref := r.Host + "/" + repoTag
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	return ref
}
