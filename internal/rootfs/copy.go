package rootfs

// CopyDisk copies the disk image src to a new file dst (refusing to
// overwrite one), keeping src's holes as holes and letting the filesystem
// share blocks where it can (copy_file_range: a reflink on btrfs and XFS).
// A partial dst is removed on failure.
func CopyDisk(src, dst string) error { return sparseCopy(src, dst) }
