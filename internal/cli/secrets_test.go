package cli

import (
	"strings"
	"testing"
)

func TestSecretFlags(t *testing.T) {
	env := map[string]string{"TOKEN": "sk-value", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	got, err := secretFlags([]string{"TOKEN=api.example.com,*.example.org"}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if s := got["TOKEN"]; s.Value != "sk-value" || strings.Join(s.Hosts, " ") != "api.example.com *.example.org" {
		t.Errorf("got %+v", got)
	}
	for _, bad := range [][]string{{"TOKEN"}, {"=a.example"}, {"TOKEN="}, {"UNSET=a.example"}, {"EMPTY=a.example"}, {"TOKEN=a.example", "TOKEN=b.example"}} {
		_, err := secretFlags(bad, lookup)
		if err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), "sk-value") {
			t.Errorf("%q: the error shows the value: %v", bad, err)
		}
	}
	for flag, want := range map[string]string{
		"UNSET=a.example": "$UNSET is not set in this shell",
		"EMPTY=a.example": "$EMPTY is empty in this shell",
		"1BAD=a.example":  "want an environment variable's name",
		"PATH=a.example":  "a variable the box's programs need",
	} {
		if _, err := secretFlags([]string{flag}, lookup); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", flag, err, want)
		}
	}
	if got, err := secretFlags(nil, lookup); got != nil || err != nil {
		t.Errorf("no flags: %v %v", got, err)
	}
}
