package volume

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"
)

// Mount is a volume attached to a box at Target (the public
// airlock.Volume's fields): Source is an absolute host directory, or else
// the name of a volume of the store.
type Mount struct {
	Source   string
	Target   string
	ReadOnly bool
}

// IsHostDir reports whether m shares a host directory.
func (m Mount) IsHostDir() bool { return filepath.IsAbs(m.Source) }

// Parse parses Docker's -v syntax: SOURCE:TARGET[:ro|:rw], where SOURCE
// is a host directory (absolute, or starting with "." or "~" for one
// relative to the working directory) or a volume name; the result is
// checked (Check).
func Parse(spec string) (Mount, error) {
	parts := strings.Split(spec, ":")
	var m Mount
	switch len(parts) {
	case 2:
	case 3:
		switch parts[2] {
		case "ro":
			m.ReadOnly = true
		case "rw":
		default:
			return m, fmt.Errorf("volume %q: mode %q: want ro or rw", spec, parts[2])
		}
	default:
		return m, fmt.Errorf("volume %q: want SOURCE:TARGET[:ro|rw] (SOURCE a host directory or a volume name)", spec)
	}
	m.Source, m.Target = parts[0], parts[1]
	if strings.HasPrefix(m.Source, ".") || strings.HasPrefix(m.Source, "~") {
		abs, err := filepath.Abs(m.Source)
		if err != nil {
			return m, err
		}
		m.Source = abs
	}
	return m, m.Check()
}

// Check refuses a target that is not an absolute path other than /, and
// a source that is neither an absolute path nor a volume name.
func (m Mount) Check() error {
	if !path.IsAbs(m.Target) || path.Clean(m.Target) == "/" {
		return fmt.Errorf("volume %s: target %q must be an absolute path other than /", m.Source, m.Target)
	}
	if !m.IsHostDir() && !ValidName(m.Source) {
		return fmt.Errorf("volume %q: not an absolute host path, nor a volume name (letters, digits, _ . -)", m.Source)
	}
	return nil
}

// CheckMounts checks each of ms and refuses two at one target.
func CheckMounts(ms []Mount) error {
	seen := map[string]bool{}
	for _, m := range ms {
		if err := m.Check(); err != nil {
			return err
		}
		t := path.Clean(m.Target)
		if seen[t] {
			return fmt.Errorf("two volumes at %s", t)
		}
		seen[t] = true
	}
	return nil
}

// EnsureAll creates the volumes ms name (not host directories) that do
// not exist yet (Ensure).
func (s Store) EnsureAll(ctx context.Context, ms []Mount) error {
	for _, m := range ms {
		if m.IsHostDir() {
			continue
		}
		if err := s.Ensure(ctx, m.Source); err != nil {
			return err
		}
	}
	return nil
}
