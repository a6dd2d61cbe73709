package airlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/image"
	"github.com/airlock-run/airlock/internal/store"
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
	// Warn receives one-line warnings for the user (TCG in use, kernel
	// fallback). Default: written to os.Stderr. Each is sent once per
	// Runtime.
	Warn func(msg string)
	// Pull, when set, is used to fetch images missing from the store
	// (default: pull from the registry with no progress display).
	Pull func(ctx context.Context, s *image.Store, ref string) (*image.Image, error)
}

// Runtime creates and manages boxes under one home directory. It is safe
// for concurrent use. Several processes may open the same home.
type Runtime struct {
	opts   Options
	db     *store.DB
	images *image.Store

	mu     sync.Mutex
	boxes  map[string]*Box // live handles, by id
	warned map[string]bool
	boot   *bootAssets
	closed bool
}

type bootAssets struct {
	accel  qemu.AccelChoice
	kernel assets.Kernel
	// Exactly one of initrd (kernels that load modules) and agentDisk (the
	// airlock kernel: the agent's erofs disk is the root filesystem) is set.
	initrd, agentDisk string
	agent             string // the agent binary both are built from
	// thp is where QEMU may use transparent huge pages (see thpMode).
	thp qemu.THPMode
	// agentDiskIO is the optimal I/O size the agent disk advertises:
	// half its size, so that the guest's readahead covers all of it.
	agentDiskIO int
	// kernelSpan is where the kernel loads (THPCode's RAM layout), read
	// once from its ELF headers rather than at every box start.
	kernelSpan qemu.PhysRange
}

// readaheadFor returns the optimal I/O size (bytes, whole MiB) that makes
// Linux's readahead (twice the optimal I/O size) cover a disk of size bytes.
func readaheadFor(size int64) int {
	const mib = 1 << 20
	return int(((size+1)/2 + mib - 1) / mib * mib)
}

// DefaultHome returns $AIRLOCK_HOME, else ~/.airlock.
func DefaultHome() string {
	if h := os.Getenv("AIRLOCK_HOME"); h != "" {
		return h
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "airlock")
	}
	return filepath.Join(home, ".airlock")
}

// Open opens (creating if needed) the runtime home and reconciles box
// records with reality: a box recorded as running whose QEMU is gone is
// marked stopped.
func Open(opts Options) (*Runtime, error) {
	if opts.Home == "" {
		opts.Home = DefaultHome()
	}
	if opts.ImagesDir == "" {
		opts.ImagesDir = os.Getenv("AIRLOCK_IMAGES")
	}
	if opts.ImagesDir == "" {
		opts.ImagesDir = filepath.Join(opts.Home, "images")
	}
	if opts.CacheDir == "" {
		opts.CacheDir = assets.CacheDir()
	}
	if opts.Accel == "" {
		opts.Accel = os.Getenv("AIRLOCK_ACCEL")
	}
	if opts.Warn == nil {
		opts.Warn = func(msg string) { fmt.Fprintln(os.Stderr, msg) }
	}
	if err := os.MkdirAll(filepath.Join(opts.Home, "boxes"), 0o700); err != nil {
		return nil, fmt.Errorf("airlock home %s: %w", opts.Home, err)
	}
	db, err := store.Open(filepath.Join(opts.Home, "state.db"))
	if err != nil {
		return nil, err
	}
	imgs, err := image.Open(opts.ImagesDir)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("image store %s: %w", opts.ImagesDir, err)
	}
	r := &Runtime{opts: opts, db: db, images: imgs, boxes: map[string]*Box{}, warned: map[string]bool{}}
	if err := r.reconcile(context.Background()); err != nil {
		db.Close()
		return nil, err
	}
	return r, nil
}

// Images returns the runtime's image store.
func (r *Runtime) Images() *image.Store { return r.images }

// Home returns the runtime's home directory.
func (r *Runtime) Home() string { return r.opts.Home }

func (r *Runtime) warn(msg string) {
	r.mu.Lock()
	seen := r.warned[msg]
	r.warned[msg] = true
	r.mu.Unlock()
	if !seen && msg != "" {
		r.opts.Warn(msg)
	}
}

