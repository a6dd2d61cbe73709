// Package tenant is the tenants file of airlock serve (--tenants FILE; the
// gateway is to reuse it): API tokens, each a tenant with its own quotas
// and grants. Tokens are never stored: the file keeps the SHA-256 of each
// (a token is 32 random bytes, so a plain hash cannot be reversed), and
// Set.Lookup compares hashes in constant time.
//
// The file is JSON, written by airlock tenant add/rm (Add, Remove: an
// atomic rename under a lock file) and read by Load. A Set holds the
// tenants a server serves; Set.Watch reloads it when the file changes
// (polled) and on demand (the server's SIGHUP), so tokens are added and
// revoked without a restart. A file that fails to load leaves the
// previous tenants in place.
package tenant

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/boundedio"
	"github.com/google/renameio/v2"
)

// Quota bounds what one tenant's boxes may take, over all of them; 0
// means no bound beyond the server's own caps (which apply too).
type Quota struct {
	// Boxes bounds the tenant's boxes that are not stopped.
	Boxes int `json:"boxes,omitempty"`
	// CPUs bounds the vCPUs of the tenant's boxes that are not stopped,
	// summed.
	CPUs int `json:"cpus,omitempty"`
	// MemoryMiB bounds the RAM, in MiB, of the tenant's boxes that are
	// not stopped, summed.
	MemoryMiB int `json:"memory_mib,omitempty"`
	// DiskMiB bounds the disks (disk_size_mib), in MiB, of all the
	// tenant's boxes, stopped ones included (their disks stay), plus
	// what their checkpoints take on disk; a checkpoint is refused once
	// the quota is reached.
	DiskMiB int `json:"disk_mib,omitempty"`
	// Snapshots bounds the tenant's memory snapshots.
	Snapshots int `json:"snapshots,omitempty"`
	// Execs bounds the execs (buffered, streaming, code runs, cells,
	// installs) the tenant runs at once; 0: the server's --max-execs.
	Execs int `json:"execs,omitempty"`
}

// Grants are the server's grants (airlock serve --allow-...) a tenant
// may use. A tenant gets none of them unless its entry says so, and never
// more than the server grants.
type Grants struct {
	// HostVolumes lets the tenant attach host directories under the
	// server's --allow-volume directories.
	HostVolumes bool `json:"host_volumes,omitempty"`
	// NoNamedVolumes refuses the tenant named volumes (which are its own:
	// another tenant's volume of the same name is another volume).
	NoNamedVolumes bool `json:"no_named_volumes,omitempty"`
	// HostPorts lets the tenant's boxes reach the server's
	// --allow-host-port ports.
	HostPorts bool `json:"host_ports,omitempty"`
	// PrivateNet lets the tenant use --allow-private-net.
	PrivateNet bool `json:"private_net,omitempty"`
	// Publish lets the tenant publish ports under --allow-publish.
	Publish bool `json:"publish,omitempty"`
}

// Tenant is one entry of the tenants file.
type Tenant struct {
	// Name identifies the tenant in audit lines, logs and box
	// ownership: 1..32 of a-z, 0-9 and -, starting with a letter or digit.
	Name string `json:"name"`
	// TokenSHA256 is the hex SHA-256 of the tenant's token.
	TokenSHA256 string    `json:"token_sha256"`
	Quota       Quota     `json:"quota,omitzero"`
	Grants      Grants    `json:"grants,omitzero"`
	Created     time.Time `json:"created,omitzero"`

	hash [sha256.Size]byte
}

// File is the tenants file's content.
type File struct {
	Tenants []Tenant `json:"tenants"`
}

// MaxFileBytes bounds the tenants file that Load reads (1 MiB).
const MaxFileBytes = 1 << 20

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// AdminName is the name a server gives its own token (and the unix
// socket) in audit lines and logs; no tenant may take it.
const AdminName = "admin"

// CheckName says what is wrong with a tenant name, or nil.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("tenant name %q: want 1 to 32 of a-z, 0-9 and -, starting with a letter or digit", name)
	}
	if name == AdminName {
		return fmt.Errorf("tenant name %q is the server's own token's", name)
	}
	return nil
}

// Hash returns the hex SHA-256 of token, as the file keeps it.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// NewToken returns a new token: 32 random bytes, hex.
func NewToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Parse reads a tenants file's content and checks it: names valid and
// unique, hashes 64 hex digits and unique, quotas not negative.
func Parse(b []byte) (*File, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	hashes := map[string]bool{}
	for i := range f.Tenants {
		t := &f.Tenants[i]
		if err := CheckName(t.Name); err != nil {
			return nil, err
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tenant %q is listed twice", t.Name)
		}
		seen[t.Name] = true
		h, err := hex.DecodeString(t.TokenSHA256)
		if err != nil || len(h) != sha256.Size {
			return nil, fmt.Errorf("tenant %q: token_sha256 must be 64 hex digits (the SHA-256 of the token)", t.Name)
		}
		if hashes[t.TokenSHA256] {
			return nil, fmt.Errorf("tenant %q: its token is another tenant's", t.Name)
		}
		hashes[t.TokenSHA256] = true
		copy(t.hash[:], h)
		q := t.Quota
		if q.Boxes < 0 || q.CPUs < 0 || q.MemoryMiB < 0 || q.DiskMiB < 0 || q.Snapshots < 0 || q.Execs < 0 {
			return nil, fmt.Errorf("tenant %q: a quota is negative (0 means no limit)", t.Name)
		}
	}
	return &f, nil
}

