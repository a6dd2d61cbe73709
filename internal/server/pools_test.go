package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestPoolsEndpointEmpty: GET /v1/pools without pools is an empty list,
// not null. (A server with a pool: TestServePool in internal/cli.)
func TestPoolsEndpointEmpty(t *testing.T) {
	ts := httptest.NewServer(New(Config{Runtime: openRuntime(t)}).Handler(false))
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/v1/pools")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /v1/pools: %d %v", resp.StatusCode, err)
	}
	if string(body["pools"]) != "[]" {
		t.Fatalf("pools without --pool: %s, want []", body["pools"])
	}
}
