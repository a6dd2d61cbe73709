// Package volume is the store of named volumes: Home/volumes/NAME, each an
// ext4 image (sparse on the host) and a small JSON record of its size and
// creation time. It knows nothing of boxes: which boxes attach a volume,
// and whether it may be removed, is its caller's to say.
package volume

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"
)

// DefaultSizeMiB is the size of a volume created without one.
const DefaultSizeMiB = 1024

// minSizeMiB is the smallest volume Create makes.
const minSizeMiB = 8

// The files of a volume directory.
const (
	imageFile = "volume.ext4"
	metaFile  = "volume.json"
)

var name = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

// ValidName reports whether s is a volume name: 1-64 letters, digits,
// '_', '.' or '-', starting with a letter or digit.
func ValidName(s string) bool { return name.MatchString(s) }

// Info describes a volume.
type Info struct {
	Name    string
	SizeMiB int
	Created time.Time
}

// meta is a volume's stored record (metaFile).
type meta struct {
	SizeMiB int       `json:"size_mib"`
	Created time.Time `json:"created"`
}

// Store is the volumes of one airlock home.
type Store struct {
	// Dir holds one directory per volume (Home/volumes).
	Dir string
}

func (s Store) dir(name string) string { return filepath.Join(s.Dir, name) }

// Image is the path of volume name's ext4 image (what a driver attaches).
func (s Store) Image(name string) string { return filepath.Join(s.dir(name), imageFile) }

// Create makes volume name of sizeMiB (0: DefaultSizeMiB, at least 8): an
// ext4 image made by mkfs.ext4, sparse on the host. An existing volume is
// an error; a failed Create leaves nothing behind.
func (s Store) Create(ctx context.Context, name string, sizeMiB int) (Info, error) {
	if !ValidName(name) {
		return Info{}, fmt.Errorf("volume name %q: want letters, digits, _ . - (up to 64)", name)
	}
	if sizeMiB == 0 {
		sizeMiB = DefaultSizeMiB
	}
	if sizeMiB < minSizeMiB {
		return Info{}, fmt.Errorf("volume %s: size %d MiB: want at least 8", name, sizeMiB)
	}
	dir := s.dir(name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return Info{}, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return Info{}, fmt.Errorf("volume %s already exists", name)
		}
		return Info{}, err
	}
	fail := func(err error) (Info, error) {
		os.RemoveAll(dir)
		return Info{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	img := s.Image(name)
	f, err := os.Create(img)
	if err != nil {
		return fail(err)
	}
	err = f.Truncate(int64(sizeMiB) << 20)
	f.Close()
	if err != nil {
		return fail(err)
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "airlock-vol",
		"-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", img).CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("mkfs.ext4: %v: %s", err, out))
	}
	m := meta{SizeMiB: sizeMiB, Created: time.Now().UTC()}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, metaFile), b, 0o600); err != nil {
		return fail(err)
	}
	return Info{Name: name, SizeMiB: sizeMiB, Created: m.Created}, nil
}

// Ensure creates volume name (of DefaultSizeMiB) unless its image exists.
func (s Store) Ensure(ctx context.Context, name string) error {
	if _, err := os.Stat(s.Image(name)); os.IsNotExist(err) {
		if _, err := s.Create(ctx, name, 0); err != nil {
			return err
		}
	}
	return nil
}

// Info describes volume name; a directory without its record is no
// volume.
func (s Store) Info(name string) (Info, error) {
	b, err := os.ReadFile(filepath.Join(s.dir(name), metaFile))
	if err != nil {
		return Info{}, fmt.Errorf("volume %s: no such volume (airlock volume ls)", name)
	}
	var m meta
	json.Unmarshal(b, &m)
	return Info{Name: name, SizeMiB: m.SizeMiB, Created: m.Created}, nil
}

// List describes the volumes, in directory order; entries that are no
// volume are left out.
func (s Store) List() ([]Info, error) {
	ents, err := os.ReadDir(s.Dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var out []Info
	for _, e := range ents {
		if i, err := s.Info(e.Name()); err == nil {
			out = append(out, i)
		}
	}
	return out, nil
}

// Remove deletes volume name and its data (whether a box attaches it is
// the caller's to check first).
func (s Store) Remove(name string) error { return os.RemoveAll(s.dir(name)) }
