package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/confine"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/vmm"
)

// virtiofsdPaths are where the C virtiofsd is looked for when
// Options.Virtiofsd is "": Debian's QEMU 7.2 package (qemu-system-common)
// ships it in /usr/lib/qemu; other distributions in /usr/libexec.
var virtiofsdPaths = []string{"/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd"}

// share is one host directory shared over virtio-fs for one boot: its
// virtiofsd listens on sock, QEMU connects to it.
type share struct {
	source  string // host directory
	ro      bool
	sock    string // vhost-user socket (the box's socket directory)
	pidFile string // "PID START" of the daemon (vmm.Handle), to end a stale one
	logFile string // the daemon's stderr
}

func shareSock(i int) string { return "virtiofs-" + strconv.Itoa(i) + ".sock" }

func newShare(spec vmm.Spec, i int, v vmm.Volume) share {
	n := strconv.Itoa(i)
	return share{source: v.HostDir, ro: v.ReadOnly,
		sock:    boxdir.SockPath(spec.Dir, spec.ID, shareSock(i)),
		pidFile: filepath.Join(spec.Dir, "virtiofsd-"+n+".pid"),
		logFile: filepath.Join(spec.Dir, "virtiofsd-"+n+".log")}
}

// findVirtiofsd returns the virtiofsd to run: path if set, else the first
// of virtiofsdPaths that exists, else virtiofsd on PATH.
func findVirtiofsd(path string) (string, error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("virtiofsd %s (Options.Virtiofsd, or AIRLOCK_VIRTIOFSD): %w", path, err)
		}
		return path, nil
	}
	for _, p := range virtiofsdPaths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("virtiofsd"); err == nil {
		return p, nil
	}
	return "", errors.New("virtiofsd not found (virtio-fs volumes need it): install Debian's qemu-system-x86 (it ships /usr/lib/qemu/virtiofsd), set AIRLOCK_VIRTIOFSD, or use the 9p volume transport (the default)")
}

// virtiofsdArgs are the C virtiofsd's arguments for sh: one share, served
// without caching in the guest (cache=none: changes on the host are seen
// at once, as with 9p), sandboxed by the daemon itself (sandbox=namespace:
// new mount, pid and net namespaces, pivot_root into the shared directory,
// so no path the guest sends, `..` or a symlink, resolves outside it; a
// seccomp filter; capabilities cut to what passthrough needs), without
// CAP_MKNOD and CAP_SETFCAP (no device nodes or file capabilities on the
// host). It exits when QEMU closes the socket.
func virtiofsdArgs(sh share) []string {
	return []string{"--socket-path=" + sh.sock, "-o", "source=" + sh.source,
		"-o", "cache=none", "-o", "sandbox=namespace", "-o", "modcaps=-mknod:-setfcap",
		"-o", "no_posix_lock", "-o", "no_flock"}
}

// roWrapper runs virtiofsd in a private mount namespace (Cloneflags) where
// the shared directory is bind-mounted over itself read-only: the C
// virtiofsd has no read-only option, so the host kernel refuses every write
// (EROFS), whatever the guest asks, remount included (the daemon has no
// CAP_SYS_ADMIN after its setup and its seccomp filter has no mount).
const roWrapper = `mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"`

// cgroupGate makes the wrapper shell wait for a line on its stdin (sent
// once startShare has moved it into the daemons' cgroup) before it runs
// anything: virtiofsd forks into its sandbox at once, and a child forked
// before the move would stay outside the cgroup.
const cgroupGate = `read -r go || exit 1; exec </dev/null; `

// Limits of the virtio-fs daemons' cgroup (as root), per share: threads
// (the C virtiofsd runs a few per queue, no thread pool by default) and,
// for all of them, memory: their own few MiB, and the pages of guest RAM
// (the shared memfd) that they are first to touch, at most all of it.
const (
	shareMemory = 256 << 20
	sharePids   = 64
)

// shareCgroup creates the cgroup the virtio-fs daemons of one boot of
// spec's box (n shares) run in, when QEMU is confined and this process is
// root (nil otherwise, or where the host offers no cgroups: then with a
// warning), and records it in the box directory for release.
func (d *Driver) shareCgroup(spec vmm.Spec, qc Config, n int) *confine.Cgroup {
	if n == 0 || qc.Jail.Off || os.Geteuid() != 0 {
		return nil
	}
	mem := spec.MemoryMiB
	if mem <= 0 {
		mem = 512
	}
	g, err := confine.NewCgroup("fs-"+spec.ID, confine.Limits{MemoryBytes: shareMemory + int64(mem)<<20, Pids: sharePids * n})
	if err != nil {
		d.warn("airlock: warning: virtio-fs daemons run without a cgroup: " + err.Error())
		return nil
	}
	confine.SaveCgroup(filepath.Join(spec.Dir, boxdir.FSCgroup), g)
	return g
}

