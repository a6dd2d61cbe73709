package imagetest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The hostile-registry helpers: a test registry (NewRegistry) whose
// answers a test scripts, to play a registry that lies about sizes, sends
// without end, stalls or redirects. Scripts answer GET requests; the
// registry itself keeps answering everything else (pushes, HEAD).

// Script makes GET requests whose path ends with suffix
// ("/blobs/sha256:...", "/manifests/v1", "/v2/") be answered by h instead
// of the registry; the first script added that matches wins.
func (r *Registry) Script(suffix string, h http.HandlerFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scripts = append(r.scripts, script{suffix: suffix, h: h})
}

// PushBlob uploads data as a blob of repo ("test/app") and returns its
// descriptor (an OCI gzip layer media type; the content is not checked).
func (r *Registry) PushBlob(t testing.TB, repo string, data []byte) v1.Descriptor {
	t.Helper()
	l := static.NewLayer(data, types.OCILayer)
	rp, err := name.NewRepository(r.Host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(rp, l); err != nil {
		t.Fatal(err)
	}
	d, _ := l.Digest()
	return v1.Descriptor{MediaType: types.OCILayer, Size: int64(len(data)), Digest: d}
}

// PushManifest stores m as is under repoTag ("test/app:v1"), whatever it
// declares (sizes, layer counts, blobs that are not there), and returns
// the full reference. An empty media type is the OCI manifest's.
func (r *Registry) PushManifest(t testing.TB, repoTag string, m v1.Manifest) string {
	t.Helper()
	if m.SchemaVersion == 0 {
		m.SchemaVersion = 2
	}
	if m.MediaType == "" {
		m.MediaType = types.OCIManifestSchema1
	}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(r.Host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPut, r.Server.URL+"/v2/"+tag.RepositoryStr()+"/manifests/"+tag.TagStr(), bytes.NewReader(raw))
	req.Header.Set("Content-Type", string(m.MediaType))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("push manifest %s: %s", repoTag, resp.Status)
	}
	return tag.String()
}

// Endless answers with a body of zero bytes that goes on until the client
// stops reading or max bytes are sent (a bound that keeps a test that
// fails from filling the machine), with no Content-Length. It adds what
// it sent to sent (when not nil).
func Endless(max int64, sent *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		buf := make([]byte, 64<<10)
		for n := int64(0); n < max; n += int64(len(buf)) {
			k, err := w.Write(buf)
			if sent != nil {
				sent.Add(int64(k))
			}
			if err != nil {
				return
			}
		}
	}
}

// Stall answers with status 200, the headers and head (when headers is
// true), then sends nothing more until the client goes away or ten
// minutes pass. With headers false it sends nothing at all.
func Stall(headers bool, head []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if headers {
			w.Header().Set("Content-Length", strconv.Itoa(len(head)+1<<20))
			w.WriteHeader(http.StatusOK)
			w.Write(head)
			w.(http.Flusher).Flush()
		}
		select {
		case <-req.Context().Done():
		case <-time.After(10 * time.Minute):
		}
	}
}

// Redirect answers 307 Temporary Redirect to url.
func Redirect(url string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, url, http.StatusTemporaryRedirect)
	}
}

// Fail answers status with body as it is (not the registry API's JSON
// error form).
func Fail(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		w.Write([]byte(body))
	}
}