// Load reads and parses the tenants file at path (at most MaxFileBytes).
func Load(path string) (*File, error) {
	b, err := boundedio.ReadFile(path, MaxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("tenants file: %w", err)
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("tenants file %s: %w", path, err)
	}
	return f, nil
}

// Lookup returns the tenant whose token is token, comparing its hash with
// every entry's in constant time.
func (f *File) Lookup(token string) (*Tenant, bool) {
	if f == nil || token == "" {
		return nil, false
	}
	sum := sha256.Sum256([]byte(token))
	var found *Tenant
	for i := range f.Tenants {
		if subtle.ConstantTimeCompare(sum[:], f.Tenants[i].hash[:]) == 1 {
			found = &f.Tenants[i]
		}
	}
	return found, found != nil
}

// Get returns the tenant named name.
func (f *File) Get(name string) (*Tenant, bool) {
	if f == nil {
		return nil, false
	}
	for i := range f.Tenants {
		if f.Tenants[i].Name == name {
			return &f.Tenants[i], true
		}
	}
	return nil, false
}

// Add adds tenant t (its token given in clear: only its hash is written)
// to the file at path, creating it (mode 0600) if absent. A name already
// there is an error. The file is replaced atomically under path+".lock",
// so concurrent Adds and Removes do not lose each other's entries.
func Add(path string, t Tenant, token string) error {
	if err := CheckName(t.Name); err != nil {
		return err
	}
	t.TokenSHA256 = Hash(token)
	if t.Created.IsZero() {
		t.Created = time.Now().UTC().Truncate(time.Second)
	}
	return update(path, func(f *File) error {
		if _, ok := f.Get(t.Name); ok {
			return fmt.Errorf("tenant %q exists: remove it first (airlock tenant rm %s) to give it a new token", t.Name, t.Name)
		}
		f.Tenants = append(f.Tenants, t)
		return nil
	})
}

// Remove removes the tenant named name from the file at path; its token
// stops working once a server reloads the file. Its boxes stay (the
// operator's to remove: they carry the tenant's label).
func Remove(path, name string) error {
	return update(path, func(f *File) error {
		i := slices.IndexFunc(f.Tenants, func(t Tenant) bool { return t.Name == name })
		if i < 0 {
			return fmt.Errorf("no tenant %q in %s", name, path)
		}
		f.Tenants = slices.Delete(f.Tenants, i, i+1)
		return nil
	})
}

func update(path string, change func(*File) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	f, err := Load(path)
	if errors.Is(err, os.ErrNotExist) {
		f, err = &File{}, nil
	}
	if err != nil {
		return err
	}
	if err := change(f); err != nil {
		return err
	}
	if f.Tenants == nil {
		f.Tenants = []Tenant{}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := renameio.NewPendingFile(path, renameio.WithTempDir(filepath.Dir(path)), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return err
	}
	defer tmp.Cleanup()
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		return err
	}
	return tmp.CloseAtomicallyReplace()
}

// Set is the tenants a server serves now, reloaded from its file. The
// zero value, and a nil *Set, serve no tenant.
type Set struct {
	path string
	cur  atomic.Pointer[File]
	mu   sync.Mutex // one reload at a time
	sig  fileSig
}

// Open loads the tenants file at path into a new Set. A missing file is
// an error: give an existing one (airlock tenant add makes it).
func Open(path string) (*Set, error) {
	s := &Set{path: path}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Path returns the file the set is loaded from.
func (s *Set) Path() string { return s.path }

// File returns the tenants loaded last (nil for a nil Set).
func (s *Set) File() *File {
	if s == nil {
		return nil
	}
	return s.cur.Load()
}

// Lookup returns the tenant whose token is token.
func (s *Set) Lookup(token string) (*Tenant, bool) { return s.File().Lookup(token) }

// Get returns the tenant named name, if it is still in the file.
func (s *Set) Get(name string) (*Tenant, bool) { return s.File().Get(name) }

// Reload reads the file again. On error the tenants loaded before stay.
func (s *Set) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sig, _ := statSig(s.path)
	// A file that fails is not retried until it changes again.
	s.sig = sig
	f, err := Load(s.path)
	if err != nil {
		return err
	}
	s.cur.Store(f)
	return nil
}

// PollInterval is how often Watch looks at the tenants file.
const PollInterval = time.Second

// Watch reloads the set when its file changes (checked every
// PollInterval: its size, modification time and inode, so the rename of
// airlock tenant add counts) or when reload receives, until ctx ends.
// onReload gets each reload's outcome (the error of a file that failed to
// load, whose previous tenants stay).
func (s *Set) Watch(ctx context.Context, reload <-chan struct{}, onReload func(error)) {
	t := time.NewTicker(PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
		case <-t.C:
			sig, err := statSig(s.path)
			s.mu.Lock()
			same := err == nil && sig == s.sig
			s.mu.Unlock()
			if same {
				continue
			}
		}
		err := s.Reload()
		if onReload != nil {
			onReload(err)
		}
	}
}

type fileSig struct {
	size, mtime int64
	ino         uint64
}

func statSig(path string) (fileSig, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileSig{}, err
	}
	sig := fileSig{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		sig.ino = st.Ino
	}
	return sig, nil
}
