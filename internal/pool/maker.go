package pool

import (
	"context"
	"errors"
	"fmt"
)

// Maker is a Factory over its caller's functions: a pool's boxes are
// booted (New, then Prepare in each) or restored from the template
// (FromTemplate), and the template is a booted and prepared box,
// snapshotted (Snapshot) and removed.
type Maker[B Box] struct {
	// CanSnapshot says why no template can be made (the VM driver cannot
	// snapshot), nil when one can.
	CanSnapshot func() error
	// New boots a box of the pool.
	New func(ctx context.Context) (B, error)
	// Prepare, when set, runs in each booted box, the template's
	// included; a box it fails in is removed.
	Prepare func(ctx context.Context, b B) error
	// TemplateName names a new template (TemplateName); Snapshot takes
	// it of box b. A Snapshot error wrapping NotSupported means no
	// template can be made.
	TemplateName func() string
	Snapshot     func(ctx context.Context, b B, name string) error
	NotSupported error
	// FromTemplate makes a running box from template.
	FromTemplate func(ctx context.Context, template string) (B, error)
	// WarmUp, when set, is Warm's work.
	WarmUp func(ctx context.Context, b B) (any, error)
	// Delete removes a box, killing its machine; DeleteTemplate removes a
	// template.
	Delete         func(ctx context.Context, b B) error
	DeleteTemplate func(ctx context.Context, name string) error
}

// Template boots a box of the pool, prepares it, snapshots it and
// removes it; an error wrapping ErrNoTemplate where no snapshot can be
// taken.
func (m *Maker[B]) Template(ctx context.Context) (string, error) {
	if err := m.CanSnapshot(); err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoTemplate, err)
	}
	b, err := m.Boot(ctx)
	if err != nil {
		return "", fmt.Errorf("template box: %w", err)
	}
	defer m.Delete(context.WithoutCancel(ctx), b)
	name := m.TemplateName()
	if err := m.Snapshot(ctx, b, name); err != nil {
		if errors.Is(err, m.NotSupported) {
			return "", fmt.Errorf("%w: %w", ErrNoTemplate, err)
		}
		return "", fmt.Errorf("template snapshot: %w", err)
	}
	return name, nil
}

// Restore starts a pool box from the template.
func (m *Maker[B]) Restore(ctx context.Context, template string) (B, error) {
	return m.FromTemplate(ctx, template)
}

// Boot boots a pool box and prepares it.
func (m *Maker[B]) Boot(ctx context.Context) (B, error) {
	b, err := m.New(ctx)
	if err != nil {
		return b, err
	}
	if m.Prepare != nil {
		if err := m.Prepare(ctx, b); err != nil {
			m.Delete(context.WithoutCancel(ctx), b)
			var none B
			return none, fmt.Errorf("prepare pool box: %w", err)
		}
	}
	return b, nil
}

// Warm runs WarmUp, if set.
func (m *Maker[B]) Warm(ctx context.Context, b B) (any, error) {
	if m.WarmUp == nil {
		return nil, nil
	}
	return m.WarmUp(ctx, b)
}

// Remove removes a pool box, killing its machine.
func (m *Maker[B]) Remove(ctx context.Context, b B) error { return m.Delete(ctx, b) }

// RemoveTemplate removes a template snapshot.
func (m *Maker[B]) RemoveTemplate(ctx context.Context, name string) error {
	return m.DeleteTemplate(ctx, name)
}
