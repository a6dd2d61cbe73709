package server

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
)

// setSecretInput is PUT /v1/boxes/{id}/secrets/{name}.
type setSecretInput struct {
	ID   string `path:"id" doc:"Box id, unique id prefix, or name." maxLength:"128"`
	Name string `path:"name" doc:"The secret's name (as given in the box's secrets)." maxLength:"128"`
	Body struct {
		Value string `json:"value" minLength:"1" maxLength:"8192" doc:"The new value (1-8192 bytes, no control characters). Never echoed back."`
	}
}

// registerSecrets registers the rotation of a box's secret.
func (s *Server) registerSecrets() {
	huma.Register(s.api, huma.Operation{
		OperationID: "set-secret", Method: http.MethodPut, Path: "/v1/boxes/{id}/secrets/{name}", Tags: []string{"boxes"},
		Summary: "Change a box's secret",
		Description: "Gives the box's secret `name` a new value (rotation): a running box's network helper substitutes it " +
			"from its next request on, and later starts keep it. The placeholder in the box and the secret's hosts stay. " +
			"A secret the box was not created with is a 400 (secrets are given at create).",
		DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *setSecretInput) (*struct{}, error) {
		b, err := s.getBox(ctx, in.ID)
		if err != nil {
			return nil, err
		}
		if err := b.SetSecret(ctx, in.Name, in.Body.Value); err != nil {
			return nil, problem(err)
		}
		s.log.Info("secret changed", "box", b.ID(), "secret", in.Name)
		return nil, nil
	})
}
