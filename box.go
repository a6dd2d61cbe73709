package airlock

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"
	"github.com/mdlayher/vsock"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/rootfs"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// Files in a box directory (Home/boxes/<id>/).
const (
	fileRW      = "rw.ext4"     // writable layer (ext4), survives Stop/Start
	fileConsole = "console.log" // serial console of the current boot
	filePID     = "qemu.pid"
	fileLock    = "lock"
	fileQMP     = "qmp.sock"
	fileCID     = "vsock.cid" // guest CID when the box has a vsock device
)

// vsockPort is the AF_VSOCK port the agent listens on in the guest.
const vsockPort = 1024

// agentPorts is how many virtio-serial ports the agent serves. Each takes
// one host connection at a time (held under the flock agent-N.lock), so up
// to this many processes can talk to one box at once.
const agentPorts = 4

func agentSock(i int) string { return fmt.Sprintf("agent-%d.sock", i) }
func agentLock(i int) string { return fmt.Sprintf("agent-%d.lock", i) }

// bootTimeout bounds how long Start waits for the agent after launching
// QEMU. TCG boots take seconds, more when many boxes boot at once.
const bootTimeout = 120 * time.Second

// Box is a handle on one box. Handles are cheap; several processes may hold
// handles on the same box. Methods are safe for concurrent use; several
// Execs may run at once.
type Box struct {
	r   *Runtime
	id  string
	dir string

	mu       sync.Mutex
	rec      *store.Box
	cfg      boxConfig
	conn     *client.Client
	vmExit   <-chan struct{} // closed when QEMU exits (while watched)
	watchPID int             // the pid vmExit watches
	died     *DiedError
	stopping bool
}

func newBox(r *Runtime, rec *store.Box) *Box {
	b := &Box{r: r, id: rec.ID, dir: filepath.Join(r.opts.Home, "boxes", rec.ID)}
	b.refresh(rec)
	return b
}

func (b *Box) refresh(rec *store.Box) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rec = rec
	json.Unmarshal(rec.Config, &b.cfg)
}

// ID returns the box id (12 hex digits).
func (b *Box) ID() string { return b.id }

// Name returns the box name, "" if unnamed.
func (b *Box) Name() string { return b.rec.Name }

// Info returns the box's current record.
func (b *Box) Info(ctx context.Context) (BoxInfo, error) {
	rec, err := b.r.db.Get(ctx, b.id)
	if err != nil {
		return BoxInfo{}, fmt.Errorf("%w: %s", ErrBoxNotFound, b.id)
	}
	if rec.State == store.StateRunning && !qemu.Alive(rec.PID, rec.PIDStart) {
		b.r.db.SetStopped(ctx, rec.ID)
		rec.State = store.StateStopped
	}
	b.refresh(rec)
	return infoOf(rec), nil
}

// ConsoleLog returns the path of the box's serial console log (kernel and
// agent messages of the current or last boot).
func (b *Box) ConsoleLog() string { return filepath.Join(b.dir, fileConsole) }

func (b *Box) lock(ctx context.Context) (func(), error) {
	fl := flock.New(filepath.Join(b.dir, fileLock))
	ok, err := fl.TryLockContext(ctx, 20*time.Millisecond)
	if err != nil {
		return nil, fmt.Errorf("lock box %s: %w", b.id, err)
	}
	if !ok {
		return nil, fmt.Errorf("lock box %s: %w", b.id, ctx.Err())
	}
	return func() { fl.Unlock() }, nil
}

// sockPath returns where a box's unix socket lives: in the box directory,
// or, when that path is too long for a unix socket, in a short directory
// under the system temp dir.
func (b *Box) sockPath(name string) string {
	p := filepath.Join(b.dir, name)
	if len(p) < 100 {
		return p
	}
	d := filepath.Join(os.TempDir(), "airlock-"+b.id)
	os.MkdirAll(d, 0o700)
	return filepath.Join(d, name)
}

// create prepares the box directory and its writable layer.
func (b *Box) create(ctx context.Context, img *image.Image) error {
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return err
	}
	if _, err := rootfs.Base(ctx, b.r.images, img, b.r.opts.CacheDir); err != nil {
		return fmt.Errorf("root filesystem for %s: %w", img.Ref, err)
	}
	return rootfs.NewDisk(filepath.Join(b.dir, fileRW), b.cfg.Options.DiskSizeMiB, b.r.opts.CacheDir)
}

