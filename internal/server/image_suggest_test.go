package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
)

// A misspelt image name (pyhton for python) answers a short RFC 9457
// problem whose detail names the nearest local image, not the registry
// client's error chain (#39 point 7). No VM: the name is refused before
// any box boots.
func TestCreateSuggestsNearestImage(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	base := imagetest.Tar(t, imagetest.Entry{Name: "etc/"}, imagetest.Entry{Name: "etc/a", Body: "a"})
	ref := reg.Push(t, "library/python:slim", imagetest.Image(t, []string{"sh"}, base))
	dir := t.TempDir()
	st, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pull(context.Background(), ref, image.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: dir, Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	// The grant lets the pull from the loopback registry be tried (it
	// answers 404).
	s := New(Config{Runtime: rt, Policy: Policy{AllowPrivateNet: true}})
	ts := httptest.NewServer(s.Handler(false))
	defer ts.Close()
	body, _ := json.Marshal(map[string]any{"image": reg.Host + "/library/pyhton:slim"})
	resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d, want 404", resp.StatusCode)
	}
	p := decodeProblem(t, resp)
	t.Logf("detail (%d bytes): %s", len(p.Detail), p.Detail)
	want := "did you mean " + reg.Host + "/library/python:slim?"
	if p.Code != CodeImageNotFound || !strings.Contains(p.Detail, want) || len(p.Detail) > 300 {
		t.Errorf("problem %+v: want code %s and a short detail saying %q", p, CodeImageNotFound, want)
	}
}
