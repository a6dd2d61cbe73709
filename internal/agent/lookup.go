//go:build linux

package agent

import (
	"os"
	"path"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/moby/sys/user"
)

// DefaultPath is the PATH used when an exec's environment has none; it is
// the one Docker and the OCI images use.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func getenv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// inRoot maps a path inside the box to a host path under root, resolving
// symlinks as the box would see them (never escaping root).
func inRoot(root, p string) (string, error) {
	if root == "" || root == "/" {
		return p, nil
	}
	return securejoin.SecureJoin(root, p)
}

// lookPath finds file in PATH inside root, like execvp. It returns the path
// as seen inside the box, or "" when there is no such executable.
func lookPath(root, file, wd string, env []string) string {
	if strings.Contains(file, "/") {
		return file
	}
	p, ok := getenv(env, "PATH")
	if !ok {
		p = DefaultPath
	}
	for _, dir := range strings.Split(p, ":") {
		if dir == "" {
			dir = "."
		}
		cand := path.Join(dir, file)
		abs := cand
		if !path.IsAbs(abs) {
			abs = path.Join(wd, abs)
		}
		hp, err := inRoot(root, abs)
		if err != nil {
			continue
		}
		st, err := os.Stat(hp)
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			continue
		}
		if !path.IsAbs(cand) {
			return "./" + cand
		}
		return cand
	}
	return ""
}

// execUser resolves a user spec ("", "name", "uid", "name:group",
// "uid:gid") against the box's /etc/passwd and /etc/group.
func execUser(root, spec string) (*user.ExecUser, error) {
	passwd, _ := inRoot(root, "/etc/passwd")
	group, _ := inRoot(root, "/etc/group")
	def := &user.ExecUser{Uid: 0, Gid: 0, Home: "/"}
	if spec == "" {
		spec = "0:0"
		if u, err := user.GetExecUserPath("root", def, passwd, group); err == nil {
			return u, nil
		}
	}
	return user.GetExecUserPath(spec, def, passwd, group)
}
