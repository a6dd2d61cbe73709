package airlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/boxopts"
	"github.com/airlock-run/airlock/internal/confine"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/lifecycle"
	"github.com/airlock-run/airlock/internal/lifetime"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/pool"
	"github.com/airlock-run/airlock/internal/scratch"
	"github.com/airlock-run/airlock/internal/sparse"
	"github.com/airlock-run/airlock/internal/store"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/qemu"
)

// Options configure a Runtime. Zero values take the defaults described on
// each field, most of which can also be set through the environment.
type Options struct {
	// Home holds box records (state.db) and box directories (boxes/).
	// Default $AIRLOCK_HOME, else ~/.airlock.
	Home string
	// ImagesDir is the local OCI image store. Default $AIRLOCK_IMAGES,
	// else Home/images.
	ImagesDir string
	// CacheDir holds kernels, initramfs images, agent disks and root
	// filesystem bases.
	// Default $AIRLOCK_CACHE, else ~/.cache/airlock.
	CacheDir string
	// Accel is "kvm", "tcg" or "auto"/"" (probe). Default $AIRLOCK_ACCEL.
	Accel string
	// Kernel is a guest kernel (vmlinux) to boot. Default: $AIRLOCK_KERNEL,
	// else the airlock kernel in the cache, else Debian's (see doctor).
	Kernel string
	// AgentPath is the static guest agent binary. Default $AIRLOCK_AGENT,
	// else airlock-agent beside the executable or on PATH.
	AgentPath string
	// NetHelper is the network helper binary (airlock-net) that boxes
	// with a network run. Default $AIRLOCK_NET_HELPER, else airlock-net
	// beside the executable or on PATH.
	NetHelper string
	// DNSUpstream is the resolver (IP:PORT) that boxes' allowed DNS
	// queries go to. Default $AIRLOCK_DNS_UPSTREAM, else the first
	// nameserver of the host's /etc/resolv.conf when a box starts.
	DNSUpstream string
	// THP is where QEMU may use transparent huge pages: "on", "code",
	// "off", or "" for $AIRLOCK_THP, else the default for the kernel and
	// accelerator (see BootInfo.THP).
	THP string
	// VolumeTransport is how host directory volumes are shared: "9p"
	// (virtio-9p, served by QEMU) or "virtiofs" (virtio-fs, one sandboxed
	// virtiofsd per shared directory, started with the box; needs root and
	// a kernel with CONFIG_VIRTIO_FS). Default $AIRLOCK_VOLUME_TRANSPORT,
	// else "9p" (docs/files.md says why).
	VolumeTransport string
	// Virtiofsd is the virtiofsd binary for virtio-fs volumes. Default
	// $AIRLOCK_VIRTIOFSD, else /usr/lib/qemu/virtiofsd (Debian's QEMU),
	// /usr/libexec/virtiofsd, or virtiofsd on PATH.
	Virtiofsd string
	// Debug makes guest boots log verbosely to the console log. Default:
	// $AIRLOCK_DEBUG is set.
	Debug bool
	// Warn receives one-line warnings for the user (TCG in use, kernel
	// fallback, limits), as plain text with no prefix: the caller formats
	// them. The TCG warning comes when a box has started under TCG that
	// AIRLOCK_ACCEL did not ask for, never on a failed start. Default:
	// written to os.Stderr after "airlock: warning: ". Each is sent once
	// per Runtime.
	Warn func(msg string)
	// Pull hears about the pulls of images missing from the store that
	// Create makes (from the registry, credentials from
	// ~/.docker/config.json); the zero value reports nothing.
	Pull PullEvents
	// Observer, when set, receives box starts, execs, VM deaths and image
	// pulls (see Observer).
	Observer Observer

	// Unconfined starts box QEMUs without confinement (no jail, own uid,
	// seccomp filter or cgroup; benchmarks, debugging); the agent secret
	// stays. Default: $AIRLOCK_CONFINE is off, 0 or false. See
	// docs/confinement.md.
	Unconfined bool
	// ConsoleMaxBytes caps a confined box's console log (its newest part
	// is kept). Default $AIRLOCK_CONSOLE_MAX, else 8 MiB; at least 4096.
	ConsoleMaxBytes int64
	// CPULimit is how many host CPUs one box's QEMU may use (its cgroup,
	// as root). Default $AIRLOCK_CPU_LIMIT, else no limit.
	CPULimit float64
	// UIDRange is "START:COUNT", the host uids box QEMUs run as when
	// airlock runs as root. Default $AIRLOCK_UID_RANGE, else the
	// "airlock" entry of /etc/subuid and /etc/subgid (hack/setup.sh).
	UIDRange string
	// MaxBoxes caps the boxes running on this host (of every home and
	// user), checked when a box starts. Default $AIRLOCK_MAX_BOXES, else
	// DefaultMaxBoxes.
	MaxBoxes int
	// MaxMemoryMiB caps the host memory of the boxes running on this
	// host, checked at create and start: each box counts with its guest
	// memory plus a fixed overhead for QEMU's own memory, its network
	// helper and virtiofsd (see CapacityError). Default
	// $AIRLOCK_MAX_MEMORY, else host RAM minus the larger of 2 GiB and a
	// tenth.
	MaxMemoryMiB int
	// Pool lists warm pools (see PoolOptions and docs/pool.md): boxes kept
	// ready, which Create with the same options takes instead of booting.
	// Default none: every Create boots (or restores) a box.
	Pool []PoolOptions
	// PoolFills bounds how many pool boxes are made at once, across pools
	// (default DefaultPoolFills, 2).
	PoolFills int
	// PoolMaxHomeBoxes, when positive, is the most boxes of this home
	// that are not stopped (those List shows, and pool boxes) the warm
	// pools fill up to: they do not fill past it, and a box started past
	// it takes the room of a ready pool box (removed). It refuses no box
	// itself. The host caps (MaxBoxes, MaxMemoryMiB) hold pools the same
	// way. `airlock serve --max-boxes` sets it. Default 0: no such limit.
	PoolMaxHomeBoxes int
	// ReapInterval is how often an open Runtime removes the boxes of its
	// home past their BoxOptions.TTL, IdleTimeout or Lease (default
	// DefaultReapInterval, 1 s; Open removes those already past).
	ReapInterval time.Duration
}