func (b *Box) image() (*image.Image, error) {
	img, err := b.r.images.Resolve(b.rec.ImageDigest)
	if err != nil {
		img, err = b.r.images.Resolve(b.rec.Image)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s of box %s: %w", b.rec.Image, b.id, err)
	}
	return img, nil
}

// Start boots the box's VM, if it is not running, and waits for its agent.
// Files written in the box before a Stop are still there.
func (b *Box) Start(ctx context.Context) error {
	unlock, err := b.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := b.r.db.Get(ctx, b.id)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrBoxNotFound, b.id)
	}
	b.refresh(rec)
	if rec.State == store.StateRunning && qemu.Alive(rec.PID, rec.PIDStart) {
		_, err := b.client(ctx)
		return err
	}
	boot, err := b.r.bootAssets()
	if err != nil {
		return err
	}
	// Another process may have pruned the agent disk or initramfs since
	// this runtime looked: build it again (same content, same path).
	if boot.agentDisk != "" {
		if _, err := os.Stat(boot.agentDisk); err != nil {
			if _, err := assets.AgentDisk(ctx, b.r.opts.CacheDir, boot.agent); err != nil {
				return err
			}
		}
	}
	if boot.initrd != "" {
		if _, err := os.Stat(boot.initrd); err != nil {
			if _, err := assets.Initrd(b.r.opts.CacheDir, boot.agent, boot.kernel); err != nil {
				return err
			}
		}
	}
	img, err := b.image()
	if err != nil {
		return err
	}
	base, err := rootfs.Base(ctx, b.r.images, img, b.r.opts.CacheDir)
	if err != nil {
		return fmt.Errorf("root filesystem for %s: %w", img.Ref, err)
	}
	var cid uint32
	if qemu.VsockAvailable() {
		cid = randomCID()
	}
	if n := runtime.NumCPU(); boot.accel.Accel == qemu.AccelTCG && b.cfg.Options.CPUs > n {
		b.r.warn(fmt.Sprintf("airlock: warning: box %s has %d vCPUs but this host has %d CPUs: under TCG each vCPU is a host thread, so more vCPUs than host CPUs make the box slower, not faster", b.id, b.cfg.Options.CPUs, n))
	}
	if err := checkCapacity(b.id, b.cfg.Options.MemoryMiB); err != nil {
		return err
	}
	qc := b.vmConfig(boot, base, cid)
	if err := b.confine(&qc); err != nil {
		return fmt.Errorf("box %s: %w", b.id, err)
	}
	for _, f := range append(qc.AgentSockets, qc.QMPSocket, qc.PIDFile, filepath.Join(b.dir, fileCID)) {
		os.Remove(f)
	}
	os.WriteFile(b.ConsoleLog(), nil, 0o600)
	pid, err := qemu.Launch(ctx, qc)
	for try := 0; try < 5 && qemu.IsCIDInUse(err); try++ {
		qc = b.vmConfig(boot, base, randomCID())
		if err = b.confine(&qc); err == nil {
			pid, err = qemu.Launch(ctx, qc)
		}
	}
	if err != nil {
		b.vmGone()
		return fmt.Errorf("box %s: %w", b.id, err)
	}
	if qc.VsockCID != 0 {
		os.WriteFile(filepath.Join(b.dir, fileCID), []byte(strconv.FormatUint(uint64(qc.VsockCID), 10)), 0o600)
	}
	start := qemu.StartTime(pid)
	if err := b.r.db.SetRunning(ctx, b.id, pid, start, time.Now()); err != nil {
		qemu.Kill(pid, start)
		return err
	}
	rec.State, rec.PID, rec.PIDStart = store.StateRunning, pid, start
	b.mu.Lock()
	b.rec = rec
	b.died = nil
	b.stopping = false
	b.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	if _, err := b.client(cctx); err != nil {
		qemu.Kill(pid, start)
		b.vmGone()
		b.r.db.SetStopped(context.WithoutCancel(ctx), b.id)
		var de *DiedError
		if errors.As(err, &de) {
			return err
		}
		return fmt.Errorf("box %s did not come up: %w\n--- console (last lines) ---\n%s", b.id, err, consoleTail(b.ConsoleLog(), 20))
	}
	return nil
}

