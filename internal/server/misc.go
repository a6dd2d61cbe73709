package server

import (
	"context"
	"net/http"
	"runtime"
	"time"

	"github.com/danielgtaylor/huma/v2"
)

// Image is a locally stored image.
type Image struct {
	Ref     string    `json:"ref"`
	Digest  string    `json:"digest"`
	Size    int64     `json:"size" doc:"Bytes of stored blobs."`
	Created time.Time `json:"created,omitzero"`
	Source  string    `json:"source,omitempty"`
}

// ImageList is the body of GET /v1/images.
type ImageList struct {
	Images []Image `json:"images"`
}

// Health is the body of GET /v1/health.
type Health struct {
	Status string `json:"status" enum:"ok"`
}

// VersionInfo is the body of GET /v1/version.
type VersionInfo struct {
	Version    string `json:"version" doc:"airlock build version."`
	APIVersion string `json:"api_version"`
	Go         string `json:"go"`
}

func (s *Server) registerMisc() {
	huma.Register(s.api, huma.Operation{
		OperationID: "health", Method: http.MethodGet, Path: "/v1/health", Tags: []string{"server"},
		Summary: "Health check",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body Health }, error) {
		return &struct{ Body Health }{Health{Status: "ok"}}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "version", Method: http.MethodGet, Path: "/v1/version", Tags: []string{"server"},
		Summary: "Server version",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body VersionInfo }, error) {
		return &struct{ Body VersionInfo }{VersionInfo{Version: Version(), APIVersion: APIVersion, Go: runtime.Version()}}, nil
	})

	huma.Register(s.api, huma.Operation{
		OperationID: "list-images", Method: http.MethodGet, Path: "/v1/images", Tags: []string{"images"},
		Summary: "List local images",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body ImageList }, error) {
		imgs, err := s.rt.Images().List()
		if err != nil {
			return nil, problem(err)
		}
		out := &struct{ Body ImageList }{}
		out.Body.Images = make([]Image, 0, len(imgs))
		for _, im := range imgs {
			out.Body.Images = append(out.Body.Images, Image{Ref: im.Ref, Digest: im.Digest, Size: im.Size, Created: im.Created, Source: im.Source})
		}
		return out, nil
	})

	s.api.OpenAPI().AddOperation(wsOperation())
}
