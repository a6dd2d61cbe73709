package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/danielgtaylor/huma/v2"
)

// maxEnv bounds the entries of an EnvList (1024).
const maxEnv = 1024

// EnvList is an environment as a client sends it: a list of "KEY=value"
// entries, or an object {"KEY": "value"} (its entries are taken in key
// order). Either way at most 1024 entries.
type EnvList []string

// UnmarshalJSON takes the list or the object form. An object key that is
// empty or holds '=' is an error (it could not be told from its value).
func (e *EnvList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		var l []string
		if err := json.Unmarshal(b, &l); err != nil {
			return err
		}
		*e = l
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		if k == "" || strings.Contains(k, "=") {
			return fmt.Errorf("env: variable name %q is empty or holds '='", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	l := make([]string, 0, len(keys))
	for _, k := range keys {
		l = append(l, k+"="+m[k])
	}
	*e = l
	return nil
}

// Schema implements huma.SchemaProvider: the list or the object. The
// top-level maxItems is the bound the SDKs read (it applies to the list).
func (EnvList) Schema(huma.Registry) *huma.Schema {
	max := maxEnv
	return &huma.Schema{
		MaxItems: &max,
		OneOf: []*huma.Schema{
			{Type: huma.TypeArray, Items: &huma.Schema{Type: huma.TypeString}, MaxItems: &max,
				Description: `"KEY=value" entries.`},
			{Type: huma.TypeObject, AdditionalProperties: &huma.Schema{Type: huma.TypeString}, MaxProperties: &max,
				Description: "KEY: value pairs."},
		},
	}
}
