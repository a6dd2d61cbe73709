package rootfs

import "github.com/airlock-run/airlock/internal/sparse"

// CopyDisk copies the disk image src to a new file dst (refusing to
// overwrite one), keeping src's holes as holes and letting the filesystem
// share blocks where it can (copy_file_range: a reflink on btrfs and XFS).
// A partial dst is removed on failure. It is sparse.Copy.
func CopyDisk(src, dst string) error { return sparse.Copy(src, dst) }
