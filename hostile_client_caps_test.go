package airlock_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// capsServer is airlock serve's HTTP handler on a runtime of the fake
// driver (its machine count scoped to this test) with policy p.
type capsServer struct {
	r   *airlock.Runtime
	url string
	ref string
}

func newCapsServer(t *testing.T, o airlock.Options, p server.Policy) capsServer {
	t.Helper()
	const ref = "test/fake:v1"
	drv := fake.New(os.Getenv("AIRLOCK_AGENT"))
	drv.Scope = fmt.Sprintf("caps-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	o.Home, o.ImagesDir, o.CacheDir = t.TempDir(), fakeImageStore(t, ref), t.TempDir()
	o.Warn = func(string) {}
	r, err := airlock.OpenWithDriver(o, drv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ts := httptest.NewServer(server.New(server.Config{Runtime: r, Policy: p}).Handler(false))
	t.Cleanup(ts.Close)
	t.Cleanup(func() { // boxes first: their agents are host processes
		boxes, _ := r.List(context.Background())
		for _, b := range boxes {
			r.Remove(context.Background(), b.ID, true)
		}
	})
	return capsServer{r: r, url: ts.URL, ref: ref}
}

// post sends body to path and returns the status, the problem of a
// refusal and the box of a create.
func (c capsServer) post(t *testing.T, path string, body any) (int, server.Problem, server.Box) {
	t.Helper()
	raw, _ := json.Marshal(body)
	resp, err := http.Post(c.url+path, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Error(err) // not Fatal: some calls run on other goroutines
		return 0, server.Problem{}, server.Box{}
	}
	defer resp.Body.Close()
	var p server.Problem
	var b server.Box
	if resp.StatusCode >= 300 {
		json.NewDecoder(resp.Body).Decode(&p)
	} else {
		json.NewDecoder(resp.Body).Decode(&b)
	}
	return resp.StatusCode, p, b
}

func wantDenied(t *testing.T, what string, st int, p server.Problem, words ...string) {
	t.Helper()
	if st != http.StatusForbidden || p.Code != server.CodePolicyDenied {
		t.Errorf("%s: %d %+v, want 403 policy_denied", what, st, p)
		return
	}
	for _, w := range words {
		if !strings.Contains(p.Detail, w) {
			t.Errorf("%s: detail %q does not name %q", what, p.Detail, w)
		}
	}
}

// TestHostileClientDiskCap: a token holder cannot give a box a disk that
// fills the host: by default a box's disk is capped (a 1 TiB disk, which
// the API schema allows, is refused, naming --max-disk), and a create
// that would leave less than the reserve free on the home's filesystem is
// refused, naming the free space and --min-free-disk.
func TestHostileClientDiskCap(t *testing.T) {
	c := newCapsServer(t, airlock.Options{}, server.Policy{})
	st, p, _ := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, DiskSizeMiB: 1 << 20})
	wantDenied(t, "a box of 1 TiB of disk", st, p, "--max-disk", fmt.Sprint(server.DefaultMaxDiskMiB))
	if st, p, _ := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, DiskSizeMiB: 64}); st != http.StatusCreated {
		t.Fatalf("a box of 64 MiB of disk: %d %+v", st, p)
	}

	// Without the per-box cap, the reserve: a disk of all the free space
	// but 1 GiB leaves less than the default 2 GiB.
	c = newCapsServer(t, airlock.Options{}, server.Policy{MaxDiskMiB: server.NoLimit})
	var fs syscall.Statfs_t
	if err := syscall.Statfs(c.r.Home(), &fs); err != nil {
		t.Fatal(err)
	}
	free := int(int64(fs.Bavail) * fs.Bsize >> 20)
	if free-1024 > 1<<20 || free < 1024+64 {
		t.Skipf("%d MiB free: outside the API's disk sizes", free)
	}
	st, p, _ = c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, DiskSizeMiB: free - 1024})
	wantDenied(t, "a disk of all the free space but 1 GiB", st, p, "--min-free-disk", "MiB free", c.r.Home())

	// Boxes made before count with what their disks may still take: a
	// box of all the free space but 3 GiB fits, a second one of 2 GiB
	// (which fits the free space alone) does not; once the first is
	// stopped it does, and then the first cannot start again.
	st, p, a := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, DiskSizeMiB: free - 3072})
	if st != http.StatusCreated {
		t.Fatalf("a box of all the free space but 3 GiB: %d %+v", st, p)
	}
	st, p, _ = c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, DiskSizeMiB: 2048})
	wantDenied(t, "a second box of 2 GiB", st, p, "--min-free-disk", "may still write")
	if st, p, _ := c.post(t, "/v1/boxes/"+a.ID+"/stop", nil); st != http.StatusOK {
		t.Fatalf("stop: %d %+v", st, p)
	}
	if st, p, _ := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, DiskSizeMiB: 2048}); st != http.StatusCreated {
		t.Fatalf("a box of 2 GiB with the big one stopped: %d %+v", st, p)
	}
	st, p, _ = c.post(t, "/v1/boxes/"+a.ID+"/start", nil)
	wantDenied(t, "starting the big box again", st, p, "--min-free-disk", "starting a box")
}

