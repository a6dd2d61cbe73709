package airlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// sh runs script in b and returns its stdout, failing t on a non-zero exit.
func shIn(t testing.TB, b *airlock.Box, script string) string {
	t.Helper()
	res, err := b.Exec(context.Background(), "sh", []string{"-c", script}, airlock.ExecOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatalf("box %s: exec %q: %v", b.ID(), script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("box %s: exec %q: exit %d, stdout %q, stderr %q", b.ID(), script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return strings.TrimSpace(string(res.Stdout))
}

// holder is a Python process, started in the background, that keeps a
// random value in memory only and writes it to /root/v on SIGUSR1: a box
// that answers with the value the process drew before the snapshot has
// that process's memory.
const holder = `setsid python3 -c '
import os, signal, time
v = os.urandom(8).hex()
signal.signal(signal.SIGUSR1, lambda *a: open("/root/v", "w").write(v))
open("/root/drawn", "w").write(v)
while True: time.sleep(1)
' </dev/null >/dev/null 2>&1 &
echo $! > /root/holder.pid
while [ ! -s /root/drawn ]; do sleep 0.05; done; cat /root/drawn`

// askHolder signals b's holder process and returns the value it writes.
func askHolder(t *testing.T, b *airlock.Box) string {
	t.Helper()
	return shIn(t, b, `rm -f /root/v; kill -USR1 "$(cat /root/holder.pid)" || exit 1
for i in $(seq 100); do [ -s /root/v ] && break; sleep 0.05; done; cat /root/v`)
}

// TestSnapshotQEMU: a snapshot of a running box restores with its files,
// its running processes and their memory; each restored box has its own
// RNG output, the host's time, its own hostname and its own writable
// layer; Fork does the same for N children; a snapshot whose image is gone
// is refused clearly; removing a snapshot leaves its boxes working; a
// paused box uses no CPU.
func TestSnapshotQEMU(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	home := t.TempDir()
	r := openRuntime(t, home)
	parent, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { parent.Remove(context.Background(), true) })
	shIn(t, parent, "echo before > /root/f")
	drawn := shIn(t, parent, holder)
	// A read now makes the kernel reseed its CRNG if its seed is old: the
	// restored boxes' first reads then come before the next reseed the
	// kernel would make by itself, so only the host's reseed tells them
	// apart.
	shIn(t, parent, "head -c 1 /dev/urandom >/dev/null")

	rssBefore := qemuRSS(t, parent)
	snap, err := parent.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot reads the box's RAM without making it resident (it
	// used to: QEMU read every page of its memfds, 96 -> 582 MiB).
	if rssAfter := qemuRSS(t, parent); rssAfter-rssBefore > 128<<10 {
		t.Errorf("the box's QEMU grew from %d to %d KiB resident with the snapshot", rssBefore, rssAfter)
	}
	t.Logf("snapshot: state %d bytes, disk %d bytes, paused %s", snap.StateBytes, snap.DiskBytes, snap.Paused)
	if snap.StateBytes <= 0 || snap.DiskBytes <= 0 || snap.ImageDigest == "" || snap.AgentVersion == "" {
		t.Fatalf("snapshot info: %+v", snap)
	}
	if _, err := parent.Snapshot(ctx, "s1"); !errors.Is(err, airlock.ErrSnapshotExists) {
		t.Fatalf("second snapshot of the same name: %v", err)
	}
	if list, err := r.Snapshots(ctx); err != nil || len(list) != 1 || list[0].Name != "s1" {
		t.Fatalf("snapshots: %+v %v", list, err)
	}
	// The parent runs on; what it does now is not in the snapshot.
	shIn(t, parent, "echo after > /root/after")
	if got := askHolder(t, parent); got != drawn {
		t.Fatalf("parent's process after the snapshot: %q, want %q", got, drawn)
	}
	// Let the snapshot's clock fall behind the host's.
	time.Sleep(2 * time.Second)

	restore := func(t *testing.T) *airlock.Box {
		t.Helper()
		b, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Remove(context.Background(), true) })
		return b
	}
	restore2 := func(t *testing.T, name string) *airlock.Box {
		t.Helper()
		b, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Remove(context.Background(), true) })
		return b
	}
	c1 := restore(t)
	rnd1 := shIn(t, c1, `head -c 16 /dev/urandom | od -An -tx1; python3 -c 'import os; print(os.urandom(16).hex())'; date +%s.%N`)
	c2 := restore(t)
	rnd2 := shIn(t, c2, `head -c 16 /dev/urandom | od -An -tx1; python3 -c 'import os; print(os.urandom(16).hex())'; date +%s.%N`)

	t.Run("restored boxes have the snapshot's files and processes", func(t *testing.T) {
		for _, c := range []*airlock.Box{c1, c2} {
			if got := shIn(t, c, "cat /root/f; test ! -e /root/after && echo no-after"); got != "before\nno-after" {
				t.Errorf("box %s: files: %q", c.ID(), got)
			}
			if got := askHolder(t, c); got != drawn {
				t.Errorf("box %s: the process running at snapshot time answered %q, want %q", c.ID(), got, drawn)
			}
			checkRestoredHostname(t, c)
		}
	})
	t.Run("restored boxes read different random bytes", func(t *testing.T) {
		l1, l2 := strings.Split(rnd1, "\n"), strings.Split(rnd2, "\n")
		if len(l1) != 3 || len(l2) != 3 {
			t.Fatalf("output: %q %q", rnd1, rnd2)
		}
		if l1[0] == l2[0] {
			t.Errorf("/dev/urandom gave both boxes %s", l1[0])
		}
		if l1[1] == l2[1] {
			t.Errorf("os.urandom gave both boxes %s", l1[1])
		}
	})
	t.Run("the clock of a restored box is the host's", func(t *testing.T) {
		got := shIn(t, c2, "date +%s.%N")
		host := float64(time.Now().UnixNano()) / 1e9
		guest, err := strconv.ParseFloat(got, 64)
		if err != nil {
			t.Fatal(err)
		}
		if d := host - guest; d > 1 || d < -1 {
			t.Errorf("guest clock %.3f, host %.3f: %.3f s apart", guest, host, d)
		}
	})
	t.Run("restored boxes have their own writable layers", func(t *testing.T) {
		shIn(t, c1, "echo one > /root/c1")
		shIn(t, c2, "echo two > /root/c2")
		if got := shIn(t, c1, "cat /root/c1; test ! -e /root/c2 && echo alone"); got != "one\nalone" {
			t.Errorf("c1: %q", got)
		}
		if got := shIn(t, c2, "cat /root/c2; test ! -e /root/c1 && echo alone"); got != "two\nalone" {
			t.Errorf("c2: %q", got)
		}
		if got := shIn(t, parent, "test ! -e /root/c1 && test ! -e /root/c2 && echo alone"); got != "alone" {
			t.Errorf("parent: %q", got)
		}
	})
	t.Run("a snapshot whose image is gone is refused", func(t *testing.T) {
		// The same home with an image store that lacks the image.
		r2, err := airlock.Open(airlock.Options{Home: home, ImagesDir: t.TempDir(), Warn: func(string) {}})
		if err != nil {
			t.Fatal(err)
		}
		defer r2.Close()
		_, err = r2.Create(ctx, airlock.BoxOptions{FromSnapshot: "s1"})
		if !errors.Is(err, airlock.ErrImageNotFound) || !strings.Contains(err.Error(), "no longer in the image store") {
			t.Fatalf("restore without its image: %v", err)
		}
		if _, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "nope"}); !errors.Is(err, airlock.ErrSnapshotNotFound) {
			t.Fatalf("restore of a missing snapshot: %v", err)
		}
		if _, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "s1", MemoryMiB: 1024}); err == nil || !strings.Contains(err.Error(), "MemoryMiB") {
			t.Fatalf("restore with other memory: %v", err)
		}
	})
	t.Run("a damaged snapshot says what QEMU refused", func(t *testing.T) {
		if _, err := parent.Snapshot(ctx, "damaged"); err != nil {
			t.Fatal(err)
		}
		defer r.RemoveSnapshot(ctx, "damaged")
		state := filepath.Join(home, "snapshots", "damaged", "state")
		fi, err := os.Stat(state)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(state, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
		_, err = r.Create(ctx, airlock.BoxOptions{FromSnapshot: "damaged"})
		if err == nil || !strings.Contains(err.Error(), "QEMU exited while loading the snapshot") || !strings.Contains(err.Error(), "qemu-system") {
			t.Fatalf("restore of a truncated state: %v", err)
		}
		t.Logf("restore of a truncated state: %v", err)
	})
	t.Run("a restored box is snapshotted and restored again", func(t *testing.T) {
		if _, err := c2.Snapshot(ctx, "s2"); err != nil {
			t.Fatal(err)
		}
		defer r.RemoveSnapshot(ctx, "s2")
		c3 := restore2(t, "s2")
		if got := shIn(t, c3, "cat /root/f /root/c2"); got != "before\ntwo" {
			t.Errorf("c3 files: %q", got)
		}
		if got := askHolder(t, c3); got != drawn {
			t.Errorf("c3: the process answered %q, want %q", got, drawn)
		}
		checkRestoredHostname(t, c3)
	})
	t.Run("a restored box takes the caller's hostname and network policy", func(t *testing.T) {
		// They were dropped: `run --from s1 --allow-net pypi.org` ran
		// with the snapshot's public network, and --hostname was ignored.
		b, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "s1", Hostname: "own-host", AllowNet: []string{"pypi.org"}})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Remove(context.Background(), true)
		if got := shIn(t, b, "hostname; getent hosts example.com || echo refused"); got != "own-host\nrefused" {
			t.Errorf("hostname, lookup of an unlisted name: %q", got)
		}
		// The box's own helper refused the unlisted name (its policy is
		// the caller's allowlist, not the snapshot's public network).
		if st, err := b.NetworkStats(ctx); err != nil || st.Denied == 0 {
			t.Errorf("network stats after a lookup of an unlisted name: %+v %v; want it denied", st, err)
		}
		v, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "s1", Volumes: []airlock.Volume{{Source: t.TempDir(), Target: "/mnt"}}})
		if v != nil {
			v.Remove(context.Background(), true)
		}
		if !errors.Is(err, airlock.ErrInvalidArgument) {
			t.Errorf("restore with a volume: %v, want ErrInvalidArgument", err)
		}
	})
	t.Run("removing a snapshot leaves its boxes working", func(t *testing.T) {
		if err := r.RemoveSnapshot(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Snapshot(ctx, "s1"); !errors.Is(err, airlock.ErrSnapshotNotFound) {
			t.Fatalf("removed snapshot: %v", err)
		}
		if got := shIn(t, c1, "cat /root/f /root/c1"); got != "before\none" {
			t.Errorf("c1 after the removal: %q", got)
		}
		// A restored box boots from its own writable layer next time.
		if err := c1.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c1.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got := shIn(t, c1, "cat /root/f /root/c1"); got != "before\none" {
			t.Errorf("c1 booted again: %q", got)
		}
	})
	t.Run("fork", func(t *testing.T) {
		kids, err := parent.Fork(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range kids {
			t.Cleanup(func() { k.Remove(context.Background(), true) })
		}
		if len(kids) != 2 || kids[0].ID() == kids[1].ID() {
			t.Fatalf("children: %v", kids)
		}
		for i, k := range kids {
			if got := shIn(t, k, "cat /root/f /root/after"); got != "before\nafter" {
				t.Errorf("child %d files: %q", i, got)
			}
			if got := askHolder(t, k); got != drawn {
				t.Errorf("child %d: process answered %q, want %q", i, got, drawn)
			}
			shIn(t, k, "echo "+strconv.Itoa(i)+" > /root/kid"+strconv.Itoa(i))
		}
		for i, k := range kids {
			other := "/root/kid" + strconv.Itoa(1-i)
			if got := shIn(t, k, "cat /root/kid"+strconv.Itoa(i)+"; test ! -e "+other+" && echo alone"); got != strconv.Itoa(i)+"\nalone" {
				t.Errorf("child %d: %q", i, got)
			}
		}
		// The children map the snapshot's RAM image copy-on-write: the
		// pages both have touched (the same guest code and page cache:
		// the agent, sh, python3) are one host page mapped by both QEMUs.
		for i, k := range kids {
			shIn(t, k, "python3 -c 'import json, os; print(os.getpid())'")
			info, err := k.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rss, shared := ramImageMapping(t, info.PID)
			t.Logf("child %d: RAM image mapped: %d KiB resident, %d KiB of it shared with another QEMU", i, rss, shared)
			if shared < 1024 {
				t.Errorf("child %d: its QEMU shares %d KiB of the RAM image's pages with its sibling (resident %d KiB), want >= 1 MiB: no copy-on-write sharing", i, shared, rss)
			}
		}
		// A child forks again: its RAM is a private mapping (no RAM image),
		// all of it goes into the stream (it used to fail to restore:
		// "Capability x-ignore-shared is off, but received capability is
		// on", the child's QEMU kept the capability of its own restore).
		grand, err := kids[0].Fork(ctx, 1)
		if err != nil {
			t.Fatalf("fork of a fork child: %v", err)
		}
		t.Cleanup(func() { grand[0].Remove(context.Background(), true) })
		if got := shIn(t, grand[0], "cat /root/kid0"); got != "0" {
			t.Errorf("grandchild's file: %q", got)
		}
		if list, _ := r.Snapshots(ctx); len(list) != 0 {
			t.Errorf("fork left snapshots behind: %+v", list)
		}
		if got := shIn(t, parent, "echo parent-ok"); got != "parent-ok" {
			t.Errorf("parent after fork: %q", got)
		}
	})
	t.Run("cli", func(t *testing.T) {
		images := vmtest.ImagesDir()
		t.Setenv("AIRLOCK_HOME", home)
		t.Setenv("AIRLOCK_IMAGES", images)
		if out, errs, err := runCLI("snapshot", "create", parent.ID(), "cli"); err != nil || out != "cli\n" {
			t.Fatalf("snapshot create: %q %q %v", out, errs, err)
		}
		if out, errs, err := runCLI("snapshot", "ls"); err != nil || !strings.Contains(out, "cli") || !strings.Contains(out, parent.ID()) {
			t.Fatalf("snapshot ls: %q %q %v", out, errs, err)
		}
		if out, errs, err := runCLI("run", "--rm", "--from", "cli", "cat", "/root/f", "/root/after"); err != nil || out != "before\nafter\n" {
			t.Fatalf("run --from: %q %q %v", out, errs, err)
		}
		if _, errs, err := runCLI("run", "--from", "nope", "true"); err == nil || !strings.Contains(errs, "snapshot not found") || !strings.Contains(errs, "snapshot ls") {
			t.Fatalf("run --from a missing snapshot: %q %v", errs, err)
		}
		// The image given out of habit after --from was run as the
		// command ("python:slim: command not found", exit 127).
		if _, errs, err := runCLI("run", "--rm", "--from", "cli", vmtest.DefaultImage, "true"); err == nil || !strings.Contains(err.Error()+errs, "leave the image out") {
			t.Errorf("run --from SNAP IMAGE: %q %v; want a usage error", errs, err)
		}
		if out, errs, err := runCLI("snapshot", "rm", "cli"); err != nil || out != "cli\n" {
			t.Fatalf("snapshot rm: %q %q %v", out, errs, err)
		}
		out, errs, err := runCLI("fork", parent.ID(), "-n", "2")
		if err != nil {
			t.Fatalf("fork: %q %q %v", out, errs, err)
		}
		ids := strings.Fields(out)
		if len(ids) != 2 {
			t.Fatalf("fork -n 2 printed %q", out)
		}
		for _, id := range ids {
			k, err := r.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if got := shIn(t, k, "cat /root/f"); got != "before" {
				t.Errorf("forked box %s: %q", id, got)
			}
			k.Remove(ctx, true)
		}
	})
	t.Run("pause", func(t *testing.T) {
		shIn(t, c2, "setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $! > /root/spin")
		info, err := c2.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c2.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if p, err := c2.Paused(ctx); err != nil || !p {
			t.Fatalf("paused: %v %v", p, err)
		}
		paused := cpuOver(t, info.PID, time.Second)
		images := vmtest.ImagesDir() // before AIRLOCK_HOME changes it
		t.Setenv("AIRLOCK_HOME", home)
		t.Setenv("AIRLOCK_IMAGES", images)
		// Another process snapshots the paused box (its agent cannot
		// answer a new connection: this waited 30 s and failed), and the
		// box stays paused (QEMU's state after it is "postmigrate", which
		// Paused did not count: the box looked running, its followers
		// took it for dead).
		t0 := time.Now()
		if out, errs, err := runCLI("snapshot", "create", c2.ID(), "of-paused"); err != nil || out != "of-paused\n" {
			t.Fatalf("snapshot create of a paused box: %q %q %v", out, errs, err)
		}
		t.Logf("snapshot of a paused box from another process: %s", time.Since(t0).Round(time.Millisecond))
		r.RemoveSnapshot(ctx, "of-paused")
		if p, err := c2.Paused(ctx); err != nil || !p {
			t.Fatalf("paused after a snapshot: %v %v", p, err)
		}
		if out, errs, err := runCLI("ls", "--format", "{{.ID}} {{.Status}}"); err != nil || !strings.Contains(out, c2.ID()+" Up ") || !strings.Contains(out, "(Paused)") {
			t.Errorf("ls of a paused box: %q %q %v", out, errs, err)
		}
		// Another runtime (the CLI's) asks QEMU before it dials the
		// agent: exec and cp are refused at once with the paused error,
		// one line naming airlock unpause and no second hint (the
		// handshake waited about 31 s, then said so with the dial's
		// error appended after "Box.Resume)").
		for _, args := range [][]string{{"exec", c2.ID(), "true"}, {"cp", c2.ID() + ":/etc/hostname", filepath.Join(t.TempDir(), "h")}} {
			_, errs, err := runCLI(args...)
			text := strings.TrimSpace(errs) // exec prints its error; cp returns it to main, which prints it
			if text == "" && err != nil {
				text = err.Error()
			}
			if err == nil || strings.Contains(text, "\n") || !strings.Contains(text, "box is paused") ||
				!strings.Contains(text, "airlock unpause "+c2.ID()) || !strings.HasSuffix(text, "or Box.Resume)") {
				t.Errorf("%s in a paused box from another runtime: %q %v; want one line: box is paused ... (airlock unpause %s, or Box.Resume)", args[0], errs, err, c2.ID())
			}
		}
		if err := c2.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if out, errs, err := runCLI("exec", c2.ID(), "echo", "unpaused"); err != nil || out != "unpaused\n" {
			t.Errorf("exec after resume from another runtime: %q %q %v", out, errs, err)
		}
		running := cpuOver(t, info.PID, time.Second)
		shIn(t, c2, `kill "$(cat /root/spin)"`)
		t.Logf("QEMU CPU over 1 s: paused %s, running %s", paused, running)
		// A busy guest takes a host core when it gets one; this machine's
		// cores are shared, so only a floor is asked for.
		if paused > 40*time.Millisecond || running < 100*time.Millisecond {
			t.Errorf("QEMU used %s of CPU while paused, %s while running a busy loop", paused, running)
		}
		// A box paused in memory: a pause to disk is refused at once (its
		// sync waited 30 s), and a stop shuts it down cleanly at once (it
		// waited out the 10 s grace, then made QEMU quit).
		if err := c2.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		t0 = time.Now()
		if err := c2.Suspend(ctx); err == nil || !strings.Contains(err.Error(), "unpause it first") || time.Since(t0) > 5*time.Second {
			t.Errorf("suspend of a paused box: %v after %s; want a refusal at once", err, time.Since(t0))
		}
		t0 = time.Now()
		if err := c2.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d > 8*time.Second {
			t.Errorf("stop of a paused box took %s, want a clean shutdown (< 8 s)", d)
		}
	})
}

// cpuOver returns the CPU time process pid used during d.
func cpuOver(t *testing.T, pid int, d time.Duration) time.Duration {
	t.Helper()
	read := func() time.Duration {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		u, _ := strconv.Atoi(f[11])
		s, _ := strconv.Atoi(f[12])
		return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ 100
	}
	a := read()
	time.Sleep(d)
	return read() - a
}

// TestSnapshotFake: a driver without snapshots says so.
// checkRestoredHostname checks that restored box c has its own id as its
// hostname, in /etc/hostname and in /etc/hosts, each of the two files
// mounted once (a restore rewrites them, it does not stack mounts).
func checkRestoredHostname(t *testing.T, c *airlock.Box) {
	t.Helper()
	got := shIn(t, c, `hostname; cat /etc/hostname; grep -c "127.0.1.1	$(hostname)$" /etc/hosts; grep -c ' /etc/hostname ' /proc/self/mountinfo; grep -c ' /etc/hosts ' /proc/self/mountinfo`)
	if want := c.ID() + "\n" + c.ID() + "\n1\n1\n1"; got != want {
		t.Errorf("box %s: hostname, /etc/hostname, its /etc/hosts line, mounts of the two files: %q, want %q", c.ID(), got, want)
	}
}

func TestSnapshotFake(t *testing.T) {
	h := fakeHarness(t)
	r := h.open(t, "")
	b, err := r.Create(context.Background(), airlock.BoxOptions{Image: h.image})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Remove(context.Background(), true)
	if _, err := b.Snapshot(context.Background(), "s"); !errors.Is(err, vmm.ErrNotSupported) {
		t.Fatalf("snapshot on the fake driver: %v", err)
	}
	if _, err := b.Fork(context.Background(), 2); !errors.Is(err, vmm.ErrNotSupported) {
		t.Fatalf("fork on the fake driver: %v", err)
	}
	if err := b.Pause(context.Background()); !errors.Is(err, vmm.ErrNotSupported) {
		t.Fatalf("pause on the fake driver: %v", err)
	}
	if _, err := r.Create(context.Background(), airlock.BoxOptions{FromSnapshot: "s"}); !errors.Is(err, vmm.ErrNotSupported) {
		t.Fatalf("restore on the fake driver: %v", err)
	}
}

// ramImageMapping returns the resident and the shared (mapped by another
// process too) KiB of QEMU process pid's mappings of a snapshot's RAM
// image (internal/vmm/qemu ramimage.go: memfds named airlock-ram-image).
func ramImageMapping(t testing.TB, pid int) (rss, shared int64) {
	t.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			in = strings.Contains(l, "/memfd:airlock-ram-image")
			continue
		}
		if !in || len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			rss += v
		case "Shared_Clean:", "Shared_Dirty:":
			shared += v
		}
	}
	return rss, shared
}

