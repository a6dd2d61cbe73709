package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock/internal/assets"
	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/checkpoint/pagediff"
	"github.com/airlock-run/airlock/internal/sparse"
	"github.com/airlock-run/airlock/internal/vmm"
)

var _ vmm.Snapshotter = (*Driver)(nil)
var _ vmm.Pauser = (*Driver)(nil)
var _ vmm.MachineFileChecker = (*Driver)(nil)

// Files of a snapshot directory.
const (
	snapState   = "state"        // QEMU's migration stream: RAM and device state
	snapDisk    = "rw.ext4"      // the writable layer at the paused instant
	snapMachine = "machine.json" // what the restore must match (machineMeta)
)

// machineMeta is what a snapshot's machine was: a restore starts the same
// QEMU with the same device layout and the same boot files, or refuses.
type machineMeta struct {
	QEMUVersion string `json:"qemu_version"`
	// Config is the QEMU configuration with the per-box paths blanked
	// (see layout); its Cmdline is the one the restore launches with.
	Config Config `json:"config"`
	// Files are the kernel, initramfs or agent disk and root filesystem
	// base the guest booted from and still has pages of in its memory.
	Files []fileID `json:"files"`
	// RAMParts are the RAM parts (ramLayout indices) whose memory is in
	// the RAM image (snapRAM, see ramimage.go) instead of the migration
	// stream, which was saved with x-ignore-shared; none: all of RAM is in
	// the stream.
	RAMParts []int `json:"ram_parts,omitempty"`
	// Transient says the RAM image is not in the snapshot's directory but
	// in the memory of the process that took it (vmm.SaveOptions.Transient,
	// ramImages.hold), for as long as it restores from it.
	Transient bool `json:"transient,omitempty"`
}

// fileID identifies a file's content by path, size and inode: the cache
// writes a file anew (new inode) whenever it builds it again, and touches
// files it uses (so the modification time says nothing), and hashing a
// root filesystem base at every restore would cost more than the restore.
//
// SHA256 (hex) is the content's digest, filled in when the snapshot is
// exported (SealSnapshot): a restore where path, size and inode differ
// (another host) then accepts a local file of that content.
type fileID struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	Inode  uint64 `json:"inode"`
	SHA256 string `json:"sha256,omitempty"`
}

// digestDir is where content digests of boot files are memoized.
func (d *Driver) digestDir() string { return filepath.Join(d.o.CacheDir, "digests") }