// reconcile marks boxes whose QEMU has gone as stopped.
func (r *Runtime) reconcile(ctx context.Context) error {
	recs, err := r.db.List(ctx)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		var cfg boxConfig
		json.Unmarshal(rec.Config, &cfg)
		if cfg.Options.AutoRemove && cfg.OwnerPID != 0 && cfg.OwnerPID != os.Getpid() && !qemu.Alive(cfg.OwnerPID, cfg.OwnerStart) {
			// Its creator died without removing it.
			r.handle(rec).remove(ctx, true)
			continue
		}
		if rec.State == store.StateRunning && !qemu.Alive(rec.PID, rec.PIDStart) {
			if err := r.db.SetStopped(ctx, rec.ID); err != nil {
				return err
			}
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
	boxes := make([]*Box, 0, len(r.boxes))
	for _, b := range r.boxes {
		boxes = append(boxes, b)
	}
	r.mu.Unlock()
	for _, b := range boxes {
		b.Close()
	}
	return r.db.Close()
}

// bootAssets resolves accelerator, kernel and initramfs or agent disk once
// per Runtime.
func (r *Runtime) bootAssets() (*bootAssets, error) {
	r.mu.Lock()
	if r.boot != nil {
		defer r.mu.Unlock()
		return r.boot, nil
	}
	r.mu.Unlock()
	accel, err := qemu.ProbeAccel(r.opts.Accel)
	if err != nil {
		return nil, err
	}
	var k assets.Kernel
	var note string
	if r.opts.Kernel != "" {
		k = assets.KernelAt(r.opts.Kernel)
	} else if k, note, err = assets.FindKernel(r.opts.CacheDir); err != nil {
		return nil, err
	}
	agent := r.opts.AgentPath
	if agent == "" {
		if agent, err = assets.FindAgent(); err != nil {
			return nil, err
		}
	}
	if err := assets.CheckAgent(agent); err != nil {
		return nil, err
	}
	thp, err := thpMode(accel.Accel, k.Kind)
	if err != nil {
		return nil, err
	}
	var initrd, agentDisk string
	if k.Kind == assets.KernelAirlock {
		agentDisk, err = assets.AgentDisk(context.Background(), r.opts.CacheDir, agent)
	} else {
		initrd, err = assets.Initrd(r.opts.CacheDir, agent, k)
	}
	if err != nil {
		return nil, err
	}
	if accel.Accel == qemu.AccelTCG {
		r.warn(qemu.TCGWarning + " (" + accel.Reason + ")")
	}
	r.warn(note)
	b := &bootAssets{accel: accel, kernel: k, initrd: initrd, agentDisk: agentDisk, agent: agent, thp: thp}
	if thp == qemu.THPCode {
		b.kernelSpan = qemu.KernelSpan(k.Path)
	}
	if fi, err := os.Stat(agentDisk); err == nil && agentDisk != "" {
		b.agentDiskIO = readaheadFor(fi.Size())
	}
	r.mu.Lock()
	r.boot = b
	r.mu.Unlock()
	return b, nil
}

// thpMode says where QEMU may use transparent huge pages (see
// qemu.THPMode): $AIRLOCK_THP=on|code|off decides. By default, "code" for
// the airlock kernel under TCG: its boxes touch little of their RAM, so
// huge pages for all of it would cost ~25 MiB of host memory per box, while
// huge pages for TCG's code buffer and for the parts of RAM the guest fills
// whole (kernel image, top of RAM) save ~17k page faults for free; "on" for
// other kernels, which touch more of their memory and boot much slower
// without them, and under KVM, where they also speed up the guest.
func thpMode(accel, kernelKind string) (qemu.THPMode, error) {
	switch v := os.Getenv("AIRLOCK_THP"); v {
	case "on":
		return qemu.THPAll, nil
	case "code":
		return qemu.THPCode, nil
	case "off":
		return qemu.THPNone, nil
	case "":
		if accel == qemu.AccelTCG && kernelKind == assets.KernelAirlock {
			return qemu.THPCode, nil
		}
		return qemu.THPAll, nil
	default:
		return 0, fmt.Errorf("AIRLOCK_THP=%q: want on, code or off (or unset for the default)", v)
	}
}

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
	// (guest RAM and TCG's code buffer), "code" (the code buffer, and of
	// guest RAM only the kernel image and the top) or "off".
	THP string
}

