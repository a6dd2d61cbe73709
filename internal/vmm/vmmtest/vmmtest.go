// Package vmmtest is the conformance suite of the driver seam
// (internal/vmm), in the pattern of containerd's snapshotter test suite:
// one exported Suite runs the behaviour the lifecycle code relies on
// against any vmm.Driver, so that every driver (qemu, and the FAKE
// driver of internal/vmm/fake) is held to the same contract. Abilities a
// driver may lack (vmm.BootReporter, vmm.UsageReporter, vmm.Pauser,
// vmm.Snapshotter, vmm.SnapshotSealer, vmm.StrayKiller) have their own
// cases, skipped for a driver without
// them.
//
// The suite starts two machines (the second restored from a snapshot of
// the first when the driver can snapshot, else booted): real VMs cost a
// boot each. Tests only.
package vmmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/agent/client"
	"github.com/airlock-run/airlock/internal/vmm"
)

// Harness is a driver's test set-up.
type Harness struct {
	// Driver is the driver under test.
	Driver vmm.Driver
	// Spec returns the spec of a new box id in dir (it exists, empty): a
	// small machine without network or volumes. Every box of the suite
	// gets the same CPUs and memory (a restore needs them).
	Spec func(t *testing.T, id, dir string) vmm.Spec
	// Prepare, when set, is called before Create of a booted (not
	// restored) box: it makes what the lifecycle code makes first (for a
	// disk-booting driver, the empty writable layer Spec.Disks names).
	Prepare func(t *testing.T, spec vmm.Spec)
	// Files returns a directory, as the machine of spec's box sees it,
	// whose files live on the box's writable layer ("/root" in a VM).
	Files func(spec vmm.Spec) string
	// BootTimeout bounds a machine's start to its agent's answer (0:
	// one minute).
	BootTimeout time.Duration
}

// Suite runs the driver conformance cases against h's driver, as subtests
// of t, in order: each builds on the machines the earlier ones left, and
// the first failure ends the suite. Every machine it starts is killed by
// the time it returns.
func Suite(t *testing.T, h Harness) {
	s := &suite{h: h}
	if s.h.BootTimeout == 0 {
		s.h.BootTimeout = time.Minute
	}
	t.Cleanup(s.cleanup)
	for _, c := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"Create", s.create},
		{"Start", s.start},
		{"BootInfo", s.bootInfo},
		{"DialAgentExec", s.dialExec},
		{"Console", s.console},
		{"Attach", s.attach},
		{"AttachStale", s.attachStale},
		{"Usage", s.usage},
		{"PauseResume", s.pauseResume},
		{"Snapshot", s.snapshot},
		{"SnapshotWhilePaused", s.snapshotPaused},
		{"SecondMachine", s.second},
		{"Quit", s.quit},
		{"KillAndDeath", s.killDeath},
		{"Remove", s.remove},
	} {
		if !t.Run(c.name, c.run) {
			t.FailNow()
		}
	}
}

// box is a box of the suite and its current machine.
type box struct {
	spec vmm.Spec
	m    vmm.Machine
	c    *client.Client // a connection to m's agent
}

type suite struct {
	h    Harness
	a, b box    // the first box; the second (restored or booted)
	snap string // a snapshot of a, when the driver can take one
}

// newBox returns the spec of a new box in a directory of its own.
func (s *suite) newBox(t *testing.T) vmm.Spec {
	var r [6]byte
	rand.Read(r[:])
	id := hex.EncodeToString(r[:])
	dir, err := os.MkdirTemp("", "vmmtest-")
	if err != nil {
		t.Fatal(err)
	}
	return s.h.Spec(t, id, dir)
}

func (s *suite) cleanup() {
	for _, b := range []*box{&s.a, &s.b} {
		if b.c != nil {
			b.c.Close()
		}
		if b.m != nil {
			b.m.Kill()
			b.m.Release()
		}
		if b.spec.Dir != "" {
			removeDir(b.spec.Dir)
		}
	}
	if s.snap != "" {
		os.RemoveAll(s.snap)
	}
}

// dial connects to m's agent, waiting up to the boot timeout.
func (s *suite) dial(t *testing.T, m vmm.Machine) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.h.BootTimeout)
	defer cancel()
	c, err := m.DialAgent(ctx)
	if err != nil {
		t.Fatalf("dial the agent of machine %+v: %v\nconsole:\n%s", m.Handle(), err, m.Console(20))
	}
	return c
}

