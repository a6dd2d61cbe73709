package store

import (
	"context"
	"fmt"
)

// Rename gives the box id the name name ("" removes its name). It returns
// ErrNameInUse when another box has it, ErrNotFound when there is no box id.
func (d *DB) Rename(ctx context.Context, id, name string) error {
	res, err := d.db.ExecContext(ctx, `UPDATE boxes SET name = ? WHERE id = ?`, nullName(name), id)
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("%w: %q", ErrNameInUse, name)
		}
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return nil
}