// SealSnapshot adds the content digests of the files the snapshot's guest
// booted from to its machine description, so that a host whose files have
// other paths or inodes but the same content can restore it (ImportBox).
// It fails when one of them changed since the snapshot was taken.
func (d *Driver) SealSnapshot(ctx context.Context, dir string) error {
	mm, err := readMeta(dir)
	if err != nil {
		return err
	}
	changed := false
	for i, f := range mm.Files {
		if f.SHA256 != "" {
			continue
		}
		id, err := idOf(f.Path)
		if err != nil {
			return fmt.Errorf("a file the snapshot's guest booted from is gone: %w", err)
		}
		if id != f {
			return fmt.Errorf("%s was built again since the snapshot was taken: take a new one", f.Path)
		}
		sum, err := assets.PathDigest(d.digestDir(), f.Path)
		if err != nil {
			return err
		}
		if id2, err := idOf(f.Path); err != nil || id2 != f {
			return fmt.Errorf("%s changed while it was hashed: take a new snapshot", f.Path)
		}
		mm.Files[i].SHA256 = sum
		changed = true
	}
	if !changed {
		return nil
	}
	meta, _ := json.MarshalIndent(mm, "", "  ")
	tmp, err := os.CreateTemp(dir, ".machine-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(meta)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, snapMachine))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// sameFiles checks the boot files a box gets here now against the
// snapshot's: the same file (path, size, inode), or, for a sealed
// snapshot (SealSnapshot), a file of the same content.
func (d *Driver) sameFiles(was, now []fileID) error {
	if len(was) != len(now) {
		return fmt.Errorf("the files the snapshot's guest booted from changed since (kernel, agent or root filesystem base: %s): the snapshot cannot be restored; take a new one", diffFiles(was, now))
	}
	for i := range was {
		w, n := was[i], now[i]
		w.SHA256 = ""
		if w == n {
			continue
		}
		if was[i].SHA256 == "" {
			return fmt.Errorf("the files the snapshot's guest booted from changed since (kernel, agent or root filesystem base: %s): the snapshot cannot be restored; take a new one", diffFiles(was, now))
		}
		what := bootFileKind(i, len(was))
		sum := ""
		if n.Size == w.Size {
			var err error
			if sum, err = assets.PathDigest(d.digestDir(), n.Path); err != nil {
				return err
			}
		}
		if sum != was[i].SHA256 {
			return fmt.Errorf("the %s here (%s, %d bytes) is not the one the snapshot's guest booted from (%d bytes, sha256 %.12s): the snapshot cannot be restored on this host (its kernel, agent or image base differ)", what, n.Path, n.Size, w.Size, was[i].SHA256)
		}
	}
	return nil
}

// bootFileKind names the i-th of n boot files (machineFor's order: kernel,
// initramfs or agent disk, root filesystem base).
func bootFileKind(i, n int) string {
	switch {
	case i == 0:
		return "guest kernel"
	case i == n-1:
		return "root filesystem base"
	}
	return "agent disk (or initramfs)"
}

// withoutBootPaths blanks the host paths of c's boot files (kernel,
// initramfs, read-only disks), which another host keeps elsewhere; their
// content is compared by sameFiles.
func withoutBootPaths(c Config) Config {
	c.Kernel, c.Initrd = "", ""
	c.Disks = append([]Disk(nil), c.Disks...)
	for i := range c.Disks {
		if c.Disks[i].ReadOnly {
			c.Disks[i].Path = ""
		}
	}
	return c
}

func idOf(path string) (fileID, error) {
	var s syscall.Stat_t
	if err := syscall.Stat(path, &s); err != nil {
		return fileID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return fileID{Path: path, Size: s.Size, Inode: s.Ino}, nil
}

// layout is c without what differs between boxes of one machine layout:
// names, sockets, logs, the writable layer's path and the vsock CID
// (whether there is one stays).
func layout(c Config) Config {
	c.Name, c.QMPSocket, c.ConsoleLog, c.PIDFile, c.Incoming = "", "", "", "", false
	// The per-boot agent secret is never kept: a restore gets a fresh one
	// (see confine). Confinement is the restoring host's.
	c.Secret, c.Jail, c.ConsoleMax = nil, Jail{}, 0
	if c.NetSocket != "" {
		c.NetSocket = boxdir.NetSock // each box's network helper socket (whether there is one stays)
	}
	c.AgentSockets = make([]string, len(c.AgentSockets))
	c.Disks = append([]Disk(nil), c.Disks...)
	for i := range c.Disks {
		if !c.Disks[i].ReadOnly {
			c.Disks[i].Path = boxdir.RW
		}
	}
	if c.VsockCID != 0 {
		c.VsockCID = 1
	}
	return c
}

// machineFor returns spec's QEMU configuration for this host and the
// identities of its boot files.
func (d *Driver) machineFor(ctx context.Context, spec vmm.Spec, cid uint32) (Config, []fileID, error) {
	boot, err := d.assets()
	if err != nil {
		return Config{}, nil, err
	}
	if err := checkDisks(spec, false); err != nil {
		return Config{}, nil, err
	}
	base := spec.Disks.Base
	qc := d.config(spec, boot, base, cid)
	var files []fileID
	for _, p := range []string{boot.kernel.Path, boot.initrd, boot.agentDisk, base} {
		if p == "" {
			continue
		}
		id, err := idOf(p)
		if err != nil {
			return Config{}, nil, err
		}
		files = append(files, id)
	}
	return qc, files, nil
}

// qmpFD runs a QMP command with an open file passed along (SCM_RIGHTS),
// as getfd needs.
func (q *QMP) executeWithFile(cmd string, args any, f *os.File) (json.RawMessage, error) {
	uc, ok := q.conn.(*net.UnixConn)
	if !ok {
		return nil, errors.New("qmp: not a unix socket")
	}
	req, id := q.request(cmd, args)
	if _, _, err := uc.WriteMsgUnix(req, unix.UnixRights(int(f.Fd())), nil); err != nil {
		return nil, err
	}
	return q.readReturn(cmd, id)
}

// readReturn reads replies until the one to command cmd sent with id
// (events and replies to other ids are skipped).
func (q *QMP) readReturn(cmd string, id int) (json.RawMessage, error) {
	for {
		line, err := readQMPLine(q.r)
		if err != nil {
			return nil, err
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string          `json:"event"`
			ID    json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, err
		}
		if resp.Event != "" || string(resp.ID) != strconv.Itoa(id) {
			continue
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("qmp %s: %s: %s", cmd, resp.Error.Class, resp.Error.Desc)
		}
		return resp.Return, nil
	}
}

// version returns QEMU's version ("7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)").
func (q *QMP) version() (string, error) {
	raw, err := q.Execute("query-version", nil)
	if err != nil {
		return "", err
	}
	var v struct {
		QEMU    struct{ Major, Minor, Micro int } `json:"qemu"`
		Package string                            `json:"package"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d.%d %s", v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro, strings.TrimSpace(v.Package)), nil
}

// status returns the run state ("running", "paused", "inmigrate", ...).
func (q *QMP) status() (string, error) {
	raw, err := q.Execute("query-status", nil)
	if err != nil {
		return "", err
	}
	var s struct {
		Status string `json:"status"`
	}
	err = json.Unmarshal(raw, &s)
	return s.Status, err
}

func (m *machine) qmp(ctx context.Context) (*QMP, error) {
	if !m.Alive() {
		return nil, fmt.Errorf("its QEMU process (pid %d) is not running", m.h.PID)
	}
	return DialQMP(ctx, boxdir.SockPath(m.dir, m.id, boxdir.QMP))
}

// SaveSnapshot stops the machine (QMP stop), streams its RAM and device
// state into dir/state through a file descriptor passed over QMP (getfd,
// migrate fd:; QEMU spawns nothing), copies the writable layer while it is
// still stopped, and lets it run on (cont). With opts.LinkDisk the
// snapshot's writable layer is a hard link to the box's; with
// opts.Transient its RAM image stays in this process's memory (ramImages)
// and nothing is fsynced.
func (d *Driver) SaveSnapshot(ctx context.Context, spec vmm.Spec, h vmm.Handle, dir string, opts vmm.SaveOptions) (vmm.SnapshotStats, error) {
	var st vmm.SnapshotStats
	var cid uint32
	if raw, err := os.ReadFile(filepath.Join(spec.Dir, boxdir.CID)); err == nil {
		v, _ := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 32)
		cid = uint32(v)
	}
	qc, files, err := d.machineFor(ctx, spec, cid)
	if err != nil {
		return st, err
	}
	m := &machine{id: spec.ID, dir: spec.Dir, h: h}
	q, err := m.qmp(ctx)
	if err != nil {
		return st, err
	}
	defer q.Close()
	ver, err := q.version()
	if err != nil {
		return st, err
	}
	f, err := os.OpenFile(filepath.Join(dir, snapState), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return st, err
	}
	defer f.Close()
	// A stopped guest is sent in one pass; the default bandwidth limit
	// (128 MiB/s) would only slow the copy to a local file down.
	if _, err := q.Execute("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}); err != nil {
		return st, err
	}
	// A transient snapshot (Fork's) keeps its RAM image in memory and is
	// not made durable.
	transient := opts.Transient
	// A box paused before (Pause) stays paused.
	was, err := q.status()
	if err != nil {
		return st, err
	}
	// Guest RAM held in QEMU's memfds goes into the RAM image, the rest
	// (and the device state) into the stream; when the memfds cannot be
	// read, all of it into the stream.
	parts, idx := imageParts(qc)
	var memfds map[int]*os.File
	if len(idx) > 0 {
		memfds, _ = qemuMemfds(h.PID, parts, idx)
	}
	closeMemfds := func() {
		for _, f := range memfds {
			f.Close()
		}
		memfds = nil
	}
	defer closeMemfds()
	if memfds != nil {
		if _, err := serialQueues(q); err != nil {
			closeMemfds() // no way to check the image against the devices
		}
	}
	if memfds != nil {
		if err := setIgnoreShared(q, true); err != nil {
			return st, err
		}
		defer setIgnoreShared(q, false)
	} else if err := setIgnoreShared(q, false); err != nil {
		// A restored QEMU keeps the capability its incoming migration
		// was given: a fork child (no memfds of its own) would save a
		// stream that says x-ignore-shared while machine.json has no RAM
		// image, which no restore accepts.
		return st, err
	}
	// A checkpoint's parent's page sums, read while the machine runs.
	var parent parentSums
	if opts.Chain {
		parent = readParentSums(opts.Parent, parts, idx, spec.Disks.Layer)
	}
	t0 := time.Now()
	if _, err := q.Execute("stop", nil); err != nil {
		return st, err
	}
	resumed := false
	resume := func() {
		if !stoppedStatus(was) && !resumed {
			q.Execute("cont", nil)
		}
		resumed = true
	}
	defer resume()
	// A confined QEMU holds a migration blocker (see noMigrateQcow) that
	// keeps `migrate exec:` from running anything; it goes for the time of
	// this migrate fd:, which spawns nothing, and comes back afterwards.
	if restore, err := liftMigrationBlocker(q); err != nil {
		return st, err
	} else {
		defer restore()
	}
	const fdName = "airlock-snapshot"
	migrate := func() error {
		if _, err := q.executeWithFile("getfd", map[string]any{"fdname": fdName}, f); err != nil {
			return err
		}
		if _, err := q.Execute("migrate", map[string]any{"uri": "fd:" + fdName}); err != nil {
			return err
		}
		if err := waitMigration(ctx, q); err != nil {
			return err
		}
		if transient {
			return nil
		}
		return f.Sync()
	}
	var ramParts []int
	// A checkpoint's (opts.Chain) page sums, and whether its images are
	// deltas against opts.Parent.
	var ramSums, diskSums *pagediff.Sums
	var diskDelta bool
	var held []*os.File // a transient snapshot's RAM image
	defer func() { closeAll(held) }()
	var heldBytes int64
	for attempt := 1; ; attempt++ {
		var before []queueState
		if memfds != nil {
			if before, err = serialQueues(q); err != nil {
				return st, err
			}
		}
		if err := migrate(); err != nil {
			return st, err
		}
		if memfds == nil {
			break
		}
		switch {
		case transient:
			if held, heldBytes, err = sealedCopies(parts, memfds); err != nil {
				return st, fmt.Errorf("copy the RAM image: %w", err)
			}
		case opts.Chain:
			if ramSums, err = saveRAMDelta(dir, parts, memfds, parent.ram); err != nil {
				return st, fmt.Errorf("write the RAM image: %w", err)
			}
		default:
			if _, err := writeRAMImage(filepath.Join(dir, snapRAM), parts, memfds); err != nil {
				return st, fmt.Errorf("write the RAM image: %w", err)
			}
		}
		after, err := serialQueues(q)
		if err != nil {
			return st, err
		}
		if reflect.DeepEqual(before, after) {
			ramParts = idx
			break
		}
		// A stopped QEMU still moves data between a host connection to
		// an agent port and guest RAM (virtio-serial): it did after the
		// devices were saved, so the image and the stream disagree (a
		// restore of such a pair crashed QEMU). Again: QEMU migrates a
		// machine once per stop, so the guest runs on for a moment;
		// after three tries all of RAM goes into the stream, which QEMU
		// saves at one instant with the devices.
		os.Remove(filepath.Join(dir, snapRAM))
		closeAll(held)
		held, heldBytes = nil, 0
		ramSums = nil
		if err := f.Truncate(0); err != nil {
			return st, err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return st, err
		}
		if _, err := q.Execute("cont", nil); err != nil {
			return st, err
		}
		if attempt >= 3 {
			closeMemfds()
			if err := setIgnoreShared(q, false); err != nil {
				return st, err
			}
		}
		if _, err := q.Execute("stop", nil); err != nil {
			return st, err
		}
	}
	// QEMU flushed and let go of its disks when the migration completed;
	// the copy matches the guest state just saved. cont takes them back.
	switch {
	case opts.LinkDisk:
		if err := os.Link(spec.Disks.Layer, filepath.Join(dir, snapDisk)); err != nil {
			return st, fmt.Errorf("link the writable layer: %w", err)
		}
	case opts.Chain:
		if diskSums, diskDelta, err = saveLayerDelta(dir, spec.Disks.Layer, parent.disk); err != nil {
			return st, fmt.Errorf("copy the writable layer: %w", err)
		}
	default:
		if err := sparse.Copy(spec.Disks.Layer, filepath.Join(dir, snapDisk)); err != nil {
			return st, fmt.Errorf("copy the writable layer: %w", err)
		}
	}
	st.PausedNs = int64(time.Since(t0))
	resume()
	if ramParts != nil && !transient {
		// After the box runs on: the image's pages were written while
		// it was stopped.
		if err := syncFile(filepath.Join(dir, snapRAM)); err != nil {
			return st, err
		}
	}
	if opts.Chain {
		if err := writeChain(dir, opts.Parent, ramSums, diskSums, parent.ram != nil && ramSums != nil && ramParts != nil, diskDelta); err != nil {
			return st, err
		}
	}
	if held != nil {
		var fst syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &fst); err != nil {
			return st, err
		}
		ramImages.hold(statKey(fst), held)
		held = nil
	}
	meta, _ := json.MarshalIndent(machineMeta{QEMUVersion: ver, Config: layout(qc), Files: files, RAMParts: ramParts, Transient: ramParts != nil && transient}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, snapMachine), meta, 0o600); err != nil {
		return st, err
	}
	st.StateBytes = allocated(filepath.Join(dir, snapState)) + allocated(filepath.Join(dir, snapRAM)) + heldBytes +
		allocated(filepath.Join(dir, pagediff.SumsName(snapRAM)))
	st.DiskBytes = allocated(filepath.Join(dir, snapDisk)) + allocated(filepath.Join(dir, pagediff.SumsName(snapDisk)))
	return st, nil
}

// queueState is where a virtqueue's indices stand (x-query-virtio-queue-status).
type queueState struct {
	Path                          string
	Queue, LastAvail, Used, InUse int
}

// serialQueues returns the state of every queue of the machine's virtio
// devices: a stopped QEMU still moves data between host connections to
// the ports of its virtio-serial device and guest RAM (the others wait
// for the guest to run), and each such move changes these indices.
func serialQueues(q *QMP) ([]queueState, error) {
	raw, err := q.Execute("x-query-virtio", nil)
	if err != nil {
		return nil, err
	}
	var devs []struct{ Name, Path string }
	if err := json.Unmarshal(raw, &devs); err != nil {
		return nil, err
	}
	var out []queueState
	for _, d := range devs {
		for i := 0; i < 1024; i++ {
			raw, err := q.Execute("x-query-virtio-queue-status", map[string]any{"path": d.Path, "queue": i})
			if err != nil {
				if i == 0 {
					return nil, err
				}
				break // past the last queue
			}
			var s struct {
				LastAvail int `json:"last-avail-idx"`
				Used      int `json:"used-idx"`
				InUse     int `json:"inuse"`
			}
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
			out = append(out, queueState{Path: d.Path, Queue: i, LastAvail: s.LastAvail, Used: s.Used, InUse: s.InUse})
		}
	}
	return out, nil
}

// setIgnoreShared sets the migration capability x-ignore-shared: RAM
// blocks in shared memory (memfds) are not migrated.
func setIgnoreShared(q *QMP, on bool) error {
	_, err := q.Execute("migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}}})
	return err
}

// syncFile flushes the file at path to disk.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// liftMigrationBlocker deletes the migration blocker node of a confined
// QEMU (none: nothing to do) and returns what adds it again.
func liftMigrationBlocker(q *QMP) (restore func(), err error) {
	raw, err := q.Execute("query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		return nil, err
	}
	var nodes []struct {
		Node string `json:"node-name"`
		File string `json:"file"`
		Drv  string `json:"drv"`
	}
	json.Unmarshal(raw, &nodes)
	file := ""
	for _, n := range nodes {
		if n.Node == NoMigrateNode {
			file = n.File
		}
	}
	if file == "" {
		return func() {}, nil
	}
	if _, err := q.Execute("blockdev-del", map[string]any{"node-name": NoMigrateNode}); err != nil {
		return nil, fmt.Errorf("lift the migration blocker: %w", err)
	}
	return func() {
		q.Execute("blockdev-add", map[string]any{"driver": "qcow", "node-name": NoMigrateNode, "read-only": true,
			"file": map[string]any{"driver": "file", "filename": file}})
	}, nil
}

// allocated returns the bytes a file takes on disk.
func allocated(path string) int64 {
	var s syscall.Stat_t
	if syscall.Stat(path, &s) != nil {
		return 0
	}
	return s.Blocks * 512
}

// waitMigration polls query-migrate until the outgoing migration ends.
func waitMigration(ctx context.Context, q *QMP) error {
	for {
		raw, err := q.Execute("query-migrate", nil)
		if err != nil {
			return err
		}
		var s struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		json.Unmarshal(raw, &s)
		switch s.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("QEMU could not save the machine state: %s %s", s.Status, s.Error)
		}
		select {
		case <-ctx.Done():
			q.Execute("migrate_cancel", nil)
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// readMeta reads a snapshot's machine.json.
func readMeta(dir string) (machineMeta, error) {
	var mm machineMeta
	raw, err := os.ReadFile(filepath.Join(dir, snapMachine))
	if err != nil {
		return mm, fmt.Errorf("snapshot %s is incomplete: %w", dir, err)
	}
	if err := json.Unmarshal(raw, &mm); err != nil {
		return mm, fmt.Errorf("snapshot %s: %s: %w", dir, snapMachine, err)
	}
	return mm, nil
}

// CheckSnapshot compares the machine spec would get on this host now with
// the one the snapshot was taken of.
func (d *Driver) CheckSnapshot(spec vmm.Spec, dir string) error {
	_, _, err := d.checkSnapshot(context.Background(), spec, dir)
	return err
}

func (d *Driver) checkSnapshot(ctx context.Context, spec vmm.Spec, dir string) (Config, machineMeta, error) {
	mm, err := readMeta(dir)
	if err != nil {
		return Config{}, mm, err
	}
	// The guest's kernel runs on from its memory image, but the command
	// line the restore launches with still goes to QEMU's -append: only
	// airlock's parameters (an imported archive's included).
	if err := CheckCmdline(mm.Config.Cmdline); err != nil {
		return Config{}, mm, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	need := []string{snapState, snapDisk}
	if len(mm.RAMParts) > 0 && !mm.Transient {
		need = append(need, snapRAM)
	}
	for _, f := range need {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return Config{}, mm, fmt.Errorf("snapshot %s is incomplete: %w", dir, err)
		}
	}
	if err := checkChain(dir); err != nil {
		return Config{}, mm, err
	}
	var cid uint32
	if mm.Config.VsockCID != 0 {
		if !VsockAvailable() {
			return Config{}, mm, errors.New("the snapshot's box had a vsock device and this host has no /dev/vhost-vsock")
		}
		cid = randomCID()
	}
	qc, files, err := d.machineFor(ctx, spec, cid)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Config{}, mm, fmt.Errorf("a file the snapshot's guest booted from is gone: %w", err)
		}
		return Config{}, mm, err
	}
	if err := d.sameFiles(mm.Files, files); err != nil {
		return Config{}, mm, err
	}
	now, was := withoutBootPaths(layout(qc)), withoutBootPaths(mm.Config)
	now.Cmdline, was.Cmdline = "", ""
	if !reflect.DeepEqual(now, was) {
		nb, _ := json.Marshal(now)
		wb, _ := json.Marshal(was)
		return Config{}, mm, fmt.Errorf("the machine a box gets here now differs from the snapshot's (accelerator, CPU, memory, devices or THP layout): the snapshot cannot be restored; take a new one\nsnapshot: %s\nnow:      %s", wb, nb)
	}
	qc.Cmdline = mm.Config.Cmdline
	return qc, mm, nil
}

// CheckMachineFile checks a snapshot's machine description (the
// machine.json a snapshot directory and a memory archive hold, b its
// bytes) before it is stored: its kernel command line must be one airlock
// writes (CheckCmdline). The restore checks the rest against this host.
// The lifecycle code reaches it through the seam (vmm.MachineFileChecker).
func (d *Driver) CheckMachineFile(b []byte) error {
	var mm machineMeta
	if err := json.Unmarshal(b, &mm); err != nil {
		return fmt.Errorf("%s: %w", snapMachine, err)
	}
	if err := CheckCmdline(mm.Config.Cmdline); err != nil {
		return fmt.Errorf("%s: %w", snapMachine, err)
	}
	return nil
}

func diffFiles(was, now []fileID) string {
	var out []string
	for i := range max(len(was), len(now)) {
		switch {
		case i >= len(was):
			out = append(out, "now also "+now[i].Path)
		case i >= len(now):
			out = append(out, was[i].Path+" is no longer used")
		case was[i].Path != now[i].Path:
			out = append(out, fmt.Sprintf("%s is now %s", was[i].Path, now[i].Path))
		case was[i] != now[i]:
			out = append(out, was[i].Path+" was built again")
		}
	}
	return strings.Join(out, "; ")
}

// CreateFromSnapshot checks the snapshot and copies its writable layer
// into the new box's directory.
func (d *Driver) CreateFromSnapshot(ctx context.Context, spec vmm.Spec, dir string) error {
	if _, _, err := d.checkSnapshot(ctx, spec, dir); err != nil {
		return err
	}
	if pagediff.IsDelta(dir, snapDisk) {
		return materialiseLayer(ctx, dir, spec.Disks.Layer)
	}
	return sparse.Copy(filepath.Join(dir, snapDisk), spec.Disks.Layer)
}

// StartFromSnapshot launches QEMU with the snapshot's machine layout and
// kernel command line waiting for a migration stream (-incoming defer),
// hands it the state file over QMP (getfd, migrate-incoming fd:) and
// returns once the guest runs again (cont once the state is loaded).
func (d *Driver) StartFromSnapshot(ctx context.Context, spec vmm.Spec, dir string) (vmm.Machine, error) {
	qc, mm, err := d.checkSnapshot(ctx, spec, dir)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(dir, snapState))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	live := d.config(spec, d.boot, "", 0) // this box's paths
	qc.Name, qc.AgentSockets, qc.QMPSocket, qc.ConsoleLog, qc.PIDFile = live.Name, live.AgentSockets, live.QMPSocket, live.ConsoleLog, live.PIDFile
	qc.NetSocket = live.NetSocket
	for i := range qc.Disks {
		if !qc.Disks[i].ReadOnly {
			qc.Disks[i].Path = spec.Disks.Layer
		}
	}
	qc.Incoming = true
	// Guest RAM, the kernel's image included, comes from the snapshot: QEMU
	// gets the kernel's stub (kstub.go).
	stub := filepath.Join(spec.Dir, boxdir.KernelStub)
	if ok, err := writeKernelStub(qc.Kernel, stub); err != nil {
		return nil, err
	} else if ok {
		qc.Kernel = stub
	}
	var parts []ramPart
	var idx []int
	if len(mm.RAMParts) > 0 {
		parts, idx = imageParts(qc)
		if !reflect.DeepEqual(idx, mm.RAMParts) {
			return nil, fmt.Errorf("the snapshot's RAM image holds parts %v of guest RAM, a box here now %v: the snapshot cannot be restored; take a new one", mm.RAMParts, idx)
		}
		if mm.Transient {
			// Fork's children share the sealed image this process
			// holds, mapped copy-on-write.
			var fst syscall.Stat_t
			if err := syscall.Fstat(int(f.Fd()), &fst); err != nil {
				return nil, err
			}
			images, done, ok := ramImages.lookup(statKey(fst))
			if !ok {
				return nil, errors.New("the snapshot is transient (a fork's): its memory was held only by the process that took it, for its children, and is not in the snapshot's directory; it cannot be restored here (take a snapshot with Box.Snapshot or airlock snapshot create)")
			}
			defer done()
			qc.RAMImages = images
		}
	}
	return d.startOnce(ctx, spec, qc, mm, f, dir, parts, idx)
}

// startOnce is one launch of StartFromSnapshot.
func (d *Driver) startOnce(ctx context.Context, spec vmm.Spec, qc Config, mm machineMeta, f *os.File, dir string, parts []ramPart, idx []int) (vmm.Machine, error) {
	filled := func() error { return nil }
	if len(mm.RAMParts) > 0 && qc.RAMImages == nil {
		// The box's own copy, filled while QEMU starts.
		copyRAM := func() ([]*os.File, func() error, error) { return ramCopy(filepath.Join(dir, snapRAM), parts, idx) }
		if pagediff.IsDelta(dir, snapRAM) {
			copyRAM = func() ([]*os.File, func() error, error) { return ramCopyChain(dir, parts, idx) }
		}
		images, fill, err := copyRAM()
		if err != nil {
			return nil, err
		}
		filled = fill
		defer func() {
			fill()
			closeAll(images) // QEMU has its own
		}()
		qc.RAMImages, qc.RAMCopy = images, true
	}
	// A fresh agent secret (the guest takes it from its secret port once
	// it runs again), and this host's confinement.
	if err := d.confine(spec, &qc); err != nil {
		return nil, err
	}
	for _, p := range append(qc.AgentSockets, qc.QMPSocket, qc.PIDFile, filepath.Join(spec.Dir, boxdir.CID)) {
		os.Remove(p)
	}
	os.WriteFile(qc.ConsoleLog, nil, 0o600)
	pid, err := Launch(ctx, qc)
	if err != nil {
		release(spec.Dir)
		return nil, err
	}
	if qc.VsockCID != 0 {
		os.WriteFile(filepath.Join(spec.Dir, boxdir.CID), []byte(strconv.FormatUint(uint64(qc.VsockCID), 10)), 0o600)
	}
	m := &machine{id: spec.ID, dir: spec.Dir, h: vmm.Handle{PID: pid, Start: vmm.StartTime(pid)}}
	if err := loadState(ctx, m, f, mm.QEMUVersion, len(mm.RAMParts) > 0, qc.Network && qc.NetSocket != "", filled); err != nil {
		m.Kill()
		return nil, err
	}
	return m, nil
}

// loadState feeds the state file to the waiting QEMU of m and waits until
// the guest runs.
//
// ignoreShared says the stream was saved with x-ignore-shared (a RAM
// image holds part of RAM), which changes its format: the incoming side
// needs the capability too. network says the machine has a stream netdev
// (net0) its network helper connects to. ramFilled waits for the copy of
// the RAM image QEMU maps (ramCopy), which must be complete before the
// state loads: loading the virtio devices reads their rings in guest RAM
// (a load that ran beside the copy left a box's agent port dead now and
// then).
func loadState(ctx context.Context, m *machine, f *os.File, wantVersion string, ignoreShared, network bool, ramFilled func() error) error {
	q, err := m.qmp(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	ver, err := q.version()
	if err != nil {
		return err
	}
	if ver != wantVersion {
		return fmt.Errorf("the snapshot was taken with QEMU %s and this host runs QEMU %s: the snapshot cannot be restored; take a new one", wantVersion, ver)
	}
	if ignoreShared {
		if err := setIgnoreShared(q, true); err != nil {
			return err
		}
	}
	// No self-announcement once loaded: by default QEMU sends RARPs and
	// has the guest announce itself (gratuitous ARP, netlink events) five
	// times over ~0.8 s, which tells switches a migrated guest moved. A
	// restored box's link is its own network helper's stream, which
	// learns nothing from it; the guest's work would delay its first
	// exec.
	if _, err := q.Execute("migrate-set-parameters", map[string]any{"announce-rounds": 0}); err != nil {
		return err
	}
	const fdName = "airlock-snapshot"
	if _, err := q.executeWithFile("getfd", map[string]any{"fdname": fdName}, f); err != nil {
		return err
	}
	// QEMU exits when the stream does not load (a device or RAM layout
	// it does not accept): say what it said.
	died := func(err error) error {
		select {
		case <-m.Exited():
		case <-time.After(2 * time.Second):
			return err
		}
		why := m.exitRecord(2 * time.Second)
		if why == "" {
			why = strings.TrimSpace(m.Console(5))
		}
		return fmt.Errorf("QEMU exited while loading the snapshot: %s", why)
	}
	filled := make(chan error, 1)
	go func() { filled <- ramFilled() }()
	select {
	case err := <-filled:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := q.Execute("migrate-incoming", map[string]any{"uri": "fd:" + fdName}); err != nil {
		return died(err)
	}
	for {
		s, err := q.status()
		if err != nil {
			return died(err)
		}
		if s == "running" {
			return nil
		}
		if s == "paused" {
			// Loaded (-S: stopped, whatever state the snapshot's machine
			// was in). Its network helper must be connected first:
			// QEMU 7.2 flushes the packets it queued while stopped (its
			// self-announcement after a migration) into a stream netdev
			// still being set up, and crashes (a NULL channel).
			if network {
				if err := waitNetdev(ctx, q); err != nil {
					return died(err)
				}
			}
			if _, err := q.Execute("cont", nil); err != nil {
				return died(err)
			}
			continue
		}
		if s != "inmigrate" && s != "restore-vm" && s != "prelaunch" {
			// A failed load passes through such states on QEMU's way out.
			return died(fmt.Errorf("QEMU did not resume the snapshot's guest (state %q)", s))
		}
		// A load takes ~15 ms under TCG: poll finely (a QMP query costs
		// ~50 µs) rather than round the restore up by up to 5 ms.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// netdevTimeout bounds the wait for a restored box's network helper to
// connect to QEMU (it was started before QEMU and dials every 2 ms).
const netdevTimeout = 20 * time.Second

// waitNetdev waits until QEMU's stream netdev net0 has accepted its
// network helper's connection: "info network" then shows the socket's
// address (QEMU 7.2 shows nothing before, later versions "initializing",
// "listening" or "connecting").
func waitNetdev(ctx context.Context, q *QMP) error {
	deadline := time.Now().Add(netdevTimeout)
	for {
		raw, err := q.Execute("human-monitor-command", map[string]any{"command-line": "info network"})
		if err != nil {
			return err
		}
		var out string
		json.Unmarshal(raw, &out)
		state, ok := netdevState(out, "net0")
		if !ok {
			return fmt.Errorf("QEMU has no netdev net0: %q", out)
		}
		switch {
		case strings.HasPrefix(state, "error:"):
			return fmt.Errorf("QEMU's network socket: %s", state)
		case state != "" && state != "initializing" && state != "listening" && state != "connecting":
			return nil // the peer's address
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the box's network helper did not connect to QEMU within %s (netdev %s)", netdevTimeout, state)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// netdevState returns the state text of the netdev id in the output of
// HMP "info network" (a line " \\ net0: index=0,type=stream,STATE").
func netdevState(info, id string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, id+": index=")
		if !ok {
			continue
		}
		_, after, ok := strings.Cut(rest, ",type=")
		if !ok {
			continue
		}
		_, state, _ := strings.Cut(after, ",")
		return strings.TrimSpace(state), true
	}
	return "", false
}

// Pause stops the machine's vCPUs (QMP stop): the guest uses no CPU until
// Resume.
func (d *Driver) Pause(ctx context.Context, spec vmm.Spec, h vmm.Handle) error {
	return d.qmpCmd(ctx, spec, h, "stop")
}

// Resume lets a paused machine run on (QMP cont).
func (d *Driver) Resume(ctx context.Context, spec vmm.Spec, h vmm.Handle) error {
	return d.qmpCmd(ctx, spec, h, "cont")
}

// Paused reports whether the machine is paused.
func (d *Driver) Paused(ctx context.Context, spec vmm.Spec, h vmm.Handle) (bool, error) {
	q, err := (&machine{id: spec.ID, dir: spec.Dir, h: h}).qmp(ctx)
	if err != nil {
		return false, err
	}
	defer q.Close()
	s, err := q.status()
	return stoppedStatus(s), err
}

// stoppedStatus says whether QEMU status s is a machine stopped to be
// continued (cont): "paused" after stop, and "postmigrate" after a
// snapshot of a paused machine, which leaves it so (it was not paused
// any more to Paused, so its box's followers took it for dead).
func stoppedStatus(s string) bool { return s == "paused" || s == "postmigrate" }

func (d *Driver) qmpCmd(ctx context.Context, spec vmm.Spec, h vmm.Handle, cmd string) error {
	q, err := (&machine{id: spec.ID, dir: spec.Dir, h: h}).qmp(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	_, err = q.Execute(cmd, nil)
	return err
}
