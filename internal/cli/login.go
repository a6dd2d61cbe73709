package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/renameio/v2"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlock-run/airlock/internal/boundedio"
	"github.com/airlock-run/airlock/internal/image"
)

func init() {
	extraCommands = append(extraCommands, newLoginCmd, newLogoutCmd)
}

// maxDockerConfig bounds the config.json login reads and rewrites.
const maxDockerConfig = 16 << 20

// helperTimeout bounds one call of a Docker credential helper.
const helperTimeout = 30 * time.Second

func newLoginCmd() *cobra.Command {
	var user, password string
	var passwordStdin, insecure bool
	cmd := &cobra.Command{
		Use:   "login [-u USER] [--password-stdin | -p PASSWORD] REGISTRY",
		Short: "Log in to a registry (checked there, kept in Docker's config.json)",
		Long: `Log in to a registry, as 'docker login' does: the user name and password
are checked against the registry (its /v2/ endpoint, answering its
challenge: basic auth or a token), then kept where airlock's pulls read
them: Docker's config.json in $DOCKER_CONFIG, else ~/.docker (mode 0600,
replaced atomically; its other settings are kept). When config.json names
a credential helper (credsStore, or credHelpers for this registry), the
credentials go to that helper (docker-credential-NAME), as docker does.

Without -p or --password-stdin the password is asked for on the terminal,
without echo. REGISTRY is a host such as ghcr.io or localhost:5000;
docker.io is Docker Hub.`,
		Example: `  airlock login ghcr.io -u alice                   # asks for the password
  echo "$TOKEN" | airlock login -u alice --password-stdin ghcr.io`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := image.RegistryAuthKey(args[0])
			if err != nil {
				return usagef(cmd, "login: %v", err)
			}
			if password != "" && passwordStdin {
				return usagef(cmd, "login: --password and --password-stdin exclude each other")
			}
			if password != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "airlock: warning: --password on the command line can be seen by other users (ps): use --password-stdin")
			}
			in := cmd.InOrStdin()
			tty := isTerminalIn(in)
			if passwordStdin {
				if user == "" {
					return usagef(cmd, "login: --password-stdin needs -u USER")
				}
				b, err := io.ReadAll(io.LimitReader(in, 64<<10))
				if err != nil {
					return fmt.Errorf("login: reading the password from stdin: %w", err)
				}
				password = strings.TrimRight(string(b), "\r\n")
			}
			if user == "" {
				if !tty {
					return usagef(cmd, "login: no user name: give -u USER (stdin is not a terminal to ask on)")
				}
				fmt.Fprint(cmd.ErrOrStderr(), "Username: ")
				line, err := bufio.NewReader(io.LimitReader(in, 4096)).ReadString('\n')
				if err != nil && line == "" {
					return fmt.Errorf("login: reading the user name: %w", err)
				}
				user = strings.TrimSpace(line)
			}
			if password == "" && !passwordStdin {
				if !tty {
					return usagef(cmd, "login: no password: give it on stdin (echo \"$TOKEN\" | airlock login -u %s --password-stdin %s), or run on a terminal to be asked", user, args[0])
				}
				fmt.Fprint(cmd.ErrOrStderr(), "Password: ")
				b, err := term.ReadPassword(int(in.(*os.File).Fd()))
				fmt.Fprintln(cmd.ErrOrStderr())
				if err != nil {
					return fmt.Errorf("login: reading the password: %w", err)
				}
				password = string(b)
			}
			if user == "" || password == "" {
				return usagef(cmd, "login: the user name and the password must not be empty")
			}
			if err := image.CheckLogin(cmd.Context(), key, user, password, insecure); err != nil {
				return fmt.Errorf("login: %w", err)
			}
			where, err := storeLogin(cmd.Context(), key, user, password)
			if err != nil {
				return fmt.Errorf("login: %s accepted the credentials, but they were not kept: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Login Succeeded (credentials kept in %s)\n", where)
			return nil
		},
	}
	cmd.Flags().StringVarP(&user, "username", "u", "", "user name")
	cmd.Flags().StringVarP(&password, "password", "p", "", "password or token (visible to other users: prefer --password-stdin)")
	cmd.Flags().BoolVar(&passwordStdin, "password-stdin", false, "read the password or token from stdin")
	cmd.Flags().BoolVar(&insecure, "insecure", false, "allow plain HTTP and unverified TLS to the registry (loopback registries may always use HTTP)")
	return cmd
}

func newLogoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "logout REGISTRY",
		Short: "Forget the credentials of a registry (Docker's config.json)",
		Long: `Remove the credentials airlock login (or docker login) kept for REGISTRY:
its entry in Docker's config.json ($DOCKER_CONFIG, else ~/.docker), or in
the credential helper config.json names for it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := image.RegistryAuthKey(args[0])
			if err != nil {
				return usagef(cmd, "logout: %v", err)
			}
			removed, where, err := removeLogin(cmd.Context(), key)
			if err != nil {
				return fmt.Errorf("logout: %w", err)
			}
			if !removed {
				fmt.Fprintf(cmd.OutOrStdout(), "Not logged in to %s (nothing in %s)\n", args[0], where)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Removing login credentials for %s (from %s)\n", args[0], where)
			return nil
		},
	}
}

// isTerminalIn reports whether r is a terminal.
func isTerminalIn(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// dockerConfigFile is Docker's config.json: $DOCKER_CONFIG/config.json,
// else ~/.docker/config.json, where the pulls' keychain reads it.
func dockerConfigFile() (string, error) {
	if d := os.Getenv("DOCKER_CONFIG"); d != "" {
		return filepath.Join(d, "config.json"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory for ~/.docker/config.json (set DOCKER_CONFIG): %w", err)
	}
	return filepath.Join(home, ".docker", "config.json"), nil
}

// dockerConfig is config.json as read: every top-level key kept as it was,
// so that a rewrite changes only "auths".
type dockerConfig struct {
	path string
	top  map[string]json.RawMessage
}

func readDockerConfig() (*dockerConfig, error) {
	p, err := dockerConfigFile()
	if err != nil {
		return nil, err
	}
	c := &dockerConfig{path: p, top: map[string]json.RawMessage{}}
	b, err := boundedio.ReadFile(p, maxDockerConfig)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if errors.Is(err, boundedio.ErrTooLarge) {
		return nil, fmt.Errorf("%w: is it Docker's config?", err)
	}
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(b, &c.top); err != nil {
		return nil, fmt.Errorf("%s is not valid JSON (%v): fix or move it; it is left as it is", p, err)
	}
	return c, nil
}

// helper names the credential helper config.json gives key (credHelpers,
// then credsStore), "" for none.
func (c *dockerConfig) helper(key string) string {
	var helpers map[string]string
	if json.Unmarshal(c.top["credHelpers"], &helpers) == nil && helpers[key] != "" {
		return helpers[key]
	}
	var store string
	json.Unmarshal(c.top["credsStore"], &store)
	return store
}

func (c *dockerConfig) auths() (map[string]json.RawMessage, error) {
	auths := map[string]json.RawMessage{}
	if raw, ok := c.top["auths"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &auths); err != nil {
			return nil, fmt.Errorf("%s: \"auths\" is not an object: fix it", c.path)
		}
	}
	return auths, nil
}

// write replaces config.json atomically (a temporary file in its
// directory, synced, renamed over it), mode 0600; a symlink is followed.
func (c *dockerConfig) write() error {
	b, err := json.MarshalIndent(c.top, "", "\t")
	if err != nil {
		return err
	}
	target := c.path
	if t, err := filepath.EvalSymlinks(c.path); err == nil {
		target = t
	}
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := renameio.NewPendingFile(target, renameio.WithTempDir(dir), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(append(b, '\n')); err != nil {
		return err
	}
	return f.CloseAtomicallyReplace()
}

// sameRegistry reports whether a config.json key names key's registry
// (older files keep "https://host/..." forms).
func sameRegistry(entry, key string) bool {
	if entry == key {
		return true
	}
	k, err := image.RegistryAuthKey(entry)
	return err == nil && k == key
}

// storeLogin keeps user and password for key: with the credential helper
// config.json names for it, else in its "auths". It returns where.
func storeLogin(ctx context.Context, key, user, password string) (string, error) {
	c, err := readDockerConfig()
	if err != nil {
		return "", err
	}
	if h := c.helper(key); h != "" {
		in, _ := json.Marshal(map[string]string{"ServerURL": key, "Username": user, "Secret": password})
		if err := runCredHelper(ctx, h, "store", in, c.path); err != nil {
			return "", err
		}
		return fmt.Sprintf("docker-credential-%s, the credential helper %s names", h, c.path), nil
	}
	auths, err := c.auths()
	if err != nil {
		return "", err
	}
	for k := range auths {
		if sameRegistry(k, key) {
			delete(auths, k)
		}
	}
	entry, _ := json.Marshal(map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))})
	auths[key] = entry
	if c.top["auths"], err = json.Marshal(auths); err != nil {
		return "", err
	}
	if err := c.write(); err != nil {
		return "", err
	}
	return c.path, nil
}

// removeLogin forgets key's credentials: in its credential helper, or
// its entries in "auths". It reports whether there were any, and where.
func removeLogin(ctx context.Context, key string) (bool, string, error) {
	c, err := readDockerConfig()
	if err != nil {
		return false, "", err
	}
	auths, err := c.auths()
	if err != nil {
		return false, "", err
	}
	removed := false
	for k := range auths {
		if sameRegistry(k, key) {
			delete(auths, k)
			removed = true
		}
	}
	if removed {
		if c.top["auths"], err = json.Marshal(auths); err != nil {
			return false, "", err
		}
		if err := c.write(); err != nil {
			return false, "", err
		}
	}
	if h := c.helper(key); h != "" {
		if err := runCredHelper(ctx, h, "erase", []byte(key), c.path); err != nil {
			if strings.Contains(err.Error(), "credentials not found") {
				return removed, "docker-credential-" + h, nil
			}
			return removed, "", err
		}
		return true, "docker-credential-" + h, nil
	}
	return removed, c.path, nil
}

// runCredHelper runs docker-credential-NAME VERB with in on its stdin (the
// credential helper protocol), for at most helperTimeout.
func runCredHelper(ctx context.Context, name, verb string, in []byte, config string) error {
	prog := "docker-credential-" + name
	if _, err := exec.LookPath(prog); err != nil {
		return fmt.Errorf("%s names the credential helper %q, but %s is not on PATH: install it, or remove credsStore/credHelpers from %s to keep credentials in the file",
			config, name, prog, config)
	}
	ctx, cancel := context.WithTimeout(ctx, helperTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, verb)
	cmd.Stdin = bytes.NewReader(in)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s did not finish within %s", prog, verb, helperTimeout)
		}
		return fmt.Errorf("%s %s failed (%v): %s", prog, verb, err, msg)
	}
	return nil
}
