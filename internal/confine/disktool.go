package confine

import (
	"os"
	"os/exec"
	"path/filepath"

	"github.com/airlock-run/airlock/internal/defaults"
)

// DiskTool returns how commit runs e2fsck and debugfs on a box's disk
// (a rootfs.ToolRunner): a file system the guest made attacks those
// tools, so they run as the box's QEMU does. As root and confined
// (unconfined false, the default), the runs of one commit get a uid of
// the box uid range (uidRange, as BoxUIDRange reads it) of their own
// (AllocUID; its working directory and files are handed to it), new
// network (empty), IPC, UTS, PID and mount namespaces, an empty
// capability bounding set, no capability, no_new_privs and resource
// limits (ToolCmd). Otherwise it runs as the caller. Either way its
// environment is the allowlisted one (defaults.ChildEnv).
func DiskTool(unconfined bool, uidRange string) (func(cmd *exec.Cmd) error, error) {
	if unconfined || os.Geteuid() != 0 {
		return func(cmd *exec.Cmd) error {
			cmd.Env = defaults.ChildEnv()
			return nil
		}, nil
	}
	rng, err := BoxUIDRange(uidRange)
	if err != nil {
		return nil, err
	}
	// One uid for the commit's runs: a uid per run would hold a claim on
	// the range for each, and handing the directory over again would
	// chown what an earlier run left there. The directory is handed over
	// once, before any tool has run in it.
	uid, handed := -1, map[string]bool{}
	return func(cmd *exec.Cmd) error {
		if uid < 0 {
			u, err := AllocUID(rng)
			if err != nil {
				return err
			}
			uid = u
		}
		if !handed[cmd.Dir] {
			if err := chownDir(cmd.Dir, uid); err != nil {
				return err
			}
			handed[cmd.Dir] = true
		}
		ToolCmd(cmd, uid)
		return nil
	}, nil
}

// chownDir gives dir and the entries directly in it (no deeper: the tools'
// directory holds files only) to uid:uid, without following symlinks.
func chownDir(dir string, uid int) error {
	if err := os.Lchown(dir, uid, uid); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.Lchown(filepath.Join(dir, e.Name()), uid, uid); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}
