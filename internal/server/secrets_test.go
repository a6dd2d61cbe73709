package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestSecretsRefusedWithoutEcho: a create whose secrets are malformed is
// refused (400 or 422) before any box is made, and the response never
// shows a secret's value.
func TestSecretsRefusedWithoutEcho(t *testing.T) {
	ts := httptest.NewServer(New(Config{Runtime: openRuntime(t)}).Handler(false))
	defer ts.Close()
	const v = "sk-do-not-echo-0123456789"
	many := map[string]SecretSpec{}
	for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefgh" {
		many[string(c)] = SecretSpec{Value: v, Hosts: []string{"a.example"}}
	}
	for what, ss := range map[string]map[string]SecretSpec{
		"bad name":     {"1X": {Value: v, Hosts: []string{"a.example"}}},
		"newline":      {"X": {Value: v + "\r\nX-Evil: 1", Hosts: []string{"a.example"}}},
		"too long":     {"X": {Value: strings.Repeat(v, 400), Hosts: []string{"a.example"}}},
		"IP host":      {"X": {Value: v, Hosts: []string{"203.0.113.9"}}},
		"no hosts":     {"X": {Value: v}},
		"too many":     many,
		"empty value":  {"X": {Hosts: []string{"a.example"}}},
		"port in host": {"X": {Value: v, Hosts: []string{"a.example:8443"}}},
	} {
		raw, _ := json.Marshal(BoxSpec{Image: "python:slim", Secrets: ss})
		resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 && resp.StatusCode != 422 {
			t.Errorf("%s: status %d: %s", what, resp.StatusCode, body)
		}
		if bytes.Contains(body, []byte("sk-do-not-echo")) {
			t.Errorf("%s: the response shows the value: %s", what, body)
		}
	}
}
