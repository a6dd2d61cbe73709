package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// sdkBounds are the numeric bounds of the API's request schemas (minimum,
// maximum, maxItems, maxLength), by schema and property, as the OpenAPI
// document states them.
func sdkBounds(t *testing.T) map[string]map[string]map[string]int64 {
	t.Helper()
	spec, err := OpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]map[string]any `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(spec, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]map[string]int64{}
	for name, s := range doc.Components.Schemas {
		for prop, v := range s.Properties {
			for _, k := range []string{"minimum", "maximum", "maxItems", "maxLength"} {
				f, ok := v[k].(float64)
				if !ok {
					continue
				}
				if out[name] == nil {
					out[name] = map[string]map[string]int64{}
				}
				if out[name][prop] == nil {
					out[name][prop] = map[string]int64{}
				}
				out[name][prop][k] = int64(f)
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// renderBounds writes the bounds as a nested literal: Python dict or
// TypeScript object (the same text but for the header and the export).
func renderBounds(b map[string]map[string]map[string]int64, header, open, close string) []byte {
	var w bytes.Buffer
	w.WriteString(header)
	w.WriteString(open)
	for _, s := range sortedKeys(b) {
		fmt.Fprintf(&w, "    %q: {\n", s)
		for _, p := range sortedKeys(b[s]) {
			fmt.Fprintf(&w, "        %q: {", p)
			for i, k := range sortedKeys(b[s][p]) {
				if i > 0 {
					w.WriteString(", ")
				}
				fmt.Fprintf(&w, "%q: %d", k, b[s][p][k])
			}
			w.WriteString("},\n")
		}
		w.WriteString("    },\n")
	}
	w.WriteString(close)
	return w.Bytes()
}

// TestSDKBoundsCommitted: the SDKs take the API's bounds (the most vCPUs,
// boxes a fork makes, ...) from files generated from the OpenAPI document,
// not from constants copied by hand; the committed files must match it
// (AIRLOCK_UPDATE=1 rewrites them).
func TestSDKBoundsCommitted(t *testing.T) {
	b := sdkBounds(t)
	if b["ForkRequest"]["n"]["maximum"] == 0 || b["BoxSpec"]["cpus"]["maximum"] == 0 {
		t.Fatalf("the OpenAPI document has no bounds for fork n or cpus: %v", b)
	}
	const regen = "AIRLOCK_UPDATE=1 go test ./internal/server -run TestSDKBoundsCommitted"
	const gen = "Generated from api/openapi.json by internal/server's TestSDKBoundsCommitted"
	files := map[string][]byte{
		filepath.Join("..", "..", "sdk", "python", "src", "airlock", "_bounds.py"): renderBounds(b,
			"\"\"\"Bounds of the airlock API's requests, by schema and field.\n\n"+gen+"\n("+regen+"). Do not edit.\n\"\"\"\n\n",
			"BOUNDS: dict[str, dict[str, dict[str, int]]] = {\n", "}\n"),
		filepath.Join("..", "..", "sdk", "typescript", "src", "bounds.ts"): renderBounds(b,
			"// Bounds of the airlock API's requests, by schema and field.\n//\n// "+gen+"\n// ("+regen+"). Do not edit.\n\n",
			"export const BOUNDS: Record<string, Record<string, Record<string, number>>> = {\n", "};\n"),
	}
	for path, want := range files {
		if os.Getenv("AIRLOCK_UPDATE") == "1" {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		have, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(have, want) {
			t.Errorf("%s is stale: the API's bounds changed; regenerate with AIRLOCK_UPDATE=1 go test ./internal/server -run TestSDKBoundsCommitted", path)
		}
	}
}
