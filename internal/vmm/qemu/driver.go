package qemu

import (
	"context"
	"crypto/rand"
	"encoding/binary"
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
	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/guestabi"
	"github.com/airlock-run/airlock/internal/vmm"
)

// vsockPort is the AF_VSOCK port the agent listens on in the guest.
const vsockPort = 1024

// agentPorts is how many virtio-serial ports the agent serves. Each takes
// one host connection at a time (held under the flock boxdir.AgentLock(i)),
// so up to this many processes can talk to one box at once.
const agentPorts = 4

// Options configure the QEMU driver. Zero values probe or take defaults.
type Options struct {
	Accel     string // "kvm", "tcg", "auto" or "" (probe)
	Kernel    string // vmlinux to boot; "" finds one in CacheDir (assets.FindKernel)
	AgentPath string // static guest agent; "" finds one (assets.FindAgent)
	CacheDir  string // kernels, initramfs images, agent disks, root filesystem bases
	// THP is "on", "code", "off" or "" (the default for the kernel and
	// accelerator; see THPFor).
	THP   string
	Debug bool // verbose guest kernel and agent boot logs
	// Warn receives one-line warnings for the user, plain text (each once
	// per driver): too many vCPUs under TCG, all agent ports busy. What
	// to say once a box has booted is in BootInfo.Warnings instead.
	Warn func(msg string)
	// Jail says how box QEMUs are confined (docs/confinement.md).
	Jail JailOptions
	// VolumeTransport is how host directories are shared: Transport9p
	// (or "") or TransportVirtioFS.
	VolumeTransport string
	// Virtiofsd is the virtiofsd binary for virtio-fs volumes; "" looks
	// in /usr/lib/qemu, /usr/libexec, then PATH.
	Virtiofsd string
}

// Driver boots boxes as QEMU microVMs. The accelerator, kernel and
// initramfs or agent disk are resolved once, at the first Create or Start.
type Driver struct {
	o Options

	mu     sync.Mutex
	boot   *bootAssets
	warned map[string]bool
}

var _ vmm.Driver = (*Driver)(nil)
var _ vmm.BootReporter = (*Driver)(nil)
var _ vmm.DiskBooter = (*Driver)(nil)

// New returns a QEMU driver.
func New(o Options) *Driver {
	if o.Warn == nil {
		o.Warn = func(string) {}
	}
	return &Driver{o: o, warned: map[string]bool{}}
}

// Name returns "qemu".
func (d *Driver) Name() string { return "qemu" }

func (d *Driver) warn(msg string) {
	d.mu.Lock()
	seen := d.warned[msg]
	d.warned[msg] = true
	d.mu.Unlock()
	if !seen && msg != "" {
		d.o.Warn(msg)
	}
}

type bootAssets struct {
	accel  AccelChoice
	kernel assets.Kernel
	// Exactly one of initrd (kernels that load modules) and agentDisk (the
	// airlock kernel: the agent's erofs disk is the root filesystem) is set.
	initrd, agentDisk string
	agent             string // the agent binary both are built from
	// thp is where QEMU may use transparent huge pages (see THPFor).
	thp THPMode
	// agentDiskIO is the optimal I/O size the agent disk advertises:
	// half its size, so that the guest's readahead covers all of it.
	agentDiskIO int
	// warnings are for the user once a box has booted (BootInfo.Warnings).
	warnings []string
}

// readaheadFor returns the optimal I/O size (bytes, whole MiB) that makes
// Linux's readahead (twice the optimal I/O size) cover a disk of size bytes.
func readaheadFor(size int64) int {
	const mib = 1 << 20
	return int(((size+1)/2 + mib - 1) / mib * mib)
}

// THPFor says where QEMU may use transparent huge pages: mode "on", "code"
// or "off" decides; "" takes the default: "off" for the airlock kernel
// under TCG (its boxes touch little of their RAM, so huge pages for all of
// it would cost ~25 MiB of host memory per box, and hosts without usable
// KVM are mostly VMs, where a huge page's first touch can cost more than
// the 512 faults it saves: see THPMode); "on" for other kernels, which
// touch more of their memory and boot much slower without them, and under
// KVM, where they also speed up the guest.
func THPFor(mode, accel, kernelKind string) (THPMode, error) {
	switch mode {
	case "on":
		return THPAll, nil
	case "code":
		return THPCode, nil
	case "off":
		return THPNone, nil
	case "":
		if accel == AccelTCG && kernelKind == assets.KernelAirlock {
			return THPNone, nil
		}
		return THPAll, nil
	}
	return 0, fmt.Errorf("THP mode %q (Options.THP, or AIRLOCK_THP): want on, code or off (or unset for the default)", mode)
}