// sh runs script in the machine behind c and returns its stdout and exit
// code.
func sh(ctx context.Context, c *client.Client, script string) (string, int, error) {
	var out, errb bytes.Buffer
	p, err := c.Exec(ctx, client.Spec{Argv: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}, &out, &errb)
	if err != nil {
		return "", 0, err
	}
	x, err := p.Wait()
	if err != nil {
		return "", 0, err
	}
	if x.Code != 0 && errb.Len() > 0 {
		return out.String(), x.Code, fmt.Errorf("exit %d: %s", x.Code, strings.TrimSpace(errb.String()))
	}
	return out.String(), x.Code, nil
}

// mustSh is sh that fails t unless script exits 0.
func mustSh(t *testing.T, c *client.Client, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, code, err := sh(ctx, c, script)
	if err != nil || code != 0 {
		t.Fatalf("exec %q: exit %d, %v", script, code, err)
	}
	return out
}

// waitExit waits up to d for m's Exited channel.
func waitExit(t *testing.T, m vmm.Machine, d time.Duration) {
	t.Helper()
	select {
	case <-m.Exited():
	case <-time.After(d):
		t.Fatalf("machine %+v: Exited not closed after %s", m.Handle(), d)
	}
	if m.Alive() {
		t.Fatalf("machine %+v: Exited closed but Alive", m.Handle())
	}
}

// Create prepares a box directory.
func (s *suite) create(t *testing.T) {
	if s.h.Driver.Name() == "" {
		t.Error("Name is empty")
	}
	s.a.spec = s.newBox(t)
	s.prepare(t, s.a.spec)
	if err := s.h.Driver.Create(context.Background(), s.a.spec); err != nil {
		t.Fatal(err)
	}
}

// Start returns a running machine with a handle that names its process.
func (s *suite) start(t *testing.T) {
	m, err := s.h.Driver.Start(context.Background(), s.a.spec)
	if err != nil {
		t.Fatal(err)
	}
	s.a.m = m
	h := m.Handle()
	if h.PID <= 0 || h.Start == 0 || !h.Alive() || !m.Alive() {
		t.Fatalf("handle %+v of a started machine: want its running process", h)
	}
	select {
	case <-m.Exited():
		t.Fatalf("Exited closed for a running machine; console:\n%s", m.Console(20))
	default:
	}
}

// BootInfo says what the machines boot with.
func (s *suite) bootInfo(t *testing.T) {
	r, ok := s.h.Driver.(vmm.BootReporter)
	if !ok {
		t.Skip("the driver is no vmm.BootReporter")
	}
	bi, err := r.BootInfo()
	if err != nil {
		t.Fatal(err)
	}
	if bi.Accel == "" || bi.Kernel == "" {
		t.Fatalf("BootInfo %+v: want the accelerator and the kernel", bi)
	}
}

