package image

import (
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// DockerHub is the registry name used in normalized references for images
// without an explicit registry, as Docker does ("python:slim" is
// "docker.io/library/python:slim").
const DockerHub = "docker.io"

// hexPrefix matches a bare (possibly short) sha256 digest: "sha256:ab12...",
// "ab12...". Used for ID-style lookups.
var hexPrefix = regexp.MustCompile(`^(sha256:)?[0-9a-f]{4,64}$`)

// Normalize returns the canonical form of an image reference, following
// Docker's rules: a missing registry means docker.io, a single-component
// Docker Hub repository gets "library/", a missing tag means "latest", and a
// digest reference ("name@sha256:...") keeps the digest and drops any tag.
//
//	python:slim              -> docker.io/library/python:slim
//	ghcr.io/a/b              -> ghcr.io/a/b:latest
//	localhost:5000/x@sha256:.. -> localhost:5000/x@sha256:..
//
// It returns an error for references that are not valid image names.
func Normalize(ref string) (string, error) {
	r, err := parseRef(ref)
	if err != nil {
		return "", err
	}
	return refString(r), nil
}

func parseRef(ref string) (name.Reference, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return nil, fmt.Errorf("empty image reference")
	}
	// "repo:tag@sha256:..." is accepted by Docker; go-containerregistry wants
	// the tag gone.
	if at := strings.Index(ref, "@"); at > 0 {
		repo := ref[:at]
		if slash := strings.LastIndex(repo, "/"); strings.LastIndex(repo, ":") > slash {
			repo = repo[:strings.LastIndex(repo, ":")]
		}
		ref = repo + ref[at:]
	}
	r, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	return r, nil
}

func registryString(reg name.Registry) string {
	s := reg.RegistryStr()
	if s == name.DefaultRegistry || s == DockerHub {
		return DockerHub
	}
	return s
}

func refString(r name.Reference) string {
	base := registryString(r.Context().Registry) + "/" + r.Context().RepositoryStr()
	switch r := r.(type) {
	case name.Digest:
		return base + "@" + r.DigestStr()
	case name.Tag:
		return base + ":" + r.TagStr()
	}
	return r.Name()
}

// repoOf returns the normalized repository ("docker.io/library/python") of a
// normalized reference.
func repoOf(normalized string) string {
	if at := strings.Index(normalized, "@"); at >= 0 {
		return normalized[:at]
	}
	slash := strings.LastIndex(normalized, "/")
	if colon := strings.LastIndex(normalized, ":"); colon > slash {
		return normalized[:colon]
	}
	return normalized
}

// isLoopback reports whether a registry host ("127.0.0.1:5000", "localhost",
// "[::1]:80") is on the loopback interface, where plain HTTP is allowed.
func isLoopback(host string) bool {
	h := host
	if sh, _, err := net.SplitHostPort(host); err == nil {
		h = sh
	}
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
