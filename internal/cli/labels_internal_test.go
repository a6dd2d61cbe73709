package cli

import (
	"testing"
)

// TestLabelFilter: ls --filter label=KEY=VALUE and label=KEY, all of which
// must match; other filters are refused.
func TestLabelFilter(t *testing.T) {
	match, err := labelFilter([]string{"label=team=a", "label=tier"})
	if err != nil {
		t.Fatal(err)
	}
	for labels, want := range map[*map[string]string]bool{
		{"team": "a", "tier": ""}:      true,
		{"team": "a", "tier": "gold"}:  true,
		{"team": "b", "tier": "gold"}:  false,
		{"team": "a"}:                  false,
		{}:                             false,
		{"team": "a=b", "tier": "x"}:   false,
		{"team": "a", "tier": "x=y=z"}: true,
	} {
		if got := match(*labels); got != want {
			t.Errorf("labels %v: %v, want %v", *labels, got, want)
		}
	}
	if m, _ := labelFilter(nil); !m(nil) {
		t.Error("no filter: a box without labels is not listed")
	}
	for _, bad := range []string{"status=running", "label=", "label==v", "team=a"} {
		if _, err := labelFilter([]string{bad}); err == nil {
			t.Errorf("--filter %q taken", bad)
		}
	}
}
