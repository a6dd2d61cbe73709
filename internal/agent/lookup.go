//go:build linux

package agent

import (
	"os"
	"path"
	"strconv"
	"strings"
	"sync"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/moby/sys/user"
	"golang.org/x/sys/unix"
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
// "uid:gid") against the box's /etc/passwd and /etc/group. Answers are
// kept while both files stay the same (see userCache).
func execUser(root, spec string) (*user.ExecUser, error) {
	passwd, _ := inRoot(root, "/etc/passwd")
	group, _ := inRoot(root, "/etc/group")
	key := userKey{root: root, spec: spec, passwd: fileStamp(passwd), group: fileStamp(group)}
	if u, ok := users.get(key); ok {
		return u, nil
	}
	def := &user.ExecUser{Uid: 0, Gid: 0, Home: "/"}
	// A numeric uid that /etc/passwd does not list gets the gid of the
	// same number (the default's), not root's group 0.
	if name, _, _ := strings.Cut(spec, ":"); name != "" {
		if n, err := strconv.Atoi(name); err == nil && n > 0 {
			def.Gid = n
		}
	}
	u, err := func() (*user.ExecUser, error) {
		if spec == "" {
			if u, err := user.GetExecUserPath("root", def, passwd, group); err == nil {
				return u, nil
			}
			return user.GetExecUserPath("0:0", def, passwd, group)
		}
		return user.GetExecUserPath(spec, def, passwd, group)
	}()
	if err == nil {
		users.put(key, u)
	}
	return u, err
}

// stamp identifies one version of a file: a write, rename or replacement
// changes the inode, size, or modification or change time (nanoseconds).
// The zero stamp is a file that does not exist.
type stamp struct {
	dev, ino, size   uint64
	mtimeNs, ctimeNs int64
}

func fileStamp(p string) stamp {
	var st unix.Stat_t
	if unix.Stat(p, &st) != nil {
		return stamp{}
	}
	return stamp{uint64(st.Dev), st.Ino, uint64(st.Size), st.Mtim.Nano(), st.Ctim.Nano()}
}

type userKey struct {
	root, spec    string
	passwd, group stamp
}

// userCache keeps execUser's answers: every exec resolves its user, and
// parsing /etc/passwd and /etc/group each time was the largest part of an
// exec's own work in the agent, paid anew by a box restored from a
// snapshot (its translated code is gone under QEMU's TCG). A changed file
// changes the key; at most maxUsers answers are kept.
type userCache struct {
	mu sync.Mutex
	m  map[userKey]user.ExecUser
}

const maxUsers = 64

var users userCache

func (c *userCache) get(k userKey) (*user.ExecUser, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.m[k]
	if !ok {
		return nil, false
	}
	u.Sgids = append([]int(nil), u.Sgids...)
	return &u, true
}

func (c *userCache) put(k userKey, u *user.ExecUser) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxUsers {
		c.m = make(map[userKey]user.ExecUser)
	}
	v := *u
	v.Sgids = append([]int(nil), u.Sgids...)
	c.m[k] = v
}