// assets resolves accelerator, kernel and initramfs or agent disk once.
func (d *Driver) assets() (*bootAssets, error) {
	d.mu.Lock()
	if d.boot != nil {
		defer d.mu.Unlock()
		return d.boot, nil
	}
	d.mu.Unlock()
	accel, err := ProbeAccel(d.o.Accel)
	if err != nil {
		return nil, err
	}
	var k assets.Kernel
	var note string
	if d.o.Kernel != "" {
		k = assets.KernelAt(d.o.Kernel)
	} else if k, note, err = assets.FindKernel(d.o.CacheDir); err != nil {
		return nil, err
	}
	agent := d.o.AgentPath
	if agent == "" {
		if agent, err = assets.FindAgent(); err != nil {
			return nil, err
		}
	}
	if err := assets.CheckAgent(agent); err != nil {
		return nil, err
	}
	thp, err := THPFor(d.o.THP, accel.Accel, k.Kind)
	if err != nil {
		return nil, err
	}
	var initrd, agentDisk string
	if k.Kind == assets.KernelAirlock {
		agentDisk, err = assets.AgentDisk(context.Background(), d.o.CacheDir, agent)
	} else {
		initrd, err = assets.Initrd(d.o.CacheDir, agent, k)
	}
	if err != nil {
		return nil, err
	}
	b := &bootAssets{accel: accel, kernel: k, initrd: initrd, agentDisk: agentDisk, agent: agent, thp: thp}
	if note != "" {
		b.warnings = append(b.warnings, note)
	}
	if accel.Accel == AccelTCG && !accel.Forced {
		b.warnings = append(b.warnings, TCGWarning)
	}
	if fi, err := os.Stat(agentDisk); err == nil && agentDisk != "" {
		b.agentDiskIO = readaheadFor(fi.Size())
	}
	d.mu.Lock()
	d.boot = b
	d.mu.Unlock()
	return b, nil
}

// BootInfo resolves and reports the accelerator, kernel and initramfs or
// agent disk.
func (d *Driver) BootInfo() (vmm.BootInfo, error) {
	b, err := d.assets()
	if err != nil {
		return vmm.BootInfo{}, err
	}
	return vmm.BootInfo{Accel: b.accel.Accel, AccelReason: b.accel.Reason, Kernel: b.kernel.Path,
		KernelKind: b.kernel.Kind, KernelVer: b.kernel.Version, KernelConfigHash: b.kernel.ConfigHash,
		Initrd: b.initrd, AgentDisk: b.agentDisk, THP: b.thp.String(), Warnings: b.warnings}, nil
}

// BootsFromDisks reports true: a box boots from its image's root
// filesystem base and its writable layer (vmm.Spec.Disks).
func (d *Driver) BootsFromDisks() bool { return true }

// Create resolves the boot assets and checks that the box's disks
// (spec.Disks, made by the caller) are there.
func (d *Driver) Create(ctx context.Context, spec vmm.Spec) error {
	if _, err := d.assets(); err != nil {
		return err
	}
	return checkDisks(spec, true)
}

// checkDisks checks that spec names its root filesystem disks, and with
// layer that the writable layer exists (the base is checked where it is
// opened: by QEMU, or by a restore's check of its boot files).
func checkDisks(spec vmm.Spec, layer bool) error {
	if spec.Disks.Base == "" || spec.Disks.Layer == "" {
		return fmt.Errorf("box %s: the machine spec names no root filesystem disks (vmm.Spec.Disks)", spec.ID)
	}
	if layer {
		if _, err := os.Stat(spec.Disks.Layer); err != nil {
			return fmt.Errorf("box %s: writable layer: %w", spec.ID, err)
		}
	}
	return nil
}

