// Package boundedio reads whole files and streams whose size someone else
// controls (a record a box, an archive or a user wrote) with a bound, so
// that an oversized one is an error saying so rather than a read of
// everything into memory.
package boundedio

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrTooLarge is wrapped by the errors of reads past their bound.
var ErrTooLarge = errors.New("too large")

// ReadAll reads r to its end, at most max bytes. More than max bytes is
// an error wrapping ErrTooLarge that names what (e.g. a file's name).
func ReadAll(r io.Reader, max int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: %w: larger than %d bytes", what, ErrTooLarge, max)
	}
	return b, nil
}

// ReadFile reads the file at path, at most max bytes (ReadAll's error
// names path past that). A missing file's error wraps os.ErrNotExist.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadAll(f, max, path)
}