// Runtime creates and manages boxes under one home directory. It is safe
// for concurrent use. Several processes may open the same home.
type Runtime struct {
	opts   Options
	db     *store.DB
	images *image.Store

	drv vmm.Driver

	// mu guards the fields below.
	mu     sync.Mutex
	boxes  map[string]*Box // live handles, by id
	warned map[string]bool // warnings sent (each goes out once)
	closed bool
	// late counts watchers recording a machine's end (beginLate): Close
	// waits for them before it closes the store.
	late sync.WaitGroup

	pool *pool.Set[*Box] // warm pools (nil: none); immutable after Open
	// keeper kills the machines of pool boxes (and of boxes claimed from
	// a pool as AutoRemove boxes) when this process dies: they cannot
	// get QEMU's parent-death signal, since a claim may hand a pool box
	// on as a box that outlives the process (diesWithOwner).
	keeper confine.Keeper

	life lifeState // the reaper of boxes past their lifetime (lifetime.go)

	execSeq atomic.Uint64 // the last Event.ExecID
}

// Open opens (creating if needed) the runtime home and reconciles box
// records with reality: a box recorded as running whose VM is gone is
// marked stopped. Box records written by older versions are migrated.
func Open(opts Options) (*Runtime, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, err := qemu.CheckTransport(opts.VolumeTransport); err != nil {
		return nil, err
	}
	return openWith(opts, qemu.New(qemuOptions(opts)))
}

// qemuOptions are the QEMU driver's options for opts (with its defaults).
func qemuOptions(opts Options) qemu.Options {
	return qemu.Options{Accel: opts.Accel, Kernel: opts.Kernel, AgentPath: opts.AgentPath,
		CacheDir: opts.CacheDir, THP: opts.THP, Debug: opts.Debug, Warn: opts.Warn,
		Jail: qemu.JailOptions{Off: opts.Unconfined, ConsoleMax: opts.ConsoleMaxBytes,
			CPULimit: opts.CPULimit, UIDRange: opts.UIDRange},
		VolumeTransport: opts.VolumeTransport, Virtiofsd: opts.Virtiofsd}
}