// vmConfig is the QEMU configuration of this box for one boot.
// cid, when non-zero, adds a vhost-vsock device with that guest CID.
func (b *Box) vmConfig(boot *bootAssets, base string, cid uint32, extraCmdline ...string) qemu.Config {
	var agentSocks []string
	for i := 0; i < agentPorts; i++ {
		agentSocks = append(agentSocks, b.sockPath(agentSock(i)))
	}
	o := b.cfg.Options
	disks := []qemu.Disk{{Path: base, ReadOnly: true}, {Path: filepath.Join(b.dir, fileRW)}}
	extra := []string{"airlock.rw=/dev/vdb"}
	if boot.agentDisk != "" {
		// No initramfs: the kernel mounts the agent disk as its root and
		// runs /init from it; the box disks come after it.
		// Readahead over the whole disk: the first page fault in /init then
		// reads the agent in a few large requests instead of ~60 of 128 KiB
		// (its start ~60 ms sooner under TCG here, same QEMU memory).
		disks = append([]qemu.Disk{{Path: boot.agentDisk, ReadOnly: true, OptIOSize: boot.agentDiskIO}}, disks...)
		extra = []string{"root=/dev/vda", "rootfstype=erofs", "ro", "init=/init", "airlock.root=/dev/vdb", "airlock.rw=/dev/vdc"}
	}
	extra = append(extra, "airlock.hostname="+b.hostname(), "airlock.ports="+strconv.Itoa(agentPorts))
	if os.Getenv("AIRLOCK_DEBUG") != "" {
		extra = append(extra, "airlock.debug=1")
	}
	if o.Network != NetworkDisabled {
		extra = append(extra, "airlock.net=user")
		if boot.kernel.IPConfig {
			extra = append(extra, qemu.UserNetIPParam)
		}
	}
	if cid != 0 {
		extra = append(extra, "airlock.vsock="+strconv.Itoa(vsockPort))
	}
	// One vCPU under TCG: the PIT instead of a local APIC timer that the
	// kernel would first calibrate for 100 ms (see qemu.Config.NoACPI).
	// With more vCPUs each keeps its own APIC timer: with the PIT alone
	// the others get only periodic 4 ms ticks (no high-resolution timers).
	noACPI := boot.accel.Accel == qemu.AccelTCG && boot.kernel.BootsWithoutACPI && o.CPUs <= 1
	if noACPI {
		extra = append(extra, "noapictimer")
	}
	return qemu.Config{
		NoACPI:       noACPI,
		VsockCID:     cid,
		Name:         "airlock-" + b.id,
		Accel:        boot.accel.Accel,
		CPUs:         o.CPUs,
		MemoryMiB:    o.MemoryMiB,
		Kernel:       boot.kernel.Path,
		Initrd:       boot.initrd,
		Cmdline:      qemu.KernelCmdline(boot.accel.Accel, append(extra, extraCmdline...)...),
		Disks:        disks,
		AgentSockets: agentSocks,
		QMPSocket:    b.sockPath(fileQMP),
		ConsoleLog:   b.ConsoleLog(),
		PIDFile:      filepath.Join(b.dir, filePID),
		Network:      o.Network != NetworkDisabled,
		THP:          boot.thp,
		KernelSpan:   boot.kernelSpan,
	}
}

func (b *Box) hostname() string {
	if n := b.rec.Name; n != "" && validHostname(n) {
		return n
	}
	return b.id
}