// qemuRSS returns the resident KiB of b's QEMU process.
func qemuRSS(t testing.TB, b *airlock.Box) int64 {
	t.Helper()
	info, err := b.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return procKiB(t, "/proc/"+strconv.Itoa(info.PID)+"/status", "VmRSS")
}

// procKiB returns the value of key in a /proc file of "Key:  N kB"
// lines (status, smaps_rollup), in KiB.
func procKiB(t testing.TB, path, key string) int64 {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == key+":" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	t.Fatalf("no %s in %s", key, path)
	return 0
}

// rngWriter is a Python process, started in the background, that appends
// "MONOTONIC_NS RANDOM_HEX" lines to /root/r every 2 ms for as long as it
// runs.
const rngWriter = `setsid python3 -c '
import os, time
f = open("/root/r", "a", buffering=1)
while True:
    f.write("%d %s\n" % (time.monotonic_ns(), os.urandom(16).hex()))
    time.sleep(0.002)
' </dev/null >/dev/null 2>&1 &
while [ ! -s /root/r ]; do sleep 0.05; done`

// rngLines parses rngWriter's output: random value -> its timestamp.
func rngLines(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && len(f[1]) == 32 {
			m[f[1]] = f[0]
		}
	}
	return m
}

// Boxes restored from one snapshot draw no random number in common once
// they run, not even a process that was running when the snapshot was
// taken and draws the instant its box runs again: until the host's
// Restored call reseeds a restored guest's RNG, every box restored from
// the snapshot has the same RNG state. A value both boxes hold with the
// same timestamp was drawn before the snapshot (a copy); the same value at
// different times was drawn twice, after the restores.
func TestSnapshotRestoredBoxesShareNoRandomness(t *testing.T) {
	vmtest.Require(t)
	ctx := context.Background()
	r := openRuntime(t, "")
	parent, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { parent.Remove(context.Background(), true) })
	shIn(t, parent, rngWriter)
	time.Sleep(300 * time.Millisecond)
	if _, err := parent.Snapshot(ctx, "rng"); err != nil {
		t.Fatal(err)
	}
	parent.Remove(ctx, true) // its CPU goes to the restores
	var boxes []*airlock.Box
	var firsts []string
	for i := 0; i < 2; i++ {
		b, err := r.Create(ctx, airlock.BoxOptions{FromSnapshot: "rng"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Remove(context.Background(), true) })
		firsts = append(firsts, shIn(t, b, "head -c 16 /dev/urandom | od -An -tx1"))
		boxes = append(boxes, b)
	}
	if firsts[0] == firsts[1] {
		t.Fatalf("the first command of both restored boxes read the same 16 bytes from /dev/urandom: %s", firsts[0])
	}
	time.Sleep(time.Second) // the writers draw on
	a, b := rngLines(shIn(t, boxes[0], "cat /root/r")), rngLines(shIn(t, boxes[1], "cat /root/r"))
	copied, twice := 0, 0
	for v, ts := range b {
		switch ats, ok := a[v]; {
		case ok && ats == ts:
			copied++
		case ok:
			twice++
		}
	}
	t.Logf("%d values drawn before the snapshot, %d and %d in all", copied, len(a), len(b))
	if copied == 0 || len(a) <= copied || len(b) <= copied {
		t.Fatalf("the process drawing random numbers did not run before the snapshot and after the restores (%d copied, %d and %d in all)", copied, len(a), len(b))
	}
	if twice > 0 {
		t.Fatalf("both restored boxes drew %d of the same random values after their restore (the RNG state of the snapshot, shared until the host reseeds it)", twice)
	}
}