// openWith opens a runtime whose boxes run on drv (opts has its defaults).
func openWith(opts Options, drv vmm.Driver) (*Runtime, error) {
	// No shared fallback such as /tmp, where another user could plant a
	// kernel, an agent disk or box files (internal/defaults).
	if opts.Home == "" {
		return nil, errors.New("no airlock home: $HOME is not set; set HOME, or AIRLOCK_HOME (Options.Home) to the directory airlock should keep its boxes in")
	}
	if opts.CacheDir == "" {
		return nil, errors.New("no airlock cache directory: $HOME is not set; set HOME, or AIRLOCK_CACHE (Options.CacheDir) to the directory for kernels and root filesystems")
	}
	if err := boxdir.MakeParent(filepath.Join(opts.Home, "boxes")); err != nil {
		return nil, fmt.Errorf("airlock home %s: %w", opts.Home, err)
	}
	db, err := store.Open(filepath.Join(opts.Home, "state.db"), upgradeConfig)
	if err != nil {
		return nil, err
	}
	imgs, err := image.Open(opts.ImagesDir)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("image store %s: %w", opts.ImagesDir, err)
	}
	r := &Runtime{opts: opts, drv: drv, db: db, images: imgs, boxes: map[string]*Box{}, warned: map[string]bool{}}
	if err := r.reconcile(context.Background()); err != nil {
		db.Close()
		return nil, err
	}
	// Boxes whose TTL or lease ran out while no Runtime watched them.
	r.Reap(context.Background())
	// What a killed snapshot, import, export or commit left (disk copies
	// and memory images can be gigabytes); other processes' work stays.
	scratch.Sweep(filepath.Join(opts.Home, "tmp"))
	scratch.Sweep(r.snapshotsDir())
	if r.pool, err = newPools(r, opts); err != nil {
		db.Close()
		return nil, err
	}
	r.startPools()
	r.startReaper()
	return r, nil
}

// Home returns the runtime's home directory.
func (r *Runtime) Home() string { return r.opts.Home }

// storeErr wraps an error of the box store about box ref: not found
// becomes ErrBoxNotFound, anything else keeps its cause.
func (r *Runtime) storeErr(ref string, err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %q in %s", ErrBoxNotFound, ref, r.opts.Home)
	}
	return fmt.Errorf("box %s: read its record: %w", ref, err)
}

// observe marks rec stopped when it says running but its machine is gone,
// and returns the record as it now is (lifecycle.Observe).
func (r *Runtime) observe(ctx context.Context, rec *store.Box) (*store.Box, error) {
	return lifecycle.Observe(ctx, r.db, r.drv, filepath.Join(r.opts.Home, "boxes", rec.ID), rec, r.recordGone)
}

// reconcile marks boxes whose machine has gone as stopped, and removes
// AutoRemove boxes whose creator has gone.
func (r *Runtime) reconcile(ctx context.Context) error {
	recs, err := r.db.List(ctx)
	if err != nil {
		return fmt.Errorf("list boxes: %w", err)
	}
	for _, rec := range recs {
		cfg, err := decodeConfig(rec)
		o := vmm.Handle{PID: cfg.OwnerPID, Start: cfg.OwnerStart}
		if err == nil && cfg.Options.AutoRemove && o.PID != 0 && o.PID != os.Getpid() && !o.Alive() {
			// Its creator died without removing it.
			r.handle(rec, cfg).removeWhy(ctx, true, removedAuto)
			continue
		}
		// A box whose configuration cannot be read is still reconciled;
		// Get and Start say what is wrong with it.
		if _, err := r.observe(ctx, rec); err != nil {
			return err
		}
		if !running(rec) {
			// Its network helper stops, unless a Start holds the box's
			// lock (helper.Reconcile).
			helper.Reconcile(filepath.Join(r.opts.Home, "boxes", rec.ID))
		}
	}
	return nil
}

// Close releases the runtime's connections. Running boxes keep running
// (they are detached processes), except AutoRemove boxes, which are
// removed.
func (r *Runtime) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.stopReaper()
	r.stopPools() // no fill left running, no unclaimed box left
	r.mu.Lock()
	boxes := make([]*Box, 0, len(r.boxes))
	for _, b := range r.boxes {
		boxes = append(boxes, b)
	}
	r.mu.Unlock()
	for _, b := range boxes {
		b.Close()
	}
	r.keeper.Close() // what it still watches is of this runtime's pools
	r.late.Wait()
	return r.db.Close()
}

