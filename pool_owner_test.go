package airlock_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmm"
	"github.com/airlock-run/airlock/internal/vmm/fake"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// poolOwnerEnv makes the test binary the pool owner of
// poolOwnerKilled: "DRIVER HOME_DIR IMAGES_DIR".
const poolOwnerEnv = "AIRLOCK_TEST_POOL_OWNER"

// TestPoolBoxEndsWithItsOwner: the machine of a warm pool's box (here
// the fake driver's, a process in a session of its own as QEMU is) ends
// when the process whose pool holds it is killed with SIGKILL, within
// seconds and without another Open of the home: no machine runs that
// no record lists as anybody's. Before, it ran on until the next Open.
func TestPoolBoxEndsWithItsOwner(t *testing.T) {
	if v := os.Getenv(poolOwnerEnv); v != "" {
		runPoolOwner(t, strings.Fields(v))
		return
	}
	poolOwnerKilled(t, "fake", "^TestPoolBoxEndsWithItsOwner$")
}

// TestPoolBoxEndsWithItsOwnerQEMU is TestPoolBoxEndsWithItsOwner with a
// real box (restored from the pool's template): its QEMU, network helper
// and console drainer are gone within seconds of the owner's SIGKILL.
func TestPoolBoxEndsWithItsOwnerQEMU(t *testing.T) {
	if v := os.Getenv(poolOwnerEnv); v != "" {
		runPoolOwner(t, strings.Fields(v))
		return
	}
	vmtest.Require(t)
	poolOwnerKilled(t, "qemu", "^TestPoolBoxEndsWithItsOwnerQEMU$")
}

func poolOwnerKilled(t *testing.T, driver, run string) {
	images := vmtest.ImagesDir()
	if driver == "fake" {
		images = fakeImageStore(t, "test/fake:v1")
	}
	home := t.TempDir()
	t.Cleanup(func() { vmtest.KillHome(home) })
	cmd := osexec.Command(os.Args[0], "-test.run="+run, "-test.v")
	cmd.Env = append(os.Environ(), poolOwnerEnv+"="+driver+" "+home+" "+images)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var h vmm.Handle
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "pool box machine %d %d", &h.PID, &h.Start); err == nil {
			break
		}
	}
	if h.PID == 0 {
		t.Fatal("the pool owner never reported its pool box")
	}
	go func() {
		for sc.Scan() {
		}
	}()
	defer func() {
		if h.Alive() {
			killPID(h.PID)
		}
	}()
	if !h.Alive() {
		t.Fatalf("the pool box's machine %d is not running before its owner is killed", h.PID)
	}
	before := vmtest.HomeProcesses(home)
	cmd.Process.Kill() // SIGKILL: no Close, no deferred cleanup
	cmd.Wait()
	t0 := time.Now()
	for h.Alive() || len(vmtest.HomeProcesses(home)) > 0 {
		if time.Since(t0) > 5*time.Second {
			t.Fatalf("5 s after its owner was killed, the pool box's machine (pid %d) alive: %v; processes of the home: %v (before: %v)", h.PID, h.Alive(), vmtest.HomeProcesses(home), before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the pool box's machine and the home's %d processes ended %s after the owner's SIGKILL", len(before), time.Since(t0).Round(time.Millisecond))
}

// runPoolOwner opens a runtime with a warm pool of one box (on the fake
// driver or QEMU), prints the box's machine, and waits to be killed.
func runPoolOwner(t *testing.T, args []string) {
	if len(args) != 3 {
		t.Fatalf("%s=%q", poolOwnerEnv, args)
	}
	o := airlock.Options{Home: args[1], ImagesDir: args[2], CacheDir: t.TempDir(), Warn: func(string) {}}
	var r *airlock.Runtime
	var err error
	if args[0] == "fake" {
		o.Pool = []airlock.PoolOptions{{BoxOptions: airlock.BoxOptions{Image: "test/fake:v1", Network: airlock.NetworkNone}, Size: 1}}
		r, err = airlock.OpenWithDriver(o, fake.New(os.Getenv("AIRLOCK_AGENT")))
	} else {
		o.CacheDir = ""
		o.Pool = []airlock.PoolOptions{{BoxOptions: airlock.BoxOptions{Image: vmtest.DefaultImage}, Size: 1}}
		r, err = airlock.Open(o)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := r.WaitPools(ctx); err != nil {
		t.Fatal(err)
	}
	pbs, err := r.PoolBoxes(ctx)
	if err != nil || len(pbs) != 1 {
		t.Fatalf("pool boxes %+v, %v", pbs, err)
	}
	fmt.Printf("pool box machine %d %d\n", pbs[0].PID, vmm.StartTime(pbs[0].PID))
	time.Sleep(3 * time.Minute) // killed before
	t.Fatal("not killed")
}

func killPID(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		p.Kill()
	}
}