// BootInfo resolves and reports the accelerator, kernel and initramfs or
// agent disk.
func (r *Runtime) BootInfo() (BootInfo, error) {
	b, err := r.bootAssets()
	if err != nil {
		return BootInfo{}, err
	}
	return BootInfo{Accel: b.accel.Accel, AccelReason: b.accel.Reason, Kernel: b.kernel.Path,
		KernelKind: b.kernel.Kind, KernelVer: b.kernel.Version, ConfigHash: b.kernel.ConfigHash, Initrd: b.initrd, AgentDisk: b.agentDisk, THP: b.thp.String()}, nil
}

func newID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// boxConfig is what is stored for a box: its options and the image config
// resolved at creation.
type boxConfig struct {
	Options BoxOptions        `json:"options"`
	Image   image.ImageConfig `json:"image"`
	// Owner identifies the process that created an AutoRemove box: when it
	// is gone, the next Open removes the box, so that a crashed or killed
	// program leaves no VM behind.
	OwnerPID   int    `json:"owner_pid,omitempty"`
	OwnerStart uint64 `json:"owner_start,omitempty"`
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
	if r.opts.Pull != nil {
		img, err = r.opts.Pull(ctx, r.images, ref)
	} else {
		img, err = r.images.Pull(ctx, ref, image.PullOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrImageNotFound, err)
	}
	return img, nil
}

// Create creates a box from opts and starts it: when Create returns, the
// box's VM has booted and its agent answers, so Exec can be called at once.
// The box keeps running after this process exits, until Stop or Remove.
// Errors: ErrNameInUse, ErrImageNotFound, boot failures (with the console
// log's tail); on error nothing is left behind.
func (r *Runtime) Create(ctx context.Context, opts BoxOptions) (*Box, error) {
	b, err := r.newBox(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		b.remove(context.WithoutCancel(ctx), true)
		return nil, err
	}
	return b, nil
}

// withDefaults fills in and checks BoxOptions.
func withDefaults(opts BoxOptions) (BoxOptions, error) {
	if opts.Image == "" {
		opts.Image = DefaultImage
	}
	if opts.CPUs == 0 {
		opts.CPUs = DefaultCPUs
	}
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = DefaultMemoryMiB
	}
	if opts.DiskSizeMiB == 0 {
		opts.DiskSizeMiB = DefaultDiskSizeMiB
	}
	switch opts.Network {
	case "":
		opts.Network = NetworkEnabled
	case NetworkEnabled, NetworkDisabled:
	default:
		return opts, fmt.Errorf("network %q: want %q or %q", opts.Network, NetworkEnabled, NetworkDisabled)
	}
	if opts.CPUs < 0 || opts.CPUs > 64 {
		return opts, fmt.Errorf("cpus %d: want 1..64", opts.CPUs)
	}
	if opts.MemoryMiB < 64 {
		return opts, fmt.Errorf("memory %d MiB: want at least 64", opts.MemoryMiB)
	}
	if opts.DiskSizeMiB < 16 {
		return opts, fmt.Errorf("disk size %d MiB: want at least 16", opts.DiskSizeMiB)
	}
	return opts, nil
}

