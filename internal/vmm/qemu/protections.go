package qemu

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/airlock-run/airlock/internal/confine"
)

// Protection is one layer of QEMU's confinement, as `airlock doctor`
// shows it.
type Protection struct {
	Name string
	// On is true when boxes started by this process get it.
	On bool
	// Detail says what is in effect, or why it is not and what to do.
	Detail string
	// Problem marks a missing protection that should be there (root
	// without a uid range), as opposed to one an unprivileged user cannot
	// have.
	Problem bool
}

// Protections reports which confinement layers boxes started by this
// process with confinement o get.
func Protections(o JailOptions) []Protection {
	if o.Off {
		return []Protection{{Name: "confinement", Detail: "off (AIRLOCK_CONFINE=off): QEMU runs unconfined, as " + who()}}
	}
	root := os.Geteuid() == 0
	var ps []Protection
	seccomp := Protection{Name: "seccomp", On: true, Detail: "QEMU -sandbox " + SandboxArg + ", no_new_privs"}
	if out, err := exec.Command("qemu-system-x86_64", "-sandbox", "help").CombinedOutput(); err != nil && strings.Contains(string(out), "no seccomp") {
		seccomp = Protection{Name: "seccomp", Detail: "QEMU is built without seccomp support: " + strings.TrimSpace(string(out)), Problem: true}
	}
	ps = append(ps, seccomp)
	switch {
	case root:
		ps = append(ps, Protection{Name: "jail", On: true, Detail: "own mount, pid, IPC, UTS namespaces; read-only root with only system libraries, kernel and device nodes (and a box's 9p volumes, idmapped to its uid); disks and sockets passed as descriptors, virtio-fs daemons' sockets too (the daemons stay root outside the jail, sandboxed by themselves, in a cgroup of their own)"})
	case confine.UserNSAllowed() == nil:
		ps = append(ps, Protection{Name: "jail", On: true, Detail: "in a user namespace: own mount, pid, IPC, UTS namespaces; read-only root with only system libraries, kernel and device nodes"})
	default:
		ps = append(ps, Protection{Name: "jail", Detail: "not in effect: " + confine.UserNSAllowed().Error() + "; QEMU sees the host's file system as " + who()})
	}
	if root || confine.UserNSAllowed() == nil {
		ps = append(ps, Protection{Name: "network ns", On: true, Detail: "QEMU in an empty network namespace; a box's network is the network helper's, reached through a socket passed as a descriptor"})
	} else {
		ps = append(ps, Protection{Name: "network ns", Detail: "not in effect (no user namespaces)"})
	}
	if root {
		if r, err := confine.BoxUIDRange(o.UIDRange); err != nil {
			ps = append(ps, Protection{Name: "box uid", Detail: err.Error(), Problem: true})
		} else {
			ps = append(ps, Protection{Name: "box uid", On: true, Detail: fmt.Sprintf("each box's QEMU runs as its own uid from %d-%d (%s)", r.Start, r.Start+r.Count-1, r.Source)})
		}
		if KVMGroup() > 0 {
			ps = append(ps, Protection{Name: "kvm access", On: true, Detail: fmt.Sprintf("box uids join group %d, the owner of /dev/kvm", KVMGroup())})
		}
	} else {
		ps = append(ps, Protection{Name: "box uid", Detail: "not in effect: airlock is not root, so QEMU runs as " + who() + " (a uid per box needs root)"})
	}
	have, missing := confine.ProbeCgroups().Controllers()
	switch {
	case !root:
		ps = append(ps, Protection{Name: "cgroup", Detail: "not in effect: creating cgroups needs root"})
	case len(have) == 0:
		ps = append(ps, Protection{Name: "cgroup", Detail: "not in effect: no memory, pids or cpu cgroup controller is mounted"})
	default:
		d := "memory (guest RAM + overhead), pids and optional CPU (AIRLOCK_CPU_LIMIT) limits: " + strings.Join(have, ", ")
		if len(missing) > 0 {
			d += "; missing: " + strings.Join(missing, ", ")
		}
		ps = append(ps, Protection{Name: "cgroup", On: true, Detail: d})
	}
	if root {
		ps = append(ps, Protection{Name: "net helper", On: true, Detail: "each box's network helper gives up root once set up: chroot into an empty directory, its own uid from the box range, only CAP_NET_RAW, no_new_privs, its own cgroup (memory, pids), then a seccomp allowlist (no open, exec, ptrace or mount; new sockets AF_INET/AF_INET6 only); it stays in the host's network namespace (it is the box's gateway)"})
	} else {
		ps = append(ps, Protection{Name: "net helper", Detail: "partly: the network helper runs as " + who() + " (its own uid, chroot and cgroup need root); it still installs its seccomp allowlist (no open, exec, ptrace or mount)"})
	}
	ps = append(ps, Protection{Name: "agent auth", On: true, Detail: "per-boot secret (box dir, 0600) given to the guest on a virtio-serial port; every connection proves it"})
	return ps
}

func who() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	return fmt.Sprintf("uid %d", os.Geteuid())
}
