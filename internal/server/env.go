package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
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
			return errors.New(envKeyPrefix + strconv.Quote(k) + envKeySuffix)
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

// The refusal of an env object's key, as EnvList.UnmarshalJSON words it.
// huma passes it on as text at location body; envKeyOf reads the key back
// so that the problem points at /env/KEY.
const (
	envKeyPrefix = "env: variable name "
	envKeySuffix = " is empty or holds '='"
)

// envKeyOf returns the key of an EnvList key refusal (its message).
func envKeyOf(msg string) (string, bool) {
	q, ok := strings.CutPrefix(msg, envKeyPrefix)
	if !ok {
		return "", false
	}
	q, ok = strings.CutSuffix(q, envKeySuffix)
	if !ok {
		return "", false
	}
	k, err := strconv.Unquote(q)
	return k, err == nil
}

// envErrors explains an env (at pointer, huma's location loc) that matched
// neither of its forms, from the value huma validated: each entry that is
// not a string, or the whole when it is neither a list nor an object.
// BoxLite's [key, value] pairs get told what to send instead.
func envErrors(pointer, loc string, v any) []*FieldError {
	const want = `want ["KEY=value", ...] or {"KEY": "value"}`
	var errs []*FieldError
	add := func(tok, ltok, msg string) {
		errs = append(errs, &FieldError{Pointer: pointer + "/" + escapePointer(tok), Location: loc + ltok, Message: msg})
	}
	switch v := v.(type) {
	case []any:
		if len(v) > maxEnv {
			return []*FieldError{{Pointer: pointer, Location: loc, Message: fmt.Sprintf("%d entries: at most %d", len(v), maxEnv)}}
		}
		for i, e := range v {
			if _, ok := e.(string); ok {
				continue
			}
			msg := `want a string "KEY=value"`
			if p, ok := e.([]any); ok && len(p) == 2 {
				msg += ` (a [key, value] pair: send "KEY=value", or env as an object {"KEY": "value"})`
			}
			add(strconv.Itoa(i), fmt.Sprintf("[%d]", i), msg)
			if len(errs) == 16 {
				break
			}
		}
	case map[string]any:
		if len(v) > maxEnv {
			return []*FieldError{{Pointer: pointer, Location: loc, Message: fmt.Sprintf("%d variables: at most %d", len(v), maxEnv)}}
		}
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if _, ok := v[k].(string); !ok {
				add(k, "."+k, "want a string value")
				if len(errs) == 16 {
					break
				}
			}
		}
	}
	if len(errs) == 0 {
		return []*FieldError{{Pointer: pointer, Location: loc, Message: want}}
	}
	return errs
}
