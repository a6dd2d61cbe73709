package cli_test

import (
	"strings"
	"testing"
)

// TestNodeFlags: a serving certificate without its key, or a port out of
// range, is a usage error before anything is contacted.
func TestNodeFlags(t *testing.T) {
	c := cli{t: t, home: t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "--tls-cert-file", "/nonexistent.crt"}, "--tls-cert-file and --tls-private-key-file go together"},
		{[]string{"node", "--kubelet-port", "70000"}, "--kubelet-port 70000"},
	} {
		_, stderr, code := c.run(tc.args...)
		if code != 125 || !strings.Contains(stderr, tc.want) {
			t.Errorf("airlock %s: exit %d, stderr %q; want exit 125 (usage) saying %q", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
	}
}
