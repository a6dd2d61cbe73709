package helper

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gofrs/flock"

	"github.com/airlock-run/airlock/internal/boxdir"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/vmm"
)

// The published ports a box directory records (written by this or an
// earlier airlock: airlock.PortMapping's JSON) read back as bound.
func TestPortsReadsTheRecord(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, boxdir.NetPorts), []byte(`[{"host_ip":"127.0.0.1","host_port":8080,"guest_port":80,"protocol":"tcp"},{"host_port":5353,"guest_port":53,"protocol":"udp"}]`), 0o600)
	want := []netstack.Publish{{HostIP: "127.0.0.1", HostPort: 8080, GuestPort: 80, Proto: "tcp"}, {HostPort: 5353, GuestPort: 53, Proto: "udp"}}
	if got := Ports(dir); !reflect.DeepEqual(got, want) {
		t.Errorf("Ports = %+v, want %+v", got, want)
	}
	if got := Ports(t.TempDir()); got != nil {
		t.Errorf("no record: %+v", got)
	}
}

// fakeHelper starts a process that stands in for a box's helper and
// records it in dir as a start does.
func fakeHelper(t *testing.T, dir string) vmm.Handle {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep: %v", err)
	}
	go cmd.Wait()
	h := vmm.Handle{PID: cmd.Process.Pid, Start: vmm.StartTime(cmd.Process.Pid)}
	t.Cleanup(func() { vmm.Kill(h) })
	os.WriteFile(filepath.Join(dir, boxdir.NetPID), []byte(fmt.Sprintf("%d %d\n", h.PID, h.Start)), 0o600)
	return h
}

// Stop ends the recorded helper and forgets it; PID says whether it runs.
func TestStopEndsTheRecordedHelper(t *testing.T) {
	dir := t.TempDir()
	h := fakeHelper(t, dir)
	if pid, ok := PID(dir); !ok || pid != h.PID {
		t.Fatalf("PID = %d, %v; want %d running", pid, ok, h.PID)
	}
	Stop(dir)
	if h.Alive() {
		t.Error("the helper runs after Stop")
	}
	if _, ok := PID(dir); ok {
		t.Error("PID says a helper runs after Stop")
	}
	if _, err := os.Stat(filepath.Join(dir, boxdir.NetPID)); !os.IsNotExist(err) {
		t.Errorf("the helper's record is still there: %v", err)
	}
}

// A reconcile leaves the helper of a box someone holds the lock of (a
// Start in progress runs its helper before its machine), and ends it once
// the lock is free.
func TestReconcileLeavesALockedBox(t *testing.T) {
	dir := t.TempDir()
	h := fakeHelper(t, dir)
	fl := flock.New(filepath.Join(dir, boxdir.Lock))
	if err := fl.Lock(); err != nil {
		t.Fatal(err)
	}
	Reconcile(dir)
	if !h.Alive() {
		t.Fatal("Reconcile ended the helper of a locked box")
	}
	fl.Unlock()
	Reconcile(dir)
	if h.Alive() {
		t.Error("Reconcile left the helper of a box whose machine is gone")
	}
}
