package image_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/imagetest"
)

// suggestStore is a store holding one image under the given names.
func suggestStore(t *testing.T, names ...string) *image.Store {
	t.Helper()
	reg := imagetest.NewRegistry(t)
	base, _ := testImage(t)
	ref := reg.Push(t, "test/app:v1", imagetest.Image(t, []string{"sh"}, base))
	s, err := image.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(context.Background(), ref, image.PullOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := s.Tag(ref, n); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestNearestLocalImage(t *testing.T) {
	s := suggestStore(t, "python:slim", "airlock/python-data:latest", "ubuntu:22.04", "ghcr.io/acme/tool:v1")
	for in, want := range map[string]string{
		"pyhton:slim":                  "python:slim", // two letters swapped
		"pythn:slim":                   "python:slim", // one left out
		"docker.io/library/pyton:slim": "python:slim",
		"pyhton":                       "python:slim", // no tag: the repository alone
		"python:slm":                   "python:slim",
		"ubunut:22.04":                 "ubuntu:22.04",
		"airlock/pyhton-data":          "airlock/python-data:latest",
		"ghcr.io/acme/tol:v1":          "ghcr.io/acme/tool:v1",
		"python:slim":                  "", // present: nothing to suggest
		"golang:1.22":                  "", // nothing close
		"node":                         "",
		"pxthxn:slxm":                  "", // three edits
		"Not A Ref!":                   "",
	} {
		if got := s.Nearest(in); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", in, got, want)
		}
	}
}

// A name the registry cannot give, with a close local one: the error says
// "did you mean" first, is short, and keeps the kind (ErrUnreachable).
func TestPullSuggestsNearestLocalImage(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a closed loopback port: the registry is unreachable
	s := suggestStore(t, addr+"/library/python:slim")
	_, err = s.Pull(context.Background(), addr+"/library/pyhton:slim", image.PullOptions{})
	t.Logf("error (%d bytes): %v", len(err.Error()), err)
	var pe *image.PullError
	if !errors.As(err, &pe) || !errors.Is(err, image.ErrUnreachable) {
		t.Fatalf("Pull: %v, want a *PullError wrapping ErrUnreachable", err)
	}
	want := "did you mean " + addr + "/library/python:slim?"
	if pe.Suggestion != addr+"/library/python:slim" || !strings.Contains(err.Error(), want) {
		t.Errorf("Pull: %v (suggestion %q), want it to say %q", err, pe.Suggestion, want)
	}
	if strings.Contains(err.Error(), "Get \"http") || len(err.Error()) > 300 {
		t.Errorf("Pull: %q: want a short error without the HTTP client's chain", err)
	}

	// No close name: the error says where the local images are listed.
	_, err = s.Pull(context.Background(), addr+"/other/thing:v2", image.PullOptions{})
	if !errors.As(err, &pe) || pe.Suggestion != "" || strings.Contains(err.Error(), "did you mean") || !strings.Contains(err.Error(), "airlock images") {
		t.Errorf("Pull of a name with no close local one: %v", err)
	}

	// The registry answers 404: ErrNotFound, with the suggestion.
	reg := imagetest.NewRegistry(t)
	s2 := suggestStore(t, reg.Host+"/test/python:slim")
	_, err = s2.Pull(context.Background(), reg.Host+"/test/pyhton:slim", image.PullOptions{})
	if !errors.Is(err, image.ErrNotFound) || !strings.Contains(err.Error(), "did you mean "+reg.Host+"/test/python:slim?") {
		t.Errorf("Pull of a missing name: %v, want ErrNotFound suggesting %s/test/python:slim", err, reg.Host)
	}
}