func validHostname(s string) bool {
	if len(s) > 63 {
		return false
	}
	for _, c := range s {
		if !(c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// watchVM starts watching the QEMU process pid, once per boot.
// Preconditions: b.mu is held.
func (b *Box) watchVM(pid int) {
	if b.vmExit != nil && b.watchPID == pid {
		return
	}
	ch, err := qemu.Watch(pid)
	if err != nil {
		// No pidfd (old kernel, seccomp): poll instead of declaring a
		// running VM dead.
		c := make(chan struct{})
		start := qemu.StartTime(pid)
		go func() {
			for qemu.Alive(pid, start) {
				time.Sleep(200 * time.Millisecond)
			}
			close(c)
		}()
		ch = c
	}
	b.vmExit, b.watchPID = ch, pid
	go func() {
		<-ch
		b.mu.Lock()
		if b.watchPID != pid {
			// A newer boot is being watched.
			b.mu.Unlock()
			return
		}
		if !b.stopping {
			b.died = b.diedError(pid)
		}
		b.dropConnLocked()
		b.vmExit, b.watchPID = nil, 0
		b.mu.Unlock()
		b.vmGone()
		b.r.db.SetStoppedIfPID(context.Background(), b.id, pid)
	}()
}

// diedError reads the console to say why the VM ended.
func (b *Box) diedError(pid int) *DiedError {
	tail := consoleTail(b.ConsoleLog(), 25)
	long := consoleTail(b.ConsoleLog(), 400)
	cause := fmt.Sprintf("its QEMU process (pid %d) exited unexpectedly", pid)
	switch {
	case strings.Contains(long, "Kernel panic"):
		cause = "guest kernel panic"
		for _, l := range splitLines(long) {
			if i := strings.Index(l, "Kernel panic"); i >= 0 {
				cause += " (" + strings.TrimSpace(l[i:]) + ")"
				break
			}
		}
	case strings.Contains(long, "Out of memory"):
		cause = "the guest ran out of memory"
	case strings.Contains(long, "airlock-agent: fatal"):
		cause = "the guest agent failed to set up the box"
	}
	return &DiedError{BoxID: b.id, Cause: cause, ConsoleTail: tail}
}

// deadErr returns the DiedError if the VM is known to have died, waiting up
// to wait for the exit watcher to notice.
func (b *Box) deadErr(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		b.mu.Lock()
		d, rec := b.died, b.rec
		b.mu.Unlock()
		if d != nil {
			return d
		}
		if !qemu.Alive(rec.PID, rec.PIDStart) {
			b.mu.Lock()
			stopping := b.stopping
			b.mu.Unlock()
			if stopping {
				return fmt.Errorf("%w: %s was stopped", ErrBoxNotRunning, b.id)
			}
			time.Sleep(20 * time.Millisecond)
			b.mu.Lock()
			d = b.died
			b.mu.Unlock()
			if d != nil {
				return d
			}
			return b.diedError(rec.PID)
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// client returns a connected agent client, connecting if needed.
func (b *Box) client(ctx context.Context) (*client.Client, error) {
	b.mu.Lock()
	if b.conn != nil {
		select {
		case <-b.conn.Done():
			b.conn = nil
		default:
			c := b.conn
			b.mu.Unlock()
			return c, nil
		}
	}
	rec := b.rec
	if d := b.died; d != nil {
		b.mu.Unlock()
		return nil, d
	}
	b.mu.Unlock()
	if rec.State != store.StateRunning || !qemu.Alive(rec.PID, rec.PIDStart) {
		if rec.State == store.StateRunning {
			if err := b.deadErr(0); err != nil {
				return nil, err
			}
		}
		return nil, fmt.Errorf("%w: %s (start it first: airlock start %s, or Box.Start)", ErrBoxNotRunning, b.id, b.id)
	}
	b.mu.Lock()
	b.watchVM(rec.PID)
	b.mu.Unlock()
	c, err := b.dialAgent(ctx)
	if err != nil {
		if de := b.deadErr(time.Second); de != nil {
			return nil, de
		}
		return nil, fmt.Errorf("connect to agent of box %s: %w", b.id, err)
	}
	if _, err := c.Hello(ctx); err != nil {
		c.Close()
		if de := b.deadErr(time.Second); de != nil {
			return nil, de
		}
		return nil, fmt.Errorf("agent of box %s: %w", b.id, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn != nil { // lost a race with another caller
		c.Close()
		return b.conn, nil
	}
	b.conn = c
	return c, nil
}

// randomCID returns a vsock guest CID (3 and up; 0-2 are reserved).
func randomCID() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return 3 + binary.LittleEndian.Uint32(b[:])%(1<<31)
}

// dialVsock connects to the agent over vsock when the box has a vsock
// device; ok is false when it has none or the connection failed (the caller
// then uses a virtio-serial port).
func (b *Box) dialVsock(ctx context.Context) (c *client.Client, ok bool) {
	raw, err := os.ReadFile(filepath.Join(b.dir, fileCID))
	if err != nil {
		return nil, false
	}
	cid, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 32)
	if err != nil || cid == 0 {
		return nil, false
	}
	c, err = client.DialAuth(ctx, b.boxSecret(), func(ctx context.Context) (net.Conn, error) {
		return vsock.Dial(uint32(cid), vsockPort, nil)
	})
	return c, err == nil
}

// dialAgent connects over vsock where the box has it, else takes a free
// agent port (the first whose flock it gets, waiting
// while all are in use by other processes) and connects through it. The
// flock is held until the connection ends.
func (b *Box) dialAgent(ctx context.Context) (*client.Client, error) {
	if c, ok := b.dialVsock(ctx); ok {
		return c, nil
	}
	var fl *flock.Flock
	var port int
	for fl == nil {
		for i := 0; i < agentPorts; i++ {
			l := flock.New(filepath.Join(b.dir, agentLock(i)))
			if ok, err := l.TryLock(); err == nil && ok {
				fl, port = l, i
				break
			}
		}
		if fl != nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("all %d agent ports are in use by other processes: %w", agentPorts, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	sock := b.sockPath(agentSock(port))
	c, err := client.DialAuth(ctx, b.boxSecret(), func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	if err != nil {
		fl.Unlock()
		return nil, err
	}
	go func() {
		<-c.Done()
		fl.Unlock()
	}()
	return c, nil
}

// GuestInfo reports the agent version, guest kernel release and uptime.
func (b *Box) GuestInfo(ctx context.Context) (client.Info, error) {
	c, err := b.client(ctx)
	if err != nil {
		return client.Info{}, err
	}
	return c.Hello(ctx)
}

// Stop shuts the box down: the agent stops all processes, syncs and
// unmounts the writable layer and powers off; if that does not finish in
// time, QEMU is told to quit, then killed. Stopping a stopped box is a
// no-op. An AutoRemove box is removed.
func (b *Box) Stop(ctx context.Context) error {
	unlock, err := b.lock(ctx)
	if err != nil {
		return err
	}
	err = b.stopLocked(ctx)
	unlock()
	if err != nil {
		return err
	}
	if b.cfg.Options.AutoRemove {
		return b.remove(ctx, true)
	}
	return nil
}

func (b *Box) stopLocked(ctx context.Context) error {
	rec, err := b.r.db.Get(ctx, b.id)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrBoxNotFound, b.id)
	}
	b.refresh(rec)
	b.mu.Lock()
	b.stopping = true
	b.mu.Unlock()
	pid, start := rec.PID, rec.PIDStart
	if rec.State == store.StateRunning && qemu.Alive(pid, start) {
		gone := func(d time.Duration) bool {
			deadline := time.Now().Add(d)
			for qemu.Alive(pid, start) {
				if time.Now().After(deadline) {
					return false
				}
				time.Sleep(20 * time.Millisecond)
			}
			return true
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if c, err := b.client(cctx); err == nil {
			c.Shutdown(cctx)
		}
		cancel()
		if !gone(10 * time.Second) {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if q, err := qemu.DialQMP(qctx, b.sockPath(fileQMP)); err == nil {
				q.Execute("quit", nil)
				q.Close()
			}
			cancel()
			if !gone(3 * time.Second) {
				if err := qemu.Kill(pid, start); err != nil {
					return err
				}
			}
		}
	}
	b.dropConn()
	b.vmGone()
	return b.r.db.SetStopped(ctx, b.id)
}

// dropConn closes the handle's agent connection, if any.
func (b *Box) dropConn() {
	b.mu.Lock()
	b.dropConnLocked()
	b.mu.Unlock()
}

// dropConnLocked is dropConn with b.mu held.
func (b *Box) dropConnLocked() {
	if b.conn != nil {
		b.conn.Close()
		b.conn = nil
	}
}

// Close releases this handle's connection; the box keeps running. An
// AutoRemove box is stopped and removed.
func (b *Box) Close() error {
	if b.cfg.Options.AutoRemove {
		return b.remove(context.Background(), true)
	}
	b.dropConn()
	b.r.forget(b.id)
	return nil
}

// Remove deletes the box; see Runtime.Remove.
func (b *Box) Remove(ctx context.Context, force bool) error { return b.remove(ctx, force) }

func (b *Box) remove(ctx context.Context, force bool) error {
	if _, err := os.Stat(b.dir); err == nil {
		unlock, err := b.lock(ctx)
		if err != nil {
			return err
		}
		defer unlock()
	}
	rec, err := b.r.db.Get(ctx, b.id)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrBoxNotFound, b.id)
	}
	if rec.State == store.StateRunning && qemu.Alive(rec.PID, rec.PIDStart) {
		if !force {
			return fmt.Errorf("%w: %s: stop it first, or force removal (airlock rm -f)", ErrBoxRunning, b.id)
		}
		b.mu.Lock()
		b.stopping = true
		b.dropConnLocked()
		b.mu.Unlock()
		if err := qemu.Kill(rec.PID, rec.PIDStart); err != nil {
			return err
		}
	}
	b.vmGone()
	b.dropConn()
	if err := b.r.db.Delete(ctx, b.id); err != nil {
		return err
	}
	os.RemoveAll(filepath.Join(os.TempDir(), "airlock-"+b.id))
	b.r.forget(b.id)
	return os.RemoveAll(b.dir)
}
