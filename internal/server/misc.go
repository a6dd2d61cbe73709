package server

import (
	"context"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/sse"

	"github.com/airlock-run/airlock"
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
	// IdleExit is set on a server that exits by itself when idle
	// (airlock serve --idle-exit; the SDKs start theirs so).
	IdleExit float64 `json:"idle_exit_s,omitempty" doc:"Seconds idle after which this server exits by itself (airlock serve --idle-exit, as the SDKs start it); absent when it runs until stopped."`
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
		return &struct{ Body Health }{Health{Status: "ok", IdleExit: s.cfg.IdleExit.Seconds()}}, nil
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
		imgs, err := s.rt.ListImages()
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

	s.registerPull()
	s.api.OpenAPI().AddOperation(wsOperation())
}

// PullRequest is the body of POST /v1/images/pull.
type PullRequest struct {
	Ref string `json:"ref" minLength:"1" maxLength:"512" doc:"Image reference in Docker syntax (python:slim, localhost:5000/x@sha256:...)."`
}

// PullProgress is a progress message of a pull: one layer's bytes so far.
type PullProgress struct {
	Digest string `json:"digest"`
	Done   int64  `json:"done"`
	Total  int64  `json:"total"`
}

// PullDone is the last message of a successful pull.
type PullDone struct {
	Image Image `json:"image"`
}

// PullError is the last message of a failed pull.
type PullError struct {
	Problem *Problem `json:"problem"`
}

func (s *Server) registerPull() {
	sse.Register(s.api, huma.Operation{
		OperationID: "pull-image", Method: http.MethodPost, Path: "/v1/images/pull", Tags: []string{"images"},
		Summary: "Pull an image, with progress (Server-Sent Events)",
		Description: "Streams `progress` messages (per layer, at most ten a second each, and at each layer's end), then " +
			"`done` with the stored image or `error` with a problem. Blobs already stored are not downloaded again.",
	}, map[string]any{"progress": PullProgress{}, "done": PullDone{}, "error": PullError{}},
		func(ctx context.Context, in *struct{ Body PullRequest }, send sse.Sender) {
			var mu sync.Mutex
			last := map[string]time.Time{}
			img, err := s.rt.PullImage(s.pullContext(ctx), in.Body.Ref, airlock.PullEvents{Progress: func(digest string, done, total int64) {
				mu.Lock()
				defer mu.Unlock()
				if done < total && time.Since(last[digest]) < 100*time.Millisecond {
					return
				}
				last[digest] = time.Now()
				send.Data(PullProgress{Digest: digest, Done: done, Total: total})
			}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				p := problem(err).(*Problem)
				send.Data(PullError{Problem: p})
				return
			}
			send.Data(PullDone{Image: Image{Ref: img.Ref, Digest: img.Digest, Size: img.Size, Created: img.Created, Source: img.Source}})
		})
}