// beginLate starts a watcher's write after its machine ended, unless the
// runtime is closed (false: write nothing); endLate ends it. A write
// racing Close's own closed the store under it, and the store's files
// could come back while the caller removed the home.
func (r *Runtime) beginLate() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.late.Add(1)
	return true
}

func (r *Runtime) endLate() { r.late.Done() }

// BoxState is where a box is in its life (BoxInfo.State).
type BoxState string

// Box states.
const (
	// BoxCreated: made, never started.
	BoxCreated BoxState = "created"
	// BoxRunning: its VM runs (paused included: see Box.Paused).
	BoxRunning BoxState = "running"
	// BoxStopped: its VM ended (Stop, its main command's end, or a death:
	// BoxInfo.Exit says which).
	BoxStopped BoxState = "stopped"
)

// BootInfo describes what boxes of this runtime boot with.
type BootInfo struct {
	Accel       string // "kvm" or "tcg"
	AccelReason string // why not KVM, when TCG
	Kernel      string // path
	KernelKind  string // "airlock", "debian" or "custom"
	KernelVer   string
	ConfigHash  string
	// Initrd is the initramfs the kernel unpacks (kernels that load
	// modules); AgentDisk the erofs image the airlock kernel mounts as its
	// root instead. One of them is set.
	Initrd, AgentDisk string
	// THP is where QEMU may use transparent huge pages (AIRLOCK_THP): "on"
	// (guest RAM and TCG's code buffer), "code" (the code buffer only;
	// guest RAM in a memfd on 4 KiB pages) or "off" (nowhere; guest RAM in
	// a memfd).
	THP string
}

// BootInfo resolves and reports the accelerator, kernel and initramfs or
// agent disk.
func (r *Runtime) BootInfo() (BootInfo, error) {
	br, ok := r.drv.(vmm.BootReporter)
	if !ok {
		return BootInfo{}, fmt.Errorf("boot info: %w", vmm.ErrNotSupported)
	}
	b, err := br.BootInfo()
	if err != nil {
		return BootInfo{}, err
	}
	return BootInfo{Accel: b.Accel, AccelReason: b.AccelReason, Kernel: b.Kernel, KernelKind: b.KernelKind,
		KernelVer: b.KernelVer, ConfigHash: b.KernelConfigHash, Initrd: b.Initrd, AgentDisk: b.AgentDisk, THP: b.THP}, nil
}

func newID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// resolveImage finds ref locally, or pulls it.
func (r *Runtime) resolveImage(ctx context.Context, ref string) (*image.Image, error) {
	img, err := r.images.Resolve(ref)
	if err == nil {
		return img, nil
	}
	if !errors.Is(err, image.ErrNotFound) {
		return nil, err
	}
	return r.pull(ctx, ref, r.opts.Pull)
}

// Create creates a box from opts and starts it: when Create returns, the
// box's VM has booted and its agent answers, so Exec can be called at once.
// With a warm pool of the same options (Options.Pool) that has a box
// ready, Create takes that box instead (Box.FromPool). The box keeps
// running after this process exits, until Stop or Remove.
// Errors: ErrNameInUse, ErrImageNotFound, boot failures (with the console
// log's tail); on error nothing is left behind.
func (r *Runtime) Create(ctx context.Context, opts BoxOptions) (*Box, error) {
	if err := checkLife(opts); err != nil {
		return nil, err
	}
	var b *Box
	var err error
	if opts.FromSnapshot != "" {
		b, err = r.restore(ctx, opts, "")
	} else if b, err = r.claimPooled(ctx, opts); b == nil && err == nil {
		b, err = r.create(ctx, opts, "")
	}
	if err == nil && b != nil {
		// A boot can take longer than a short lease or idle timeout:
		// those count from when the caller gets the box.
		b.lifeBegins(ctx)
	}
	return b, err
}

