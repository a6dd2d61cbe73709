// Package store keeps box records in SQLite (modernc.org/sqlite, pure Go)
// under the airlock home, so every process that opens the same home — the
// library, the CLI run later, a server — sees the same boxes. WAL mode and a
// busy timeout let several processes read and write at once.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	_ "modernc.org/sqlite"
)

// ErrNotFound is returned when no box matches.
var ErrNotFound = errors.New("no such box")

// ErrNameInUse is returned when a box name is taken.
var ErrNameInUse = errors.New("box name already in use")

// Box states.
const (
	StateCreated = "created"
	StateRunning = "running"
	StateStopped = "stopped"
)

// Box is one box record. Config is the caller's serialized configuration.
type Box struct {
	ID          string
	Name        string // "" when unnamed
	Image       string // reference the box was created from
	ImageDigest string
	Config      json.RawMessage
	State       string
	PID         int    // QEMU pid while running
	PIDStart    uint64 // QEMU start time (clock ticks), identifies the pid
	Created     time.Time
	Started     time.Time
}

// DB is the box database.
type DB struct{ db *sql.DB }

// SchemaVersion is the database schema this package writes, kept in
// PRAGMA user_version. Versions:
//
//	0  boxes table, configs in the caller's first format (no user_version)
//	1  configs rewritten by the caller's Upgrade (versioned box records)
const SchemaVersion = 1

// Upgrade rewrites one stored box configuration in the caller's current
// format; Open runs it over every record when it migrates to version 1.
type Upgrade func(config []byte) ([]byte, error)

// Open opens (creating if needed) the database at path and migrates it to
// SchemaVersion, one transaction per step, so that a crash leaves it at a
// version it had. A database newer than this package is refused.
func Open(path string, upgrade Upgrade) (*DB, error) {
	// The database holds box environments (secrets): owner only. SQLite
	// gives its -wal and -shm files the database file's mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open box database %s: %w", path, err)
	}
	err = f.Chmod(0o600)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("open box database %s: %w", path, err)
	}
	for _, side := range []string{"-wal", "-shm"} {
		if err := os.Chmod(path+side, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open box database %s: %w", path, err)
		}
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)")
	if err != nil {
		return nil, err
	}
	if err := migrate(db, upgrade); err != nil {
		db.Close()
		return nil, fmt.Errorf("open box database %s: %w", path, err)
	}
	return &DB{db: db}, nil
}