// Start launches QEMU for spec, detached (it outlives this process).
func (d *Driver) Start(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	boot, err := d.assets()
	if err != nil {
		return nil, err
	}
	// Another process may have pruned the agent disk or initramfs since
	// this driver looked: build it again (same content, same path).
	if boot.agentDisk != "" {
		if _, err := os.Stat(boot.agentDisk); err != nil {
			if _, err := assets.AgentDisk(ctx, d.o.CacheDir, boot.agent); err != nil {
				return nil, err
			}
		}
	}
	if boot.initrd != "" {
		if _, err := os.Stat(boot.initrd); err != nil {
			if _, err := assets.Initrd(d.o.CacheDir, boot.agent, boot.kernel); err != nil {
				return nil, err
			}
		}
	}
	if err := checkDisks(spec, false); err != nil {
		return nil, err
	}
	base := spec.Disks.Base
	transport, err := CheckTransport(d.o.VolumeTransport)
	if err != nil {
		return nil, err
	}
	if err := checkVolumes(spec.Volumes, boot.kernel, transport); err != nil {
		return nil, err
	}
	var cid uint32
	if VsockAvailable() {
		cid = randomCID()
	}
	if n := runtime.NumCPU(); boot.accel.Accel == AccelTCG && spec.CPUs > n {
		d.warn(fmt.Sprintf("box %s has %d vCPUs but this host has %d CPUs: under TCG each vCPU is a host thread, so more vCPUs than host CPUs make the box slower, not faster", spec.ID, spec.CPUs, n))
	}
	socks := []string{boxdir.QMP}
	for i := 0; i < agentPorts; i++ {
		socks = append(socks, boxdir.AgentSock(i))
	}
	socks = append(socks, shareSocks(spec, transport)...)
	if err := boxdir.PrepareSockDir(spec.Dir, spec.ID, socks...); err != nil {
		return nil, err
	}
	qc := d.config(spec, boot, base, cid)
	if err := d.confine(spec, &qc); err != nil {
		return nil, err
	}
	for _, f := range append(qc.AgentSockets, qc.QMPSocket, qc.PIDFile, filepath.Join(spec.Dir, boxdir.CID)) {
		os.Remove(f)
	}
	os.WriteFile(qc.ConsoleLog, nil, 0o600)
	// The network stack (spec.Net) dials qc.NetSocket until QEMU listens
	// on it. (A retry below after a vsock CID clash, one in 2^31, would
	// leave a stack that connected to the failed QEMU without a peer.)
	// virtio-fs shares: their daemons listen before QEMU connects (and
	// end when it does), so each try starts them anew, in a cgroup of
	// their own when QEMU gets one.
	shares := specShares(spec, transport)
	launch := func(qc Config) (int, error) {
		g := d.shareCgroup(spec, qc, len(shares))
		if err := startShares(ctx, d.o.Virtiofsd, shares, g); err != nil {
			releaseShares(spec.Dir)
			return 0, err
		}
		pid, err := Launch(ctx, qc)
		if err != nil {
			releaseShares(spec.Dir)
		}
		return pid, err
	}
	pid, err := launch(qc)
	for try := 0; try < 5 && IsCIDInUse(err); try++ {
		qc = d.config(spec, boot, base, randomCID())
		if err = d.confine(spec, &qc); err == nil {
			pid, err = launch(qc)
		}
	}
	if err != nil {
		release(spec.Dir)
		return nil, err
	}
	if qc.VsockCID != 0 {
		os.WriteFile(filepath.Join(spec.Dir, boxdir.CID), []byte(strconv.FormatUint(uint64(qc.VsockCID), 10)), 0o600)
	}
	return d.Attach(spec, vmm.Handle{PID: pid, Start: vmm.StartTime(pid)}), nil
}

