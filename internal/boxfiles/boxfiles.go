// Package boxfiles moves files between the host and a box over its
// agent's file calls (internal/agent/client): stat, listings, whole-file
// reads and writes, streamed uploads, and `docker cp` copies in and out.
// Everything the box sends is hostile input: listings are bounded, reads
// are capped, and a copy-out archive is read entry by entry and refused
// when an entry leaves the top entry asked for.
//
// It knows nothing of the box's lifecycle: package airlock hands it a Box
// that says how to reach the agent, how to mark a use of the box, and how
// to explain a lost connection. Errors name the box ("box ID: ...").
package boxfiles

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/agent/client"
)

// Call is one running file call (a *client.FileCall).
type Call interface {
	// Write sends data to the agent (blocks while it is behind).
	Write(b []byte) (int, error)
	// CloseWrite sends the end of the data.
	CloseWrite() error
	// Next returns the next message: data (result nil) or a result (its
	// error, if it failed, as err).
	Next() (data []byte, res *agentpb.FileResult, err error)
	// Result waits for a result, failing on data.
	Result() (*agentpb.FileResult, error)
	// Close ends the call (abandons it if it is not over).
	Close() error
}

// Agent starts file calls: a connected agent client (FromClient), or a
// test's fake.
type Agent interface {
	File(ctx context.Context, method string, req *client.FileRequest) (Call, error)
}

// FromClient is the Agent of a connected agent client.
func FromClient(c *client.Client) Agent { return clientAgent{c} }

// Dial is Box.Agent for a box whose connected client dial returns.
func Dial(dial func(ctx context.Context) (*client.Client, error)) func(ctx context.Context) (Agent, error) {
	return func(ctx context.Context) (Agent, error) {
		c, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		return FromClient(c), nil
	}
}

type clientAgent struct{ c *client.Client }

func (a clientAgent) File(ctx context.Context, method string, req *client.FileRequest) (Call, error) {
	f, err := a.c.File(ctx, method, req)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Box is one box as its file calls see it.
type Box struct {
	// ID names the box in errors.
	ID string
	// Agent returns a connected agent; its error is returned as it is.
	Agent func(ctx context.Context) (Agent, error)
	// Use marks a call in flight on the box (it keeps the box from going
	// idle); the func it returns marks its end. Nil: not tracked.
	Use func(ctx context.Context) func()
	// Touch records a use of the box. Nil: not tracked.
	Touch func(ctx context.Context)
	// CallErr explains a failed call that is not a file error (the VM
	// died, the connection was lost). Nil: "box ID: " and the error.
	CallErr func(err error) error
}

// Options tune the copies; the fields are airlock.CopyOptions', whose
// documentation they follow (the two convert into each other).
type Options struct {
	Owner        bool
	UID, GID     int
	KeepOwners   bool
	AllowDevices bool
	AllowSetuid  bool
	MaxBytes     int64
}

func (b *Box) use(ctx context.Context) func() {
	if b.Use == nil {
		return func() {}
	}
	return b.Use(ctx)
}

func (b *Box) touch(ctx context.Context) {
	if b.Touch != nil {
		b.Touch(ctx)
	}
}

// fileErr returns err as it is when the agent reported a file error (an
// *fs.PathError naming the path in the box), else explains the transport
// failure.
func (b *Box) fileErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("box %s: %w", b.ID, err)
	}
	if strings.Contains(err.Error(), "unknown call") {
		return fmt.Errorf("box %s: its agent has no file calls: restart the box (airlock stop, then start): %w", b.ID, err)
	}
	if b.CallErr == nil {
		return fmt.Errorf("box %s: %w", b.ID, err)
	}
	return b.CallErr(err)
}

// simpleFile makes a file call with no data either way and returns its
// result.
func (b *Box) simpleFile(ctx context.Context, method string, req *client.FileRequest) (*agentpb.FileResult, error) {
	defer b.use(ctx)()
	c, err := b.Agent(ctx)
	if err != nil {
		return nil, err
	}
	f, err := c.File(ctx, method, req)
	if err != nil {
		return nil, b.fileErr(err)
	}
	r, err := f.Result()
	f.Close()
	if err != nil {
		return nil, b.fileErr(err)
	}
	return r, nil
}

// Stat returns information on path p in the box, following symlinks
// inside the box.
func (b *Box) Stat(ctx context.Context, p string) (client.FileInfo, error) {
	r, err := b.simpleFile(ctx, "Stat", &client.FileRequest{Path: p, Follow: true})
	if err != nil {
		return client.FileInfo{}, err
	}
	infos := client.Infos(r)
	if len(infos) != 1 {
		return client.FileInfo{}, fmt.Errorf("box %s: stat %s: agent answered %d entries", b.ID, p, len(infos))
	}
	return infos[0], nil
}