// migrations[i] takes the schema from version i to i+1.
var migrations = []func(ctx context.Context, tx *sql.Conn, upgrade Upgrade) error{
	0: func(ctx context.Context, c *sql.Conn, upgrade Upgrade) error {
		if _, err := c.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS boxes (
			id TEXT PRIMARY KEY,
			name TEXT UNIQUE,
			image TEXT NOT NULL,
			image_digest TEXT NOT NULL,
			config TEXT NOT NULL,
			state TEXT NOT NULL,
			pid INTEGER NOT NULL DEFAULT 0,
			pid_start INTEGER NOT NULL DEFAULT 0,
			created INTEGER NOT NULL,
			started INTEGER NOT NULL DEFAULT 0
		)`); err != nil {
			return err
		}
		if upgrade == nil {
			return nil
		}
		rows, err := c.QueryContext(ctx, `SELECT id, config FROM boxes`)
		if err != nil {
			return err
		}
		type row struct{ id, cfg string }
		var all []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.id, &r.cfg); err != nil {
				rows.Close()
				return err
			}
			all = append(all, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, r := range all {
			up, err := upgrade([]byte(r.cfg))
			if err != nil {
				return fmt.Errorf("box %s: upgrade its record: %w", r.id, err)
			}
			if _, err := c.ExecContext(ctx, `UPDATE boxes SET config = ? WHERE id = ?`, string(up), r.id); err != nil {
				return err
			}
		}
		return nil
	},
}

func userVersion(ctx context.Context, c *sql.Conn) (int, error) {
	var v int
	err := c.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v)
	return v, err
}

// migrate runs the missing migrations, each in an IMMEDIATE transaction
// (taking the write lock first, so two processes opening an old database
// at once run each step once).
func migrate(db *sql.DB, upgrade Upgrade) error {
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		v, err := userVersion(ctx, c)
		if err != nil {
			return err
		}
		if v > SchemaVersion {
			return fmt.Errorf("schema version %d is newer than this airlock's (%d): upgrade airlock", v, SchemaVersion)
		}
		if v == SchemaVersion {
			return nil
		}
		if _, err := c.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
			return err
		}
		step := func() error {
			if now, err := userVersion(ctx, c); err != nil || now != v {
				return err // another process migrated meanwhile: look again
			}
			if err := migrations[v](ctx, c, upgrade); err != nil {
				return fmt.Errorf("migrate to schema version %d: %w", v+1, err)
			}
			_, err := c.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v+1))
			return err
		}
		if err := step(); err != nil {
			c.ExecContext(ctx, `ROLLBACK`)
			return err
		}
		if _, err := c.ExecContext(ctx, `COMMIT`); err != nil {
			return err
		}
	}
}

// Close closes the database.
func (d *DB) Close() error { return d.db.Close() }

func nullName(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Insert adds a new record.
func (d *DB) Insert(ctx context.Context, b *Box) error {
	_, err := d.db.ExecContext(ctx, `INSERT INTO boxes (id, name, image, image_digest, config, state, created) VALUES (?,?,?,?,?,?,?)`,
		b.ID, nullName(b.Name), b.Image, b.ImageDigest, string(b.Config), b.State, b.Created.UnixNano())
	if err != nil && b.Name != "" && isUnique(err) {
		return fmt.Errorf("%w: %q", ErrNameInUse, b.Name)
	}
	return writeErr(err)
}

// writeErr says what a failed write means where SQLite cannot tell it
// better: a full filesystem.
func writeErr(err error) error {
	if err != nil && strings.Contains(err.Error(), "disk is full") {
		return fmt.Errorf("the filesystem of the box database is full: free some space there (%w)", err)
	}
	return err
}

func isUnique(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

const cols = `id, COALESCE(name,''), image, image_digest, config, state, pid, pid_start, created, started`

func scan(row interface{ Scan(...any) error }) (*Box, error) {
	var b Box
	var cfg string
	var created, started int64
	if err := row.Scan(&b.ID, &b.Name, &b.Image, &b.ImageDigest, &cfg, &b.State, &b.PID, &b.PIDStart, &created, &started); err != nil {
		return nil, err
	}
	b.Config = json.RawMessage(cfg)
	b.Created = time.Unix(0, created)
	if started != 0 {
		b.Started = time.Unix(0, started)
	}
	return &b, nil
}

// Get finds a box by exact id, by name, or by unique id prefix.
func (d *DB) Get(ctx context.Context, ref string) (*Box, error) {
	b, err := scan(d.db.QueryRowContext(ctx, `SELECT `+cols+` FROM boxes WHERE id = ? OR name = ?`, ref, ref))
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	if ref == "" {
		return nil, fmt.Errorf("%w: empty id", ErrNotFound)
	}
	// A prefix compare, not LIKE: "_" or "%" in ref must not match any id.
	rows, err := d.db.QueryContext(ctx, `SELECT `+cols+` FROM boxes WHERE substr(id, 1, length(?1)) = ?1`, ref)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var found []*Box
	for rows.Next() {
		b, err := scan(rows)
		if err != nil {
			return nil, err
		}
		found = append(found, b)
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("%w: %q", ErrNotFound, ref)
	case 1:
		return found[0], nil
	default:
		return nil, fmt.Errorf("box id prefix %q is ambiguous (%d boxes): give more characters", ref, len(found))
	}
}

// List returns all records, oldest first.
func (d *DB) List(ctx context.Context) ([]*Box, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT `+cols+` FROM boxes ORDER BY created`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Box
	for rows.Next() {
		b, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// SetRunning records a started VM.
func (d *DB) SetRunning(ctx context.Context, id string, pid int, pidStart uint64, started time.Time) error {
	_, err := d.db.ExecContext(ctx, `UPDATE boxes SET state = ?, pid = ?, pid_start = ?, started = ? WHERE id = ?`,
		StateRunning, pid, pidStart, started.UnixNano(), id)
	return writeErr(err)
}

// SetStopped records that the VM is gone.
func (d *DB) SetStopped(ctx context.Context, id string) error {
	_, err := d.db.ExecContext(ctx, `UPDATE boxes SET state = ?, pid = 0, pid_start = 0 WHERE id = ?`, StateStopped, id)
	return writeErr(err)
}

// SetStoppedIfPID records that the VM is gone, unless the record has moved
// on to another VM (pid) meanwhile.
func (d *DB) SetStoppedIfPID(ctx context.Context, id string, pid int) error {
	_, err := d.db.ExecContext(ctx, `UPDATE boxes SET state = ?, pid = 0, pid_start = 0 WHERE id = ? AND pid = ?`, StateStopped, id, pid)
	return writeErr(err)
}

// SetConfig replaces a box's stored configuration (JSON).
func (d *DB) SetConfig(ctx context.Context, id string, config []byte) error {
	_, err := d.db.ExecContext(ctx, `UPDATE boxes SET config = ? WHERE id = ?`, string(config), id)
	return err
}

// Delete removes a record.
func (d *DB) Delete(ctx context.Context, id string) error {
	_, err := d.db.ExecContext(ctx, `DELETE FROM boxes WHERE id = ?`, id)
	return writeErr(err)
}

// NameInUse reports whether a box is named name.
func (d *DB) NameInUse(ctx context.Context, name string) (bool, error) {
	var one int
	err := d.db.QueryRowContext(ctx, `SELECT 1 FROM boxes WHERE name = ?`, name).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// ImageInUse reports the ids of boxes created from an image digest.
func (d *DB) ImageInUse(ctx context.Context, digest string) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT id FROM boxes WHERE image_digest = ?`, digest)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