// config is the QEMU configuration of spec's box for one boot. cid, when
// non-zero, adds a vhost-vsock device with that guest CID.
func (d *Driver) config(spec vmm.Spec, boot *bootAssets, base string, cid uint32) Config {
	var agentSocks []string
	for i := 0; i < agentPorts; i++ {
		agentSocks = append(agentSocks, boxdir.SockPath(spec.Dir, spec.ID, boxdir.AgentSock(i)))
	}
	disks := []Disk{{Path: base, ReadOnly: true}, {Path: spec.Disks.Layer}}
	p := guestabi.Defaults()
	p.RW = "/dev/vdb"
	var extra []string
	if boot.agentDisk != "" {
		// No initramfs: the kernel mounts the agent disk as its root and
		// runs /init from it; the box disks come after it.
		// Readahead over the whole disk: the first page fault in /init then
		// reads the agent in a few large requests instead of ~60 of 128 KiB
		// (its start ~60 ms sooner under TCG here, same QEMU memory).
		disks = append([]Disk{{Path: boot.agentDisk, ReadOnly: true, OptIOSize: boot.agentDiskIO}}, disks...)
		extra = append([]string(nil), agentDiskParams...)
		p.Root, p.RW = "/dev/vdb", "/dev/vdc"
	}
	p.Hostname, p.Ports, p.Debug = spec.Hostname, agentPorts, d.o.Debug
	if spec.Net != nil {
		p.Net = guestabi.NetUser
		p.KernelIP = boot.kernel.IPConfig
	}
	if cid != 0 {
		p.VsockPort = vsockPort
	}
	extra = append(extra, p.Args()...)
	extra = append(extra, d.testFaultArgs()...)
	// One vCPU under TCG: the PIT instead of a local APIC timer that the
	// kernel would first calibrate for 100 ms (see Config.NoACPI).
	// With more vCPUs each keeps its own APIC timer: with the PIT alone
	// the others get only periodic 4 ms ticks (no high-resolution timers).
	noACPI := boot.accel.Accel == AccelTCG && boot.kernel.BootsWithoutACPI && spec.CPUs <= 1
	if noACPI {
		extra = append(extra, noAPICTimer)
	}
	transport, _ := CheckTransport(d.o.VolumeTransport)
	volDisks, shares, fsShares, volParams := volumeDevices(spec, transport, len(disks))
	disks = append(disks, volDisks...)
	extra = append(extra, volParams...)
	thp := boot.thp
	if len(fsShares) > 0 && thp == THPCode {
		// Guest RAM is the shared memfd virtiofsd maps (sharedRAMArgs);
		// huge pages where QEMU asks for them elsewhere, as with THPCode.
		thp = THPAll
	}
	var tsc uint64
	if boot.accel.Accel == AccelTCG {
		tsc = TSCkHz(d.o.CacheDir)
	}
	return Config{
		Shares:       shares,
		FSShares:     fsShares,
		NoACPI:       noACPI,
		VsockCID:     cid,
		Name:         "airlock-" + spec.ID,
		Accel:        boot.accel.Accel,
		CPUs:         spec.CPUs,
		MemoryMiB:    spec.MemoryMiB,
		Kernel:       boot.kernel.Path,
		Initrd:       boot.initrd,
		Cmdline:      KernelCmdline(boot.accel.Accel, d.o.Debug, tsc, append(extra, spec.ExtraCmdline...)...),
		Disks:        disks,
		AgentSockets: agentSocks,
		QMPSocket:    boxdir.SockPath(spec.Dir, spec.ID, boxdir.QMP),
		ConsoleLog:   filepath.Join(spec.Dir, boxdir.Console),
		PIDFile:      filepath.Join(spec.Dir, boxdir.PID),
		Network:      spec.Net != nil,
		NetSocket:    netSocket(spec),
		NetMTU:       netMTU(spec),
		THP:          thp,
	}
}

func netSocket(spec vmm.Spec) string {
	if spec.Net == nil {
		return ""
	}
	return spec.Net.Socket
}

func netMTU(spec vmm.Spec) int {
	if spec.Net == nil {
		return 0
	}
	return spec.Net.MTU
}

// randomCID returns a vsock guest CID (3 and up; 0-2 are reserved).
func randomCID() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return 3 + binary.LittleEndian.Uint32(b[:])%(1<<31)
}

// KillStray kills the QEMU of spec's box that its pid file names, if it
// still runs (see vmm.StrayKiller), and releases what its boot held.
func (d *Driver) KillStray(spec vmm.Spec) error {
	raw, err := os.ReadFile(filepath.Join(spec.Dir, boxdir.PID))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		return nil
	}
	h := vmm.Handle{PID: pid, Start: vmm.StartTime(pid)}
	if h.Start == 0 || !isVM(pid, "airlock-"+spec.ID) {
		return nil
	}
	if err := vmm.Kill(h); err != nil {
		return fmt.Errorf("box %s: its QEMU %w", spec.ID, err)
	}
	release(spec.Dir)
	return nil
}