// newBox records a box and prepares its directory, without booting it.
func (r *Runtime) newBox(ctx context.Context, opts BoxOptions) (*Box, error) {
	opts, err := withDefaults(opts)
	if err != nil {
		return nil, err
	}
	if err := checkMemoryCap(opts.MemoryMiB); err != nil {
		return nil, err
	}
	if _, err := r.bootAssets(); err != nil {
		return nil, err
	}
	img, err := r.resolveImage(ctx, opts.Image)
	if err != nil {
		return nil, err
	}
	bc := boxConfig{Options: opts, Image: img.Config}
	if opts.AutoRemove {
		bc.OwnerPID = os.Getpid()
		bc.OwnerStart = qemu.StartTime(bc.OwnerPID)
	}
	cfg, _ := json.Marshal(bc)
	rec := &store.Box{ID: newID(), Name: opts.Name, Image: opts.Image, ImageDigest: img.Digest,
		Config: cfg, State: store.StateCreated, Created: time.Now()}
	if err := r.db.Insert(ctx, rec); err != nil {
		if errors.Is(err, store.ErrNameInUse) {
			return nil, fmt.Errorf("%w: %q (remove it, or pick another name)", ErrNameInUse, opts.Name)
		}
		return nil, err
	}
	b := r.handle(rec)
	if err := b.create(ctx, img); err != nil {
		b.remove(context.WithoutCancel(ctx), true)
		return nil, err
	}
	return b, nil
}

// handle returns the live handle for a record, making one if needed.
func (r *Runtime) handle(rec *store.Box) *Box {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b, ok := r.boxes[rec.ID]; ok {
		return b
	}
	b := newBox(r, rec)
	r.boxes[rec.ID] = b
	return b
}

func (r *Runtime) forget(id string) {
	r.mu.Lock()
	delete(r.boxes, id)
	r.mu.Unlock()
}

// Get returns the box with that id, unique id prefix, or name.
func (r *Runtime) Get(ctx context.Context, idOrName string) (*Box, error) {
	rec, err := r.db.Get(ctx, idOrName)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("%w: %q (see 'airlock ls' for the boxes of %s)", ErrBoxNotFound, idOrName, r.opts.Home)
		}
		return nil, err
	}
	if rec.State == store.StateRunning && !qemu.Alive(rec.PID, rec.PIDStart) {
		r.db.SetStopped(ctx, rec.ID)
		rec.State = store.StateStopped
	}
	b := r.handle(rec)
	b.refresh(rec)
	return b, nil
}

// BoxInfo is a snapshot of a box's record.
type BoxInfo struct {
	ID          string
	Name        string
	Image       string
	ImageDigest string
	State       string // "created", "running" or "stopped"
	PID         int    // QEMU pid while running
	Created     time.Time
	Started     time.Time
	Options     BoxOptions
}

// List returns every box of this home, oldest first.
func (r *Runtime) List(ctx context.Context) ([]BoxInfo, error) {
	if err := r.reconcile(ctx); err != nil {
		return nil, err
	}
	recs, err := r.db.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]BoxInfo, 0, len(recs))
	for _, rec := range recs {
		out = append(out, infoOf(rec))
	}
	return out, nil
}

func infoOf(rec *store.Box) BoxInfo {
	var cfg boxConfig
	json.Unmarshal(rec.Config, &cfg)
	return BoxInfo{ID: rec.ID, Name: rec.Name, Image: rec.Image, ImageDigest: rec.ImageDigest, State: rec.State,
		PID: rec.PID, Created: rec.Created, Started: rec.Started, Options: cfg.Options}
}

// Remove deletes a box: its VM, writable layer and record. A running box
// is refused with ErrBoxRunning unless force is set, which kills its VM.
func (r *Runtime) Remove(ctx context.Context, idOrName string, force bool) error {
	b, err := r.Get(ctx, idOrName)
	if err != nil {
		return err
	}
	return b.remove(ctx, force)
}

// ImageInUse returns the ids of boxes that use the image digest.
func (r *Runtime) ImageInUse(ctx context.Context, digest string) ([]string, error) {
	return r.db.ImageInUse(ctx, digest)
}

// consoleTail returns the last n lines of a console log.
func consoleTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, _ := f.Stat()
	off := int64(0)
	if st != nil && st.Size() > 16<<10 {
		off = st.Size() - 16<<10
	}
	f.Seek(off, io.SeekStart)
	b, _ := io.ReadAll(f)
	lines := splitLines(EscapeConsole(string(b)))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := ""
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			if l := trimCR(s[start:i]); l != "" {
				out = append(out, l)
			}
			start = i + 1
		}
	}
	if l := trimCR(s[start:]); l != "" {
		out = append(out, l)
	}
	return out
}

func trimCR(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\r' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}