// create is Create booting a new box; forPool is the key of the warm pool
// it is made for ("" for the caller's box: boxConfig.Pool).
func (r *Runtime) create(ctx context.Context, opts BoxOptions, forPool string) (*Box, error) {
	b, err := r.newBox(ctx, opts, forPool)
	if err != nil {
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		b.removeWhy(context.WithoutCancel(ctx), true, removedStartFailed)
		return nil, err
	}
	return b, nil
}

// newBox records a box (for warm pool forPool, if not "") and prepares
// its directory, without booting it.
func (r *Runtime) newBox(ctx context.Context, opts BoxOptions, forPool string) (*Box, error) {
	opts, err := withDefaults(opts)
	if err != nil {
		if !errors.Is(err, ErrInvalidArgument) {
			err = fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
		return nil, err
	}
	if err := r.checkMemoryCap(opts.MemoryMiB); err != nil {
		return nil, err
	}
	img, err := r.resolveImage(ctx, opts.Image)
	if err != nil {
		return nil, err
	}
	return r.recordBox(ctx, opts, forPool, img, nil)
}

// recordBox records a box of img and prepares its directory: with the
// driver's Create, or with prepare when it is set (a restore). forPool is
// the key of the warm pool the box is made for, "" for a caller's box
// (boxConfig.Pool).
func (r *Runtime) recordBox(ctx context.Context, opts BoxOptions, forPool string, img *image.Image, prepare func(context.Context, vmm.Spec) error) (*Box, error) {
	if err := checkBoxName(opts.Name); err != nil {
		return nil, err
	}
	m, err := boxopts.New(opts.plain(), img.Config, forPool, time.Now(), bootTimeout)
	if err != nil {
		return nil, err
	}
	bc := boxConfig{Options: opts, Meta: m}
	if opts.AutoRemove {
		bc.OwnerPID = os.Getpid()
		bc.OwnerStart = vmm.StartTime(bc.OwnerPID)
	}
	rec := &store.Box{ID: newID(), Name: opts.Name, Image: opts.Image, ImageDigest: img.Digest,
		Config: encodeConfig(bc), State: store.StateCreated, Created: time.Now()}
	if err := r.db.Insert(ctx, rec); err != nil {
		if errors.Is(err, store.ErrNameInUse) {
			return nil, fmt.Errorf("%w: %q (remove it, or pick another name)", ErrNameInUse, opts.Name)
		}
		return nil, fmt.Errorf("record box: %w", err)
	}
	b := r.handle(rec, bc)
	err = b.create(ctx, img, prepare)
	if err == nil {
		err = b.writeSecrets(opts.Secrets)
	}
	if err != nil {
		b.remove(context.WithoutCancel(ctx), true)
		return nil, err
	}
	b.emit(Event{Type: EventBoxCreated})
	return b, nil
}

// handle returns the live handle for a record, making one if needed.
func (r *Runtime) handle(rec *store.Box, cfg boxConfig) *Box {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b, ok := r.boxes[rec.ID]; ok {
		return b
	}
	b := newBox(r, rec, cfg)
	r.boxes[rec.ID] = b
	return b
}

func (r *Runtime) forget(id string) {
	r.mu.Lock()
	delete(r.boxes, id)
	r.mu.Unlock()
}

// Get returns the box with that id, unique id prefix, or name.
// Errors: ErrBoxNotFound; a store error, wrapped with the reference.
func (r *Runtime) Get(ctx context.Context, idOrName string) (*Box, error) {
	rec, err := r.db.Get(ctx, idOrName)
	if err != nil {
		return nil, r.storeErr(idOrName, err)
	}
	if rec, err = r.observe(ctx, rec); err != nil {
		return nil, err
	}
	cfg, err := decodeConfig(rec)
	if err != nil {
		return nil, err
	}
	if cfg.Pool != "" {
		// A warm pool's box is nobody's until Create takes it.
		return nil, r.storeErr(idOrName, store.ErrNotFound)
	}
	b := r.handle(rec, cfg)
	if err := b.refresh(rec); err != nil {
		return nil, err
	}
	return b, nil
}

// BoxInfo is a snapshot of a box's record.
type BoxInfo struct {
	ID          string
	Name        string
	Image       string
	ImageDigest string
	State       BoxState
	PID         int // QEMU pid while running
	Created     time.Time
	Started     time.Time
	Options     BoxOptions
	// Ports are the published ports as bound by the box's current start,
	// or for a suspended box by the start it was suspended in, which its
	// resume binds again (nil when it is not running nor suspended;
	// Options.Ports holds what was asked).
	Ports []PortMapping
	// Suspended says the stopped box was paused to disk (Box.Suspend):
	// Start or Resume continue it from its saved memory.
	Suspended bool
	// DiskBytes is what the box's writable layer takes on the host's
	// disk now (its allocated blocks: it grows towards
	// Options.DiskSizeMiB as the box writes).
	DiskBytes int64
	// ExpiresAt is when the box's TTL ends (zero: no TTL); LeaseUntil when
	// its lease runs out unless renewed (zero: no lease); IdleDeadline
	// when it is removed unless used before (zero: no idle timeout; the
	// use it counts from is recorded every few seconds).
	ExpiresAt, LeaseUntil, IdleDeadline time.Time
	// Exit says how the box's last boot ended; nil while it runs, when it
	// never ran, or when no end was recorded.
	Exit *ExitState
}

// List returns every box of this home, oldest first.
func (r *Runtime) List(ctx context.Context) ([]BoxInfo, error) {
	if err := r.reconcile(ctx); err != nil {
		return nil, err
	}
	recs, err := r.db.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list boxes: %w", err)
	}
	out := make([]BoxInfo, 0, len(recs))
	for _, rec := range recs {
		// A box whose configuration cannot be read is listed with zero
		// Options (Get and Start say why; Remove still works).
		cfg, _ := decodeConfig(rec)
		if cfg.Pool != "" {
			continue // a warm pool's box, nobody's yet
		}
		out = append(out, r.infoOf(rec, cfg))
	}
	return out, nil
}