// Attach returns the QEMU machine h of spec's box.
func (d *Driver) Attach(spec vmm.Spec, h vmm.Handle) vmm.Machine {
	return &machine{id: spec.ID, dir: spec.Dir, h: h, warn: d.warn}
}

// machine is one QEMU process of a box.
type machine struct {
	id, dir string
	h       vmm.Handle
	warn    func(string) // the driver's (each warning once)

	once sync.Once
	exit <-chan struct{}
}

func (m *machine) Handle() vmm.Handle { return m.h }
func (m *machine) Alive() bool        { return m.h.Alive() }

func (m *machine) Exited() <-chan struct{} {
	m.once.Do(func() { m.exit = vmm.Watch(m.h) })
	return m.exit
}

func (m *machine) Death() vmm.Death {
	fallback := fmt.Sprintf("its QEMU process (pid %d) exited unexpectedly", m.h.PID)
	if rec := m.exitRecord(0); rec != "" {
		fallback += ": " + rec
	}
	return vmm.DeathFromConsole(filepath.Join(m.dir, boxdir.Console), fallback)
}

// exitRecord returns how a confined QEMU ended and what it printed (the
// launcher's exit file), waiting up to wait for the file (it is written
// right after QEMU is reaped and its stderr read to the end, by the
// process that started it). "" if there is none: QEMU ended with status 0,
// runs unconfined, or its launcher is gone.
func (m *machine) exitRecord(wait time.Duration) string {
	p := filepath.Join(m.dir, boxdir.QEMUExit)
	for deadline := time.Now().Add(wait); ; {
		b, err := os.ReadFile(p)
		if err == nil {
			const max = 4 << 10
			if len(b) > max {
				b = append(b[:max:max], "..."...)
			}
			return vmm.EscapeConsole(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (m *machine) Console(n int) string {
	return vmm.ConsoleTail(filepath.Join(m.dir, boxdir.Console), n)
}

// Kill ends QEMU and releases its cgroup.
func (m *machine) Kill() error {
	if err := vmm.Kill(m.h); err != nil {
		return err
	}
	m.Release()
	return nil
}

// Release removes the boot's cgroup once QEMU has ended.
func (m *machine) Release() {
	if !m.h.Alive() {
		release(m.dir)
	}
}

// Quit sends QMP "quit".
func (m *machine) Quit(ctx context.Context) error {
	q, err := DialQMP(ctx, boxdir.SockPath(m.dir, m.id, boxdir.QMP))
	if err != nil {
		return err
	}
	defer q.Close()
	_, err = q.Execute("quit", nil)
	return err
}

// dialVsock connects to the agent over vsock when the box has a vsock
// device; ok is false when it has none or the connection failed (the caller
// then uses a virtio-serial port).
func (m *machine) dialVsock(ctx context.Context) (c *client.Client, ok bool) {
	raw, err := os.ReadFile(filepath.Join(m.dir, boxdir.CID))
	if err != nil {
		return nil, false
	}
	cid, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 32)
	if err != nil || cid == 0 {
		return nil, false
	}
	c, err = client.DialAuth(ctx, boxSecret(m.dir), func(ctx context.Context) (net.Conn, error) {
		return vsock.Dial(uint32(cid), vsockPort, nil)
	})
	return c, err == nil
}

// DialAgent connects over vsock where the box has it, else takes a free
// agent port (the first whose flock it gets, waiting while all are in use
// by other processes) and connects through it. The flock is held until
// the connection ends.
func (m *machine) DialAgent(ctx context.Context) (*client.Client, error) {
	if c, ok := m.dialVsock(ctx); ok {
		return c, nil
	}
	var fl *flock.Flock
	var port int
	for fl == nil {
		for i := 0; i < agentPorts; i++ {
			l := flock.New(filepath.Join(m.dir, boxdir.AgentLock(i)))
			if ok, err := l.TryLock(); err == nil && ok {
				fl, port = l, i
				break
			}
		}
		if fl != nil {
			break
		}
		m.warn(fmt.Sprintf("box %s: all %d of its agent connections are in use by other processes (at most %d at once); waiting for one to end", m.id, agentPorts, agentPorts))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("all %d agent ports are in use by other processes: %w", agentPorts, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	sock := boxdir.SockPath(m.dir, m.id, boxdir.AgentSock(port))
	c, err := client.DialAuth(ctx, boxSecret(m.dir), func(ctx context.Context) (net.Conn, error) {
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
