package volume

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseMounts(t *testing.T) {
	wd, _ := os.Getwd()
	for spec, want := range map[string]Mount{
		"/srv/data:/data:ro": {Source: "/srv/data", Target: "/data", ReadOnly: true},
		"cache:/c:rw":        {Source: "cache", Target: "/c"},
		"./sub:/s":           {Source: filepath.Join(wd, "sub"), Target: "/s"},
	} {
		if got, err := Parse(spec); err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", spec, got, err, want)
		}
	}
	for _, bad := range []string{"/a", "/a:rel", "/a:/", "/a:/b:rx", "bad name:/x", "a:b:c:d", "../x:/x/.."} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := CheckMounts([]Mount{{Source: "a", Target: "/x"}, {Source: "b", Target: "/x/"}}); err == nil {
		t.Error("two volumes at one target accepted")
	}
	if err := CheckMounts([]Mount{{Source: "a", Target: "/x"}, {Source: "/h", Target: "/y"}}); err != nil {
		t.Error(err)
	}
}