// DialAgent connects to the agent, more than once, and commands run with
// their output and exit codes.
func (s *suite) dialExec(t *testing.T) {
	s.a.c = s.dial(t, s.a.m)
	if got := mustSh(t, s.a.c, "echo hello; echo oops >&2"); got != "hello\n" {
		t.Errorf("stdout %q, want hello", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, code, _ := sh(ctx, s.a.c, "exit 3"); code != 3 {
		t.Errorf("exit code %d, want 3", code)
	}
	// A second connection at the same time: each DialAgent is its own.
	c2 := s.dial(t, s.a.m)
	defer c2.Close()
	if got := mustSh(t, c2, "echo two"); got != "two\n" {
		t.Errorf("second connection: stdout %q", got)
	}
	if _, err := s.a.c.Hello(ctx); err != nil {
		t.Errorf("first connection after the second: %v", err)
	}
}

// Console holds this boot's output.
func (s *suite) console(t *testing.T) {
	c := s.a.m.Console(5)
	if strings.TrimSpace(c) == "" {
		t.Fatal("the console of a booted machine is empty")
	}
	if n := strings.Count(strings.TrimRight(c, "\n"), "\n") + 1; n > 5 {
		t.Errorf("Console(5) returned %d lines", n)
	}
}

// Attach, as another process does with the handle of a record, finds the
// running machine: same handle, alive, its agent answers.
func (s *suite) attach(t *testing.T) {
	h := s.a.m.Handle()
	m := s.h.Driver.Attach(s.a.spec, h)
	if m.Handle() != h || !m.Alive() {
		t.Fatalf("attached machine: handle %+v alive %v, want %+v alive", m.Handle(), m.Alive(), h)
	}
	c := s.dial(t, m)
	defer c.Close()
	if got := mustSh(t, c, "echo attached"); got != "attached\n" {
		t.Errorf("stdout %q", got)
	}
}

// Attach with a handle whose process is gone (the pid reused by another
// process: another start time) gives a machine that is not alive and has
// exited.
func (s *suite) attachStale(t *testing.T) {
	h := s.a.m.Handle()
	h.Start++
	m := s.h.Driver.Attach(s.a.spec, h)
	if m.Alive() {
		t.Fatal("a machine whose process start time differs is alive")
	}
	waitExit(t, m, 5*time.Second)
	if !s.a.m.Alive() {
		t.Fatal("the real machine died")
	}
}

// Usage counts the machine, with its memory.
func (s *suite) usage(t *testing.T) {
	u, ok := s.h.Driver.(vmm.UsageReporter)
	if !ok {
		t.Skip("the driver is no vmm.UsageReporter")
	}
	// Other machines on the host may come and go meanwhile: read until
	// the counts with and without this box each read the same twice in a
	// row.
	var all, without vmm.Usage
	for try := 0; try < 50; try++ {
		all, without = u.Usage(""), u.Usage(s.a.spec.ID)
		if u.Usage("") == all && u.Usage(s.a.spec.ID) == without {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := (vmm.Usage{Machines: all.Machines - without.Machines, MemoryMiB: all.MemoryMiB - without.MemoryMiB}); d != (vmm.Usage{Machines: 1, MemoryMiB: s.a.spec.MemoryMiB}) {
		t.Fatalf("Usage(\"\") %+v, Usage(this box) %+v: differ by %+v, want this machine (1, %d MiB)", all, without, d, s.a.spec.MemoryMiB)
	}
}

// Pause stops the machine: its agent answers nothing until Resume; both
// are reported by Paused; resuming a running machine does nothing.
func (s *suite) pauseResume(t *testing.T) {
	p, ok := s.h.Driver.(vmm.Pauser)
	if !ok {
		t.Skip("the driver is no vmm.Pauser")
	}
	ctx := context.Background()
	spec, h := s.a.spec, s.a.m.Handle()
	if on, err := p.Paused(ctx, spec, h); err != nil || on {
		t.Fatalf("Paused of a running machine: %v, %v", on, err)
	}
	if err := p.Resume(ctx, spec, h); err != nil {
		t.Fatalf("Resume of a running machine: %v", err)
	}
	if err := p.Pause(ctx, spec, h); err != nil {
		t.Fatal(err)
	}
	if on, err := p.Paused(ctx, spec, h); err != nil || !on {
		t.Fatalf("Paused after Pause: %v, %v", on, err)
	}
	// A command sent now does not run before Resume.
	done := make(chan error, 1)
	go func() {
		_, _, err := sh(ctx, s.a.c, "echo ran")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a command ran in a paused machine: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if !s.a.m.Alive() {
		t.Fatal("a paused machine is not alive")
	}
	if err := p.Resume(ctx, spec, h); err != nil {
		t.Fatal(err)
	}
	if on, err := p.Paused(ctx, spec, h); err != nil || on {
		t.Fatalf("Paused after Resume: %v, %v", on, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the command sent while paused, after Resume: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the command sent while paused did not end after Resume")
	}
}

// mark writes the marker file of the box behind c.
func (s *suite) mark(t *testing.T, c *client.Client, spec vmm.Spec, v string) {
	t.Helper()
	mustSh(t, c, fmt.Sprintf("echo %s > %s/vmmtest-mark", v, s.h.Files(spec)))
}

func (s *suite) readMark(t *testing.T, c *client.Client, spec vmm.Spec) string {
	t.Helper()
	return strings.TrimSpace(mustSh(t, c, "cat "+s.h.Files(spec)+"/vmmtest-mark"))
}

// SaveSnapshot saves the running machine, which runs on, with its
// writable layer as it was: what the box writes afterwards is not in the
// snapshot.
func (s *suite) snapshot(t *testing.T) {
	sn, ok := s.h.Driver.(vmm.Snapshotter)
	if !ok {
		t.Skip("the driver is no vmm.Snapshotter")
	}
	ctx := context.Background()
	s.mark(t, s.a.c, s.a.spec, "before")
	dir, err := os.MkdirTemp("", "vmmtest-snap-")
	if err != nil {
		t.Fatal(err)
	}
	s.snap = dir
	st, err := sn.SaveSnapshot(ctx, s.a.spec, s.a.m.Handle(), dir, vmm.SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.StateBytes <= 0 || st.DiskBytes < 0 || st.PausedNs <= 0 {
		t.Errorf("stats %+v: want the state's bytes and the time paused", st)
	}
	if p, ok := s.h.Driver.(vmm.Pauser); ok {
		if on, err := p.Paused(ctx, s.a.spec, s.a.m.Handle()); err != nil || on {
			t.Fatalf("Paused after a snapshot of a running machine: %v, %v", on, err)
		}
	}
	s.mark(t, s.a.c, s.a.spec, "after")
	if err := sn.CheckSnapshot(s.a.spec, dir); err != nil {
		t.Fatalf("CheckSnapshot for the same machine: %v", err)
	}
	// Sealed for another host, it still restores here (SecondMachine).
	if sl, ok := s.h.Driver.(vmm.SnapshotSealer); ok {
		if err := sl.SealSnapshot(ctx, dir); err != nil {
			t.Fatal(err)
		}
		if err := sn.CheckSnapshot(s.a.spec, dir); err != nil {
			t.Fatalf("CheckSnapshot of the sealed snapshot: %v", err)
		}
	}
	other := s.a.spec
	other.MemoryMiB *= 2
	if err := sn.CheckSnapshot(other, dir); err == nil {
		t.Errorf("CheckSnapshot for a machine with %d MiB of a snapshot of one with %d: no error", other.MemoryMiB, s.a.spec.MemoryMiB)
	}
	if err := sn.CheckSnapshot(s.a.spec, t.TempDir()); err == nil {
		t.Error("CheckSnapshot of an empty directory: no error")
	}
}

// SaveSnapshot of a paused machine leaves it paused (Suspend saves a
// machine it paused first, which must not run again).
func (s *suite) snapshotPaused(t *testing.T) {
	sn, ok := s.h.Driver.(vmm.Snapshotter)
	p, ok2 := s.h.Driver.(vmm.Pauser)
	if !ok || !ok2 {
		t.Skip("the driver is no vmm.Snapshotter and vmm.Pauser")
	}
	ctx := context.Background()
	spec, h := s.a.spec, s.a.m.Handle()
	if err := p.Pause(ctx, spec, h); err != nil {
		t.Fatal(err)
	}
	defer p.Resume(ctx, spec, h)
	if _, err := sn.SaveSnapshot(ctx, spec, h, t.TempDir(), vmm.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if on, err := p.Paused(ctx, spec, h); err != nil || !on {
		t.Fatalf("Paused after a snapshot of a paused machine: %v, %v", on, err)
	}
	if err := p.Resume(ctx, spec, h); err != nil {
		t.Fatal(err)
	}
	if got := s.readMark(t, s.a.c, spec); got != "after" {
		t.Fatalf("marker %q after resume, want after", got)
	}
}

// A second box: restored from the snapshot (its own copy of the writable
// layer as it was at the snapshot; the snapshot's directory may go once it
// started) or, for a driver without snapshots, booted. Two machines run
// side by side.
func (s *suite) second(t *testing.T) {
	ctx := context.Background()
	s.b.spec = s.newBox(t)
	sn, ok := s.h.Driver.(vmm.Snapshotter)
	if !ok || s.snap == "" {
		s.prepare(t, s.b.spec)
		if err := s.h.Driver.Create(ctx, s.b.spec); err != nil {
			t.Fatal(err)
		}
		m, err := s.h.Driver.Start(ctx, s.b.spec)
		if err != nil {
			t.Fatal(err)
		}
		s.b.m = m
		s.b.c = s.dial(t, m)
		mustSh(t, s.b.c, "true")
	} else {
		if err := sn.CreateFromSnapshot(ctx, s.b.spec, s.snap); err != nil {
			t.Fatal(err)
		}
		m, err := sn.StartFromSnapshot(ctx, s.b.spec, s.snap)
		if err != nil {
			t.Fatal(err)
		}
		s.b.m = m
		if err := os.RemoveAll(s.snap); err != nil {
			t.Fatal(err)
		}
		s.b.c = s.dial(t, m)
		if got := s.readMark(t, s.b.c, s.b.spec); got != "before" {
			t.Errorf("the restored box's marker %q, want before (as at the snapshot)", got)
		}
		s.mark(t, s.b.c, s.b.spec, "restored")
		if got := s.readMark(t, s.a.c, s.a.spec); got != "after" {
			t.Errorf("the first box's marker %q after the restored box wrote its own, want after", got)
		}
	}
	if s.b.m.Handle() == s.a.m.Handle() || !s.a.m.Alive() || !s.b.m.Alive() {
		t.Fatalf("two machines %+v and %+v: want two running processes", s.a.m.Handle(), s.b.m.Handle())
	}
}

// Quit ends the machine without the guest's help (the agent still
// runs): Exited is closed, Alive false, and Release may be called more
// than once.
func (s *suite) quit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.b.m.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	waitExit(t, s.b.m, 30*time.Second)
	s.b.m.Release()
	s.b.m.Release()
	if !s.a.m.Alive() {
		t.Fatal("quitting one machine ended the other")
	}
	// Its agent connection ends with it.
	select {
	case <-s.b.c.Done():
	case <-time.After(30 * time.Second):
		t.Error("the connection to a quit machine's agent did not end")
	}
}

// A machine killed from outside (KillStray when the driver finds strays,
// else Kill) is reported by Exited and by an Attach from its handle, and
// Death names its process; a command in flight fails.
func (s *suite) killDeath(t *testing.T) {
	h := s.a.m.Handle()
	watcher := s.h.Driver.Attach(s.a.spec, h)
	exited := watcher.Exited()
	ctx := context.Background()
	inFlight := make(chan error, 1)
	go func() {
		_, _, err := sh(ctx, s.a.c, "sleep 30")
		inFlight <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if k, ok := s.h.Driver.(vmm.StrayKiller); ok {
		// A start cut short before its handle was recorded: the driver
		// finds the machine from the box directory alone.
		if err := k.KillStray(s.a.spec); err != nil {
			t.Fatal(err)
		}
	} else if err := s.a.m.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("a watcher's Exited not closed after the kill")
	}
	waitExit(t, s.a.m, 5*time.Second)
	if watcher.Alive() || h.Alive() {
		t.Fatal("a killed machine is alive")
	}
	d := s.a.m.Death()
	if !strings.Contains(d.Cause, strconv.Itoa(h.PID)) {
		t.Errorf("Death().Cause %q: want it to name process %d", d.Cause, h.PID)
	}
	select {
	case err := <-inFlight:
		if err == nil {
			t.Error("a command in flight when the machine died succeeded")
		}
	case <-time.After(time.Minute):
		t.Error("a command in flight when the machine died did not end")
	}
	s.a.m.Release()
	if err := s.a.m.Kill(); err != nil {
		t.Errorf("Kill of an ended machine: %v", err)
	}
	if k, ok := s.h.Driver.(vmm.StrayKiller); ok {
		if err := k.KillStray(s.a.spec); err != nil {
			t.Errorf("KillStray with no machine left: %v", err)
		}
	}
}

// removeDir removes dir, trying again for up to 5 s: a driver may still
// record how a machine ended there for a moment after its end (QEMU's
// launcher writes the exit record of a confined QEMU once it reaped it).
func removeDir(dir string) error {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := os.RemoveAll(dir)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// Once its machines ended and were released, a box directory can be
// removed, and nothing of the box makes it again.
func (s *suite) remove(t *testing.T) {
	for _, b := range []*box{&s.a, &s.b} {
		b.c.Close()
		if err := removeDir(b.spec.Dir); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, b := range []*box{&s.a, &s.b} {
		if _, err := os.Stat(b.spec.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("box directory %s is back after its removal: %v", filepath.Base(b.spec.Dir), err)
		}
	}
}

// prepare calls the harness's Prepare for a booted box's spec.
func (s *suite) prepare(t *testing.T, spec vmm.Spec) {
	if s.h.Prepare != nil {
		s.h.Prepare(t, spec)
	}
}
