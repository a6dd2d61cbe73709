package airlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlock-run/airlock/internal/store"
)

// Rename gives the box a new name (unique in its home; "" removes the
// name). Errors: ErrNameInUse, ErrBoxNotFound. A running box keeps its
// host name until its next start.
func (b *Box) Rename(ctx context.Context, name string) error {
	if err := b.r.db.Rename(ctx, b.id, name); err != nil {
		switch {
		case errors.Is(err, store.ErrNameInUse):
			return fmt.Errorf("%w: %q (remove that box, or pick another name)", ErrNameInUse, name)
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: %s", ErrBoxNotFound, b.id)
		}
		return err
	}
	rec, err := b.r.db.Get(ctx, b.id)
	if err == nil {
		b.refresh(rec)
	}
	return nil
}
