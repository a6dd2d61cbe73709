package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestSecretsRefusedWithoutEcho: a create whose secrets are malformed is
// refused (400) before any box is made, and the response never
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
		raw, _ := json.Marshal(BoxSpec{Image: vmtest.DefaultImage, Secrets: ss})
		resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%s: status %d: %s", what, resp.StatusCode, body)
		}
		if bytes.Contains(body, []byte("sk-do-not-echo")) {
			t.Errorf("%s: the response shows the value: %s", what, body)
		}
	}
}

// TestSetSecret: PUT /v1/boxes/{id}/secrets/{name} rotates a secret the
// box was created with (204); an unknown secret or a bad value is a 400
// and an unknown box a 404, none of them showing the value.
func TestSetSecret(t *testing.T) {
	vmtest.Require(t)
	rt, err := airlock.Open(airlock.Options{Home: t.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ts := httptest.NewServer(New(Config{Runtime: rt}).Handler(false))
	defer ts.Close()
	raw, _ := json.Marshal(BoxSpec{Image: vmtest.DefaultImage, Secrets: map[string]SecretSpec{"TOKEN": {Value: "sk-first-value", Hosts: []string{"api.example.com"}}}})
	resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var box Box
	json.NewDecoder(resp.Body).Decode(&box)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		t.Fatalf("create: %s", resp.Status)
	}
	defer rt.Remove(context.Background(), box.ID, true)
	put := func(path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, ts.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := put("/v1/boxes/"+box.ID+"/secrets/TOKEN", `{"value":"sk-rotated-value"}`); code != http.StatusNoContent {
		t.Errorf("rotate: %d %s", code, body)
	}
	for what, tc := range map[string]struct {
		path, body string
		code       int
	}{
		"unknown secret": {"/v1/boxes/" + box.ID + "/secrets/OTHER", `{"value":"sk-never-echo-1"}`, http.StatusBadRequest},
		"control char":   {"/v1/boxes/" + box.ID + "/secrets/TOKEN", `{"value":"sk-never-echo-2\r\nX: y"}`, http.StatusBadRequest},
		"empty":          {"/v1/boxes/" + box.ID + "/secrets/TOKEN", `{"value":""}`, http.StatusBadRequest},
		"unknown box":    {"/v1/boxes/nosuchbox/secrets/TOKEN", `{"value":"sk-never-echo-3"}`, http.StatusNotFound},
	} {
		code, body := put(tc.path, tc.body)
		if code != tc.code {
			t.Errorf("%s: %d %s, want %d", what, code, body, tc.code)
		}
		if strings.Contains(body, "sk-never-echo") {
			t.Errorf("%s: the response shows the value: %s", what, body)
		}
	}
	// The box's inspect shows the secret's name and hosts, not a value.
	resp, err = http.Get(ts.URL + "/v1/boxes/" + box.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"TOKEN"`) || strings.Contains(string(b), "sk-") {
		t.Errorf("box after rotation: %s", b)
	}
}

// TestValidationErrorsDoNotEchoValues: a request refused by the schema
// (400) says where and why, never the value sent (it may be a secret's).
func TestValidationErrorsDoNotEchoValues(t *testing.T) {
	ts := httptest.NewServer(New(Config{Runtime: openRuntime(t)}).Handler(false))
	defer ts.Close()
	const v = "sk-schema-never-echo"
	for what, body := range map[string]string{
		"too long":       `{"value":"` + v + strings.Repeat("a", 9000) + `"}`,
		"extra property": `{"value":"` + v + `","hosts":["a.example"]}`,
	} {
		req, _ := http.NewRequest(http.MethodPut, ts.URL+"/v1/boxes/x/secrets/TOKEN", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), `"pointer"`) || strings.Contains(string(b), v) {
			t.Errorf("%s: %d %s", what, resp.StatusCode, b)
		}
	}
	for what, spec := range map[string]string{
		"no hosts":     `{"image":"python:slim","secrets":{"X":{"value":"` + v + `"}}}`,
		"number value": `{"image":"python:slim","secrets":{"X":{"value":1,"hosts":["a.example"],"extra":"` + v + `"}}}`,
	} {
		resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", strings.NewReader(spec))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || strings.Contains(string(b), v) {
			t.Errorf("create, %s: %d %s", what, resp.StatusCode, b)
		}
	}
}