// Bounds on what ReadDir accepts from a box (the box chooses what it
// sends): entries, bytes of names and link targets in all, and bytes of
// one name or link target (PATH_MAX; a real name has at most 255).
const (
	MaxDirEntries = 1 << 20
	MaxDirBytes   = 64 << 20
	MaxPathBytes  = 4096
)

// ReadDir lists directory p in the box, sorted by name, entries not
// followed; a listing past the bounds above is an error.
func (b *Box) ReadDir(ctx context.Context, p string) ([]client.FileInfo, error) {
	defer b.use(ctx)()
	c, err := b.Agent(ctx)
	if err != nil {
		return nil, err
	}
	f, err := c.File(ctx, "ReadDir", &client.FileRequest{Path: p})
	if err != nil {
		return nil, b.fileErr(err)
	}
	defer f.Close()
	var out []client.FileInfo
	size := 0
	for {
		r, err := f.Result()
		if err != nil {
			return nil, b.fileErr(err)
		}
		for _, i := range r.Infos {
			if err := CheckDirEntry(i); err != nil {
				return nil, fmt.Errorf("box %s: readdir %s: %w", b.ID, p, err)
			}
			size += len(i.Name) + len(i.Link)
		}
		if size > MaxDirBytes {
			return nil, fmt.Errorf("box %s: readdir %s: more than %d MiB of names: refused", b.ID, p, MaxDirBytes>>20)
		}
		if len(out)+len(r.Infos) > MaxDirEntries {
			return nil, fmt.Errorf("box %s: readdir %s: more than %d entries", b.ID, p, MaxDirEntries)
		}
		out = append(out, client.Infos(r)...)
		if !r.More {
			return out, nil
		}
	}
}

// CheckDirEntry refuses a listing entry no directory can hold: an empty
// name, one with "/" or NUL, "." or "..", or a name or link target past
// MaxPathBytes.
func CheckDirEntry(i *agentpb.FileInfo) error {
	switch {
	case len(i.Name) > MaxPathBytes:
		return fmt.Errorf("the box sent a name of %d bytes (at most %d): refused", len(i.Name), MaxPathBytes)
	case len(i.Link) > MaxPathBytes:
		return fmt.Errorf("the box sent a link target of %d bytes (at most %d): refused", len(i.Link), MaxPathBytes)
	case i.Name == "" || i.Name == "." || i.Name == ".." || strings.ContainsAny(i.Name, "/\x00"):
		return fmt.Errorf("the box sent an entry named %q, which no directory holds: refused", i.Name)
	}
	return nil
}

// MkdirAll creates directory p in the box with its missing parents, with
// permission perm (0: 0755).
func (b *Box) MkdirAll(ctx context.Context, p string, perm fs.FileMode) error {
	_, err := b.simpleFile(ctx, "MkdirAll", &client.FileRequest{Path: p, Mode: uint32(perm.Perm())})
	return err
}

// Remove removes p in the box, a directory with everything in it.
func (b *Box) Remove(ctx context.Context, p string) error {
	_, err := b.simpleFile(ctx, "Remove", &client.FileRequest{Path: p})
	return err
}

// MaxReadFile bounds what ReadFile holds in memory (1 GiB): a box decides
// what it sends.
const MaxReadFile = 1 << 30

// readFileHint bounds the buffer ReadFile sets aside for the size the box
// declares before any data arrived.
const readFileHint = 8 << 20

// ReadFile returns the contents of the regular file p in the box (at most
// MaxReadFile bytes, else an error).
func (b *Box) ReadFile(ctx context.Context, p string) ([]byte, error) {
	defer b.use(ctx)()
	c, err := b.Agent(ctx)
	if err != nil {
		return nil, err
	}
	f, err := c.File(ctx, "ReadFile", &client.FileRequest{Path: p})
	if err != nil {
		return nil, b.fileErr(err)
	}
	defer f.Close()
	first, err := f.Result()
	if err != nil {
		return nil, b.fileErr(err)
	}
	// The size the box declares is a hint, not an allocation: the buffer
	// grows with the data that arrives, from at most readFileHint.
	var buf bytes.Buffer
	if is := client.Infos(first); len(is) == 1 && is[0].Size > 0 {
		buf.Grow(int(min(is[0].Size, readFileHint)))
	}
	for {
		d, r, err := f.Next()
		if err != nil {
			return nil, b.fileErr(err)
		}
		if r != nil {
			return buf.Bytes(), nil
		}
		if buf.Len()+len(d) > MaxReadFile {
			return nil, fmt.Errorf("box %s: read %s: larger than %d bytes: use CopyOut", b.ID, p, MaxReadFile)
		}
		buf.Write(d)
	}
}
