package defaults

import (
	"slices"
	"testing"
)

// TestHostileGuestChildEnv: the environment of the processes a guest may
// take over (QEMU, the network helper, virtiofsd) holds no secret of the
// caller's, only the allowlisted variables.
func TestHostileGuestChildEnv(t *testing.T) {
	environ := []string{
		"PATH=/usr/bin:/bin", "AIRLOCK_TOKEN=x", "OPENAI_API_KEY=y", "HOME=/root",
		"LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC", "AIRLOCK_DNS_UPSTREAM=1.1.1.1:53",
		"AWS_SECRET_ACCESS_KEY=z", "GODEBUG=x=1", "=odd", "noequals",
	}
	got := FilterEnv(environ)
	want := []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC"}
	if !slices.Equal(got, want) {
		t.Errorf("FilterEnv = %q, want %q", got, want)
	}
	got = FilterEnv(environ, DNSUpstreamEnv, "GO*")
	want = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC", "AIRLOCK_DNS_UPSTREAM=1.1.1.1:53", "GODEBUG=x=1"}
	if !slices.Equal(got, want) {
		t.Errorf("FilterEnv(keep) = %q, want %q", got, want)
	}
	t.Setenv("AIRLOCK_TOKEN", "secret-token")
	t.Setenv("OPENAI_API_KEY", "sk-secret")
	for _, e := range ChildEnv(GoRuntimeEnv...) {
		if e == "AIRLOCK_TOKEN=secret-token" || e == "OPENAI_API_KEY=sk-secret" {
			t.Errorf("ChildEnv holds %q", e)
		}
	}
}
