package boxfiles

import "testing"

// The rules of `docker cp` (docs.docker.com/reference/cli/docker/container/cp).
func TestCpTarget(t *testing.T) {
	cases := []struct {
		src            string
		srcDir         bool
		dst            string
		exists, dstDir bool
		want           target
		wantErr        bool
	}{
		{"f", false, "/new", false, false, target{"/", "new"}, false},
		{"f", false, "/new/", false, false, target{}, true},
		{"f", false, "/file", true, false, target{"/", "file"}, false},
		{"f", false, "/dir", true, true, target{"/dir", ""}, false},
		{"f", false, "/dir/", true, true, target{"/dir", ""}, false},
		{"f", false, "/file/", true, false, target{}, true},
		{"f/", false, "/dir", true, true, target{}, true},
		{"d", true, "/new", false, false, target{"/", "new"}, false},
		{"d", true, "/a/new/", false, false, target{"/a", "new"}, false},
		{"d", true, "/file", true, false, target{}, true},
		{"d", true, "/dir", true, true, target{"/dir", ""}, false},
		{"d/.", true, "/dir", true, true, target{"/dir", "."}, false},
		{"d/.", true, "/new", false, false, target{"/", "new"}, false},
		{"d/", true, "/dir", true, true, target{"/dir", ""}, false},
		{"f", false, "rel/x", false, false, target{"rel", "x"}, false},
	}
	for _, c := range cases {
		got, err := cpTarget(c.src, c.srcDir, c.dst, c.exists, c.dstDir)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("cp %s (dir %v) -> %s (exists %v dir %v): got %+v %v, want %+v err %v", c.src, c.srcDir, c.dst, c.exists, c.dstDir, got, err, c.want, c.wantErr)
		}
	}
}