// TestHostileClientStartPastMaxBoxes: a stopped box started again takes
// a place under --max-boxes: stopping boxes and creating others, then
// starting the stopped ones, does not pass the cap.
func TestHostileClientStartPastMaxBoxes(t *testing.T) {
	c := newCapsServer(t, airlock.Options{}, server.Policy{MaxBoxes: 1})
	st, p, a := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref})
	if st != http.StatusCreated {
		t.Fatalf("create: %d %+v", st, p)
	}
	if st, p, _ := c.post(t, "/v1/boxes/"+a.ID+"/stop", nil); st != http.StatusOK {
		t.Fatalf("stop: %d %+v", st, p)
	}
	if st, p, _ := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref}); st != http.StatusCreated {
		t.Fatalf("second create with the first stopped: %d %+v", st, p)
	}
	st, p, _ = c.post(t, "/v1/boxes/"+a.ID+"/start", nil)
	wantDenied(t, "starting the first box again", st, p, "--max-boxes")
	st, p, _ = c.post(t, "/v1/boxes/"+a.ID+"/resume", nil)
	wantDenied(t, "resuming the first box", st, p, "--max-boxes")
}

// TestHostileClientVolumeCaps: named volumes, created by any create that
// names a new one and kept when the box goes, are capped by default in
// number (the N+1th is refused, naming --max-volumes; existing ones can
// still be attached) and in total size (--max-volume-space); concurrent
// creates cannot pass the cap together.
func TestHostileClientVolumeCaps(t *testing.T) {
	ctx := context.Background()
	c := newCapsServer(t, airlock.Options{}, server.Policy{})
	for i := range server.DefaultMaxVolumes {
		if _, err := c.r.CreateVolume(ctx, fmt.Sprintf("v%d", i), 8); err != nil {
			t.Fatal(err)
		}
	}
	vol := func(name string) []server.VolumeSpec { return []server.VolumeSpec{{Source: name, Target: "/data"}} }
	st, p, _ := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, Volumes: vol("one-more")})
	wantDenied(t, fmt.Sprintf("named volume %d", server.DefaultMaxVolumes+1), st, p, "--max-volumes", `"one-more"`)
	if vs, _ := c.r.Volumes(ctx); len(vs) != server.DefaultMaxVolumes {
		t.Errorf("%d volumes after the refusal, want %d", len(vs), server.DefaultMaxVolumes)
	}
	// (The fake driver attaches no volumes: past the policy, 501.)
	if st, p, _ := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, Volumes: vol("v0")}); st == http.StatusForbidden {
		t.Errorf("attaching an existing volume at the cap: %d %+v", st, p)
	}

	// One place left, four creates at once: one gets it.
	c = newCapsServer(t, airlock.Options{}, server.Policy{MaxVolumes: 2})
	if _, err := c.r.CreateVolume(ctx, "old", 8); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	sts := make([]int, 4)
	for i := range sts {
		wg.Go(func() {
			sts[i], _, _ = c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, Volumes: vol(fmt.Sprintf("new%d", i))})
		})
	}
	wg.Wait()
	if vs, _ := c.r.Volumes(ctx); len(vs) != 2 {
		t.Errorf("4 concurrent creates of new volumes with room for 1: statuses %v, %d volumes, want 2", sts, len(vs))
	}

	// The total size: 1 GiB more passes 1 GiB.
	c = newCapsServer(t, airlock.Options{}, server.Policy{MaxVolumesMiB: 1024})
	if _, err := c.r.CreateVolume(ctx, "old", 8); err != nil {
		t.Fatal(err)
	}
	st, p, _ = c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, Volumes: vol("big")})
	wantDenied(t, "a new 1 GiB volume past 1 GiB in all", st, p, "--max-volume-space")
}

// TestHostileClientSnapshotCap: memory snapshots (each the box's memory
// and disk on the host) are capped by default: the N+1th is refused,
// naming --max-snapshots.
func TestHostileClientSnapshotCap(t *testing.T) {
	c := newCapsServer(t, airlock.Options{}, server.Policy{})
	st, p, box := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref})
	if st != http.StatusCreated {
		t.Fatalf("create: %d %+v", st, p)
	}
	b, err := c.r.Get(context.Background(), box.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i := range server.DefaultMaxSnapshots {
		if err := airlock.WriteTestSnapshot(b, fmt.Sprintf("s%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	st, p, _ = c.post(t, "/v1/boxes/"+box.ID+"/snapshot", server.SnapshotRequest{Name: "one-more"})
	wantDenied(t, fmt.Sprintf("snapshot %d", server.DefaultMaxSnapshots+1), st, p, "--max-snapshots")
}

// TestHostileClientMemoryOverhead: the host memory cap counts what each
// box takes besides its guest memory (QEMU's own, its network helper,
// virtiofsd): a box whose memory alone fits the cap but not with that is
// refused at create, and so is a second box that fits only if the first
// is counted by its guest memory. The refusal is 503 host_capacity (it
// was a 500 internal).
func TestHostileClientMemoryOverhead(t *testing.T) {
	c := newCapsServer(t, airlock.Options{MaxMemoryMiB: 1100}, server.Policy{})
	st, p, _ := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, MemoryMiB: 1090})
	if st != http.StatusServiceUnavailable || p.Code != server.CodeHostCapacity || !strings.Contains(p.Detail, "network helper") {
		t.Errorf("a box of 1090 MiB under a host cap of 1100 MiB: %d %+v, want 503 host_capacity", st, p)
	}
	if st, p, _ := c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, MemoryMiB: 512}); st != http.StatusCreated {
		t.Fatalf("first box of 512 MiB: %d %+v", st, p)
	}
	st, p, _ = c.post(t, "/v1/boxes", server.BoxSpec{Image: c.ref, MemoryMiB: 512})
	if st != http.StatusServiceUnavailable || p.Code != server.CodeHostCapacity || !strings.Contains(p.Detail, "host capacity") {
		t.Errorf("second box of 512 MiB under a host cap of 1100 MiB: %d %+v, want 503 host_capacity", st, p)
	}
}
