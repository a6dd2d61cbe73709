package airlock

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-run/airlock/internal/confine"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/image/unpack"
	"github.com/airlock-run/airlock/internal/rootfs"
)

// CommitOptions tune Box.Commit. The zero value is ready to use.
type CommitOptions struct {
	// Comment goes into the new layer's history entry.
	Comment string
	// Limits bound what the layer may hold (entries, bytes, one file);
	// zero fields default from the free space of the airlock home.
	// Past one, Commit fails with an error wrapping ErrLimit.
	Limits unpack.Limits
}

// CommitResult describes the image Box.Commit made.
type CommitResult struct {
	Image ImageInfo
	// Entries, Whiteouts and Bytes describe the new layer (tar entries,
	// deletions and opaque directories among them, file content bytes).
	Entries, Whiteouts int
	Bytes              int64
	// Skipped lists what the layer leaves out (device nodes, fifos,
	// sockets).
	Skipped []string
	// Paused is how long a running box was paused to copy its disk.
	Paused time.Duration
}

// ErrLimit is wrapped by errors for content past a size or count limit
// (CommitOptions.Limits, an archive given to ImportBox).
var ErrLimit = unpack.ErrLimit

// Commit turns the box's writable layer into a new image ref ("name",
// "name:tag"): the box's image with one more OCI layer holding what the
// box added, changed and deleted (deletions as whiteouts), stored in the
// image store, so that Create with Image ref (`airlock run ref`) starts
// from it and ListImages shows it. The new image keeps the base image's
// configuration (environment, entrypoint, user). Volumes are not part of
// it. The box may be stopped or running: a running box first flushes its
// filesystems (it runs `sync`, which the image must have), then is paused
// while its disk is copied (milliseconds) and runs on. Of extended
// attributes, user.* and security.* (file capabilities) are carried.
// The e2fsprogs that read the disk run confined (see diskTool).
// Errors: ErrImageNotFound when the box's
// image is gone, ErrLimit, ErrNotSupported for a driver that cannot
// pause a running box.
func (b *Box) Commit(ctx context.Context, ref string, opts CommitOptions) (CommitResult, error) {
	var res CommitResult
	if _, err := image.Normalize(ref); err != nil {
		return res, fmt.Errorf("%w: image name %q: %w", ErrInvalidArgument, ref, err)
	}
	rec, err := b.load(ctx)
	if err != nil {
		return res, err
	}
	base, err := b.image(rec)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrImageNotFound, err)
	}
	scratch := filepath.Join(b.r.opts.Home, "tmp")
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return res, err
	}
	disk, paused, cleanup, err := b.stableDisk(ctx, scratch)
	if err != nil {
		return res, err
	}
	defer cleanup()
	res.Paused = paused
	tool, err := b.r.diskTool()
	if err != nil {
		return res, fmt.Errorf("commit box %s: %w", b.id, err)
	}
	createdBy := "airlock commit " + b.id
	if rec.Name != "" {
		createdBy += " (" + rec.Name + ")"
	}
	img, st, err := rootfs.CommitLayer(ctx, b.r.images, base, ref, disk, scratch, opts.Limits, tool, image.CommitOptions{
		Comment: opts.Comment, CreatedBy: createdBy,
		Source: fmt.Sprintf("committed from box %s (image %s)", b.id, base.Ref)})
	if err != nil {
		return res, fmt.Errorf("commit box %s: %w", b.id, err)
	}
	res.Image = imageInfo(img)
	res.Entries, res.Whiteouts, res.Bytes, res.Skipped = st.Entries, st.Whiteouts, st.Bytes, st.Skipped
	return res, nil
}

// stableDisk returns a path to the box's writable layer that nothing
// writes while the caller reads it (lifecycle.Box.StableDisk): the disk
// itself for a stopped box, else a copy made while the box was paused,
// after a sync in the guest.
func (b *Box) stableDisk(ctx context.Context, scratch string) (disk string, paused time.Duration, cleanup func(), err error) {
	return b.eng.StableDisk(ctx, scratch, b.load, b.syncGuest)
}

// syncGuest runs sync in the box: what its page cache holds goes to its
// disks.
func (b *Box) syncGuest(ctx context.Context) error {
	r, err := b.Exec(ctx, "sync", nil, ExecOptions{Timeout: time.Minute})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("exit status %d: %s", r.ExitCode, r.Stderr)
	}
	return err
}

// diskTool returns how Commit runs e2fsck and debugfs on a box's disk:
// confined as the box's QEMU is (confine.DiskTool).
func (r *Runtime) diskTool() (rootfs.ToolRunner, error) {
	return confine.DiskTool(r.opts.Unconfined, r.opts.UIDRange)
}
