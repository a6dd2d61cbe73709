package airlock

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/airlock-run/airlock/internal/store"
)

// Rename gives the box a new name (unique in its home; "" removes the
// name; see BoxOptions.Name for the characters). Errors: ErrNameInUse,
// ErrBoxNotFound, ErrInvalidArgument. A running box keeps its
// host name until its next start.
func (b *Box) Rename(ctx context.Context, name string) error {
	if err := checkBoxName(name); err != nil {
		return err
	}
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

// MaxNameLen is the longest box name, in bytes.
const MaxNameLen = 128

// boxName is what a box name may be: Docker's container name rule
// ([a-zA-Z0-9][a-zA-Z0-9_.-]*), which keeps names usable in paths,
// templates and shells.
var boxName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// checkBoxName refuses a name that is not "" (none) and breaks boxName
// or MaxNameLen.
func checkBoxName(name string) error {
	if name == "" || len(name) <= MaxNameLen && boxName.MatchString(name) {
		return nil
	}
	return fmt.Errorf("%w: box name %q: want letters, digits and _ . - (not first), at most %d", ErrInvalidArgument, name, MaxNameLen)
}