// startShares starts one virtiofsd per share, in cgroup g when not nil,
// and returns once each listens on its socket (bounded by ctx and 15 s).
// On error none is left running. The daemons outlive this process; each
// ends when its QEMU does.
func startShares(ctx context.Context, bin string, shares []share, g *confine.Cgroup) error {
	if len(shares) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("virtio-fs volumes need root: the C virtiofsd sandboxes itself with namespaces, which takes root; run as root, or use the 9p volume transport (the default)")
	}
	path, err := findVirtiofsd(bin)
	if err != nil {
		return err
	}
	var started []vmm.Handle
	fail := func(err error) error {
		for _, h := range started {
			vmm.Kill(h)
		}
		return err
	}
	for _, sh := range shares {
		stopStale(sh.pidFile)
		os.Remove(sh.sock)
		h, err := startShare(ctx, path, sh, g)
		if err != nil {
			return fail(fmt.Errorf("volume %s: virtiofsd: %w", sh.source, err))
		}
		started = append(started, h)
	}
	return nil
}

func startShare(ctx context.Context, path string, sh share, g *confine.Cgroup) (vmm.Handle, error) {
	src, err := filepath.EvalSymlinks(sh.source)
	if err != nil {
		return vmm.Handle{}, err
	}
	sh.source = src
	log, err := os.OpenFile(sh.logFile, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return vmm.Handle{}, err
	}
	defer log.Close()
	cmd := exec.Command(path, virtiofsdArgs(sh)...)
	// Root, and serving a guest: none of the caller's secrets. PATH stays
	// for the wrapper shell's mount.
	cmd.Env = defaults.ChildEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if sh.ro || g != nil {
		script := `exec "$@"`
		if sh.ro {
			script = roWrapper
			// Go makes / private (MS_REC|MS_PRIVATE) in a new mount
			// namespace, so the read-only bind stays in it.
			cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
		}
		if g != nil {
			script = cgroupGate + script
		}
		cmd.Path = "/bin/sh"
		cmd.Args = append([]string{"/bin/sh", "-c", script, src, path}, virtiofsdArgs(sh)...)
	}
	// Neither virtiofsd nor the wrapper shell may make a setuid or setgid
	// file: passthrough would otherwise let root in the box leave a
	// setuid-root program on the host (the guest's chmod 4755, or a
	// create with that mode, fails with EPERM).
	confine.NoSetIDCmd(cmd)
	var gate io.WriteCloser
	if g != nil {
		if gate, err = cmd.StdinPipe(); err != nil {
			return vmm.Handle{}, err
		}
		defer gate.Close()
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return vmm.Handle{}, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	h := vmm.Handle{PID: cmd.Process.Pid, Start: vmm.StartTime(cmd.Process.Pid)}
	os.WriteFile(sh.pidFile, []byte(fmt.Sprintf("%d %d\n", h.PID, h.Start)), 0o600)
	if g != nil {
		if err := g.Add(h.PID); err != nil {
			vmm.Kill(h)
			return vmm.Handle{}, err
		}
		gate.Write([]byte("go\n"))
		gate.Close()
	}
	deadline := time.After(15 * time.Second)
	for {
		if fi, err := os.Stat(sh.sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return h, nil
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(sh.logFile)
			return vmm.Handle{}, fmt.Errorf("exited at start: %s", lastLines(string(b), 5))
		case <-ctx.Done():
			vmm.Kill(h)
			return vmm.Handle{}, ctx.Err()
		case <-deadline:
			vmm.Kill(h)
			return vmm.Handle{}, fmt.Errorf("no socket %s after 15 s (log: %s)", sh.sock, sh.logFile)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// releaseShares ends the virtio-fs daemons of the box in dir, unless its
// QEMU still runs (they end by themselves when it closes their sockets;
// this is for one that did not), and removes their cgroup.
func releaseShares(dir string) {
	if b, err := os.ReadFile(filepath.Join(dir, boxdir.PID)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && vmm.StartTime(pid) != 0 { // running, not a zombie
			return
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "virtiofsd-*.pid"))
	for _, f := range files {
		stopStale(f)
	}
	confine.RemoveSavedCgroup(filepath.Join(dir, boxdir.FSCgroup))
}

// stopStale kills the daemon a pid file names if it still runs (a start
// that failed before its QEMU connected).
func stopStale(pidFile string) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	var h vmm.Handle
	if _, err := fmt.Sscan(string(b), &h.PID, &h.Start); err == nil && h.Alive() {
		vmm.Kill(h)
	}
	os.Remove(pidFile)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "; ")
}
