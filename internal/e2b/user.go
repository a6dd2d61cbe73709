package e2b

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// defaultUser is E2B's default user: envd runs commands and file calls as
// it when the SDK names none.
const defaultUser = "user"

// userInfo is a user of the box as the data plane acts for it.
type userInfo struct {
	Name     string
	UID, GID int
	Home     string
}

// userName is what a user name may be (E2B's are "root" and "user"; any
// account of the image is taken).
var userName = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// userSetup makes E2B's user in a box whose image lacks it (uid 1000 where
// free, home /home/user), then prints the user's uid, gid and home. It is
// idempotent.
const userSetup = `set -e
u="$1"
if ! id -u "$u" >/dev/null 2>&1; then
  if [ "$u" != user ]; then echo "no user $u in the sandbox" >&2; exit 3; fi
  if command -v useradd >/dev/null 2>&1; then
    useradd -m -s /bin/bash -u 1000 user 2>/dev/null || useradd -m user
  else
    grep -q '^user:' /etc/group || echo 'user:x:1000:' >>/etc/group
    echo 'user:x:1000:1000::/home/user:/bin/sh' >>/etc/passwd
  fi
fi
h=$(awk -F: -v u="$u" '$1==u {print $6}' /etc/passwd 2>/dev/null || true)
[ -n "$h" ] || { [ "$u" = root ] && h=/root || h=/home/$u; }
mkdir -p "$h"
[ "$u" = root ] || chown "$(id -u "$u"):$(id -g "$u")" "$h"
echo "$(id -u "$u") $(id -g "$u") $h"
`

// user returns user name of the box, making E2B's default user when the
// image lacks it.
func (sb *sandbox) user(ctx context.Context, name string) (userInfo, error) {
	if name == "" {
		name = defaultUser
	}
	if !userName.MatchString(name) {
		return userInfo{}, badRequest("user %q: want a user name such as root or user", name)
	}
	sb.userOnce.Lock()
	defer sb.userOnce.Unlock()
	if u, ok := sb.users[name]; ok {
		return u, nil
	}
	if f := sb.s.cfg.UserSetup; f != nil {
		uid, gid, home, err := f(ctx, sb.box, name)
		if err != nil {
			return userInfo{}, err
		}
		u := userInfo{Name: name, UID: uid, GID: gid, Home: home}
		sb.users[name] = u
		return u, nil
	}
	res, err := sb.box.Exec(ctx, "/bin/sh", []string{"-c", userSetup, "sh", name}, airlockRoot())
	if err != nil {
		return userInfo{}, fmt.Errorf("set up user %s: %w", name, err)
	}
	if res.ExitCode != 0 {
		return userInfo{}, badRequest("user %s: %s", name, strings.TrimSpace(string(res.Stderr)))
	}
	f := strings.Fields(string(res.Stdout))
	if len(f) != 3 {
		return userInfo{}, fmt.Errorf("set up user %s: unexpected answer %q", name, res.Stdout)
	}
	uid, err1 := strconv.Atoi(f[0])
	gid, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || !path.IsAbs(f[2]) {
		return userInfo{}, fmt.Errorf("set up user %s: unexpected answer %q", name, res.Stdout)
	}
	u := userInfo{Name: name, UID: uid, GID: gid, Home: path.Clean(f[2])}
	sb.users[name] = u
	return u, nil
}

// userOf is the user a data-plane request acts for: the user of its
// Authorization: Basic header (E2B's form: "name:" in base64), else the
// username query parameter (the /files calls), else the default user.
func userOf(r *http.Request) string {
	if a, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic "); ok {
		if b, err := base64.StdEncoding.DecodeString(a); err == nil {
			name, _, _ := strings.Cut(string(b), ":")
			return name
		}
	}
	if u := r.URL.Query().Get("username"); u != "" {
		return u
	}
	return defaultUser
}

// resolve makes p absolute against the user's home, as envd does.
func (u userInfo) resolve(p string) string {
	if p == "" {
		return u.Home
	}
	if strings.HasPrefix(p, "~/") || p == "~" {
		p = u.Home + strings.TrimPrefix(p, "~")
	}
	if !path.IsAbs(p) {
		p = path.Join(u.Home, p)
	}
	return path.Clean(p)
}
