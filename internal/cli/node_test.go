package cli_test

import (
	"strings"
	"testing"
)

// TestNodeFlags: a serving certificate without its key, an unknown
// --serving-cert or one at odds with --tls-cert-file, or a port out of
// range, is a usage error before anything is contacted.
func TestNodeFlags(t *testing.T) {
	c := cli{t: t, home: t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "--tls-cert-file", "/nonexistent.crt"}, "--tls-cert-file and --tls-private-key-file go together"},
		{[]string{"node", "--kubelet-port", "70000"}, "--kubelet-port 70000"},
		{[]string{"node", "--serving-cert", "acme"}, "--serving-cert \"acme\": want csr, file, self or off"},
		{[]string{"node", "--serving-cert", "file"}, "--serving-cert file needs --tls-cert-file"},
		{[]string{"node", "--serving-cert", "csr", "--tls-cert-file", "a.crt", "--tls-private-key-file", "a.key"}, "--serving-cert csr does not use --tls-cert-file"},
	} {
		_, stderr, code := c.run(tc.args...)
		if code != 125 || !strings.Contains(stderr, tc.want) {
			t.Errorf("airlock %s: exit %d, stderr %q; want exit 125 (usage) saying %q", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
	}
}