// infoOf is what the box of rec and cfg is now: its record, and what its
// box directory says (bound ports, saved state, how its boot ended, disk
// use).
func (r *Runtime) infoOf(rec *store.Box, cfg boxConfig) BoxInfo {
	info := BoxInfo{ID: rec.ID, Name: rec.Name, Image: rec.Image, ImageDigest: rec.ImageDigest, State: BoxState(rec.State),
		PID: rec.PID, Created: rec.Created, Started: rec.Started, Options: cfg.Options,
		ExpiresAt: cfg.ExpiresAt, LeaseUntil: cfg.LeaseUntil, IdleDeadline: lifetime.IdleDeadline(cfg.Options.IdleTimeout, cfg.LastUse)}
	dir := filepath.Join(r.opts.Home, "boxes", rec.ID)
	if info.State == store.StateRunning {
		info.Ports = readPorts(dir)
	} else {
		info.Suspended = boxdir.SuspendedIn(dir) != ""
		if info.Suspended {
			info.Ports = readPorts(dir)
		}
		info.Exit = r.exitOf(info)
	}
	info.DiskBytes = sparse.Allocated(filepath.Join(dir, boxdir.RW))
	return info
}

// Remove deletes a box: its VM, writable layer and record. A running box
// is refused with ErrBoxRunning unless force is set, which kills its VM.
// A box whose record cannot be read can still be removed.
func (r *Runtime) Remove(ctx context.Context, idOrName string, force bool) error {
	return r.removeWhy(ctx, idOrName, force, removedByCaller)
}

// removeWhy is Remove with the box.removed event's reason.
func (r *Runtime) removeWhy(ctx context.Context, idOrName string, force bool, why string) error {
	b, err := r.Get(ctx, idOrName)
	if errors.Is(err, errBadRecord) {
		rec, gerr := r.db.Get(ctx, idOrName)
		if gerr != nil {
			return r.storeErr(idOrName, gerr)
		}
		return r.handle(rec, boxConfig{}).removeWhy(ctx, force, why)
	}
	if err != nil {
		return err
	}
	return b.removeWhy(ctx, force, why)
}

// ImageInUse returns the ids of boxes that use the image with that
// manifest digest ("sha256:...").
func (r *Runtime) ImageInUse(ctx context.Context, digest string) ([]string, error) {
	ids, err := r.db.ImageInUse(ctx, digest)
	if err != nil {
		return nil, fmt.Errorf("boxes using image %s: %w", digest, err)
	}
	return ids, nil
}
