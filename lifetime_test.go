package airlock_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/vmm/fake"
)

// lifeHome opens runtimes of the fake driver on one home: open(reap)
// opens one more whose reaper runs every reap. The driver is set up by
// each of with.
func lifeHome(t *testing.T, with ...func(*fake.Driver)) (open func(reap time.Duration) *airlock.Runtime, ref string) {
	t.Helper()
	ref = "test/fake:v1"
	drv := fake.New(os.Getenv("AIRLOCK_AGENT"))
	for _, f := range with {
		f(drv)
	}
	home, images, cache := t.TempDir(), fakeImageStore(t, ref), t.TempDir()
	var mu sync.Mutex
	var opened []*airlock.Runtime
	t.Cleanup(func() { // boxes first: their agents are host processes
		mu.Lock()
		defer mu.Unlock()
		for _, r := range opened {
			boxes, _ := r.List(context.Background())
			for _, b := range boxes {
				r.Remove(context.Background(), b.ID, true)
			}
			r.Close()
		}
	})
	return func(reap time.Duration) *airlock.Runtime {
		t.Helper()
		r, err := airlock.OpenWithDriver(airlock.Options{Home: home, ImagesDir: images, CacheDir: cache, Warn: func(string) {}, ReapInterval: reap}, drv)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		opened = append(opened, r)
		mu.Unlock()
		return r
	}, ref
}

// gone says whether box id no longer exists in r's home.
func gone(t *testing.T, r *airlock.Runtime, id string) bool {
	t.Helper()
	_, err := r.Get(context.Background(), id)
	if err != nil && !errors.Is(err, airlock.ErrBoxNotFound) {
		t.Fatalf("get %s: %v", id, err)
	}
	return err != nil
}

// waitGone waits until box id is gone, failing past limit.
func waitGone(t *testing.T, r *airlock.Runtime, id string, limit time.Duration) time.Time {
	t.Helper()
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if gone(t, r, id) {
			return time.Now()
		}
	}
	t.Fatalf("box %s still there after %s", id, limit)
	return time.Time{}
}

// TestLifetimes: the library removes a box at its TTL, one left idle past
// its idle timeout and one whose lease is not renewed; use and renewals
// keep the latter two; BoxInfo shows the deadlines.
func TestLifetimes(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(50 * time.Millisecond)
	var mu sync.Mutex
	reasons := map[string]airlock.ReapReason{}
	r.OnReap(func(ev airlock.BoxReapedEvent) {
		mu.Lock()
		reasons[ev.BoxID] = ev.Reason
		mu.Unlock()
	})
	ctx := context.Background()
	create := func(o airlock.BoxOptions) *airlock.Box {
		o.Image, o.Network = ref, airlock.NetworkNone
		b, err := r.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, TTL: -time.Second}); !errors.Is(err, airlock.ErrInvalidArgument) {
		t.Errorf("negative ttl: %v", err)
	}
	t0 := time.Now()
	ttl := create(airlock.BoxOptions{TTL: 4 * time.Second})
	idle := create(airlock.BoxOptions{IdleTimeout: 2 * time.Second})
	leased := create(airlock.BoxOptions{Lease: 2 * time.Second})
	plain := create(airlock.BoxOptions{})
	for _, c := range []struct {
		b    *airlock.Box
		what string
		f    func(airlock.BoxInfo) time.Time
	}{{ttl, "ExpiresAt", func(i airlock.BoxInfo) time.Time { return i.ExpiresAt }},
		{idle, "IdleDeadline", func(i airlock.BoxInfo) time.Time { return i.IdleDeadline }},
		{leased, "LeaseUntil", func(i airlock.BoxInfo) time.Time { return i.LeaseUntil }}} {
		info, err := c.b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := c.f(info); d.Before(t0) || d.After(time.Now().Add(4*time.Second)) {
			t.Errorf("%s of box %s: %v (created at %v)", c.what, c.b.ID(), d, t0)
		}
	}
	if err := plain.RenewLease(ctx); !errors.Is(err, airlock.ErrNoLease) {
		t.Errorf("renew a box without lease: %v", err)
	}
	// Use the idle box and renew the lease for well past their limits
	// (2 s: a gap between two uses under -race and load stays well below).
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(150 * time.Millisecond) {
		if _, err := idle.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil {
			t.Fatalf("exec in the idle box: %v", err)
		}
		if err := leased.RenewLease(ctx); err != nil {
			t.Fatalf("renew: %v", err)
		}
	}
	if gone(t, r, idle.ID()) || gone(t, r, leased.ID()) {
		t.Fatalf("a box in use or renewed was removed: %v", reasons)
	}
	// Left alone, the idle and leased boxes go; the TTL box goes at its
	// TTL, not before.
	at := waitGone(t, r, ttl.ID(), 5*time.Second)
	if at.Sub(t0) < 4*time.Second {
		t.Errorf("ttl box removed %s after create, before its ttl", at.Sub(t0))
	}
	waitGone(t, r, idle.ID(), 5*time.Second)
	waitGone(t, r, leased.ID(), 5*time.Second)
	if gone(t, r, plain.ID()) {
		t.Error("a box without limits was removed")
	}
	// OnReap is called once Remove returned: shortly after the box is gone.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := len(reasons)
		mu.Unlock()
		if n >= 3 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]airlock.ReapReason{ttl.ID(): airlock.ReapTTL, idle.ID(): airlock.ReapIdle, leased.ID(): airlock.ReapLease}
	for id, why := range want {
		if reasons[id] != why {
			t.Errorf("box %s reaped for %q, want %q", id, reasons[id], why)
		}
	}
}

// TestLeaseCountsFromHandOver: a box whose boot takes longer than its
// lease and idle timeout is not reaped while it boots (by this process's
// reaper or another's); both count from when Create returns.
func TestLeaseCountsFromHandOver(t *testing.T) {
	const boot = 900 * time.Millisecond
	open, ref := lifeHome(t, func(d *fake.Driver) {
		d.TestAgent = func(ctx context.Context, _ string, real func(context.Context) (net.Conn, error)) (net.Conn, error) {
			select { // a slow boot: the agent answers late
			case <-time.After(boot):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return real(ctx)
		}
	})
	r, other := open(20*time.Millisecond), open(20*time.Millisecond)
	ctx := context.Background()
	for _, o := range []airlock.BoxOptions{{Lease: 300 * time.Millisecond}, {IdleTimeout: 300 * time.Millisecond}} {
		o.Image, o.Network = ref, airlock.NetworkNone
		b, err := r.Create(ctx, o)
		if err != nil {
			t.Fatalf("create with lease %s, idle timeout %s (boot %s): %v", o.Lease, o.IdleTimeout, boot, err)
		}
		handed := time.Now()
		// Under load the exec itself can outlast the 300 ms limit, and then
		// the box is rightly reaped under it; only an early failure counts.
		if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil && time.Since(handed) < 300*time.Millisecond {
			t.Fatalf("exec right after create: %v", err)
		}
		at := waitGone(t, other, b.ID(), 5*time.Second)
		if d := at.Sub(handed); d < 300*time.Millisecond {
			t.Errorf("box (lease %s, idle timeout %s) reaped %s after Create returned", o.Lease, o.IdleTimeout, d)
		}
	}
}

// TestLifetimesOutliveTheRuntime: the limits are stored with the box: a
// box whose TTL or lease ended while no Runtime was open is removed by the
// next Open; one whose idle timeout has not ended is kept, and another
// process sees its use.
func TestLifetimesOutliveTheRuntime(t *testing.T) {
	open, ref := lifeHome(t)
	r1 := open(time.Hour) // no reaping but Open's
	ctx := context.Background()
	mk := func(o airlock.BoxOptions) *airlock.Box {
		o.Image, o.Network = ref, airlock.NetworkNone
		b, err := r1.Create(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ttl := mk(airlock.BoxOptions{TTL: 300 * time.Millisecond})
	leased := mk(airlock.BoxOptions{Lease: 300 * time.Millisecond})
	idle := mk(airlock.BoxOptions{IdleTimeout: 5 * time.Second})
	r1.Close()
	time.Sleep(400 * time.Millisecond)
	r2 := open(time.Hour)
	if !gone(t, r2, ttl.ID()) || !gone(t, r2, leased.ID()) {
		t.Errorf("boxes past their ttl or lease survived Open")
	}
	if gone(t, r2, idle.ID()) {
		t.Errorf("a box within its idle timeout was removed at Open")
	}
	// A use through r2 is recorded: a third runtime reads it.
	b, err := r2.Get(ctx, idle.ID())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := b.Info(ctx)
	time.Sleep(2100 * time.Millisecond) // past usePersistEvery since the box's create
	if _, err := b.Exec(ctx, "true", nil, airlock.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	r3 := open(time.Hour)
	b3, err := r3.Get(ctx, idle.ID())
	if err != nil {
		t.Fatal(err)
	}
	after, _ := b3.Info(ctx)
	if !after.IdleDeadline.After(before.IdleDeadline.Add(time.Second)) {
		t.Errorf("idle deadline seen by another runtime: %v, before the exec %v", after.IdleDeadline, before.IdleDeadline)
	}
}

// TestServerRestartKeepsLifetimes: a box created with ttl and lease
// through airlock serve's API keeps them across a restart of the server
// (a new server and Runtime on the same home): the lease can still be
// renewed, the box JSON shows the deadlines, and the box is removed at its
// TTL.
func TestServerRestartKeepsLifetimes(t *testing.T) {
	open, ref := lifeHome(t)
	post := func(url, path string, body any, out any) int {
		t.Helper()
		raw, _ := json.Marshal(body)
		resp, err := http.Post(url+path, "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			json.NewDecoder(resp.Body).Decode(out)
		}
		return resp.StatusCode
	}
	r1 := open(time.Hour)
	ts1 := httptest.NewServer(server.New(server.Config{Runtime: r1}).Handler(false))
	t0 := time.Now()
	var b server.Box
	if st := post(ts1.URL, "/v1/boxes", map[string]any{"image": ref, "network": "none", "ttl": 2.5, "lease": 60}, &b); st != 201 {
		t.Fatalf("create: %d", st)
	}
	if b.ExpiresAt.IsZero() || b.LeaseUntil.IsZero() || !b.IdleDeadline.IsZero() {
		t.Errorf("box JSON deadlines: expires_at %v lease_until %v idle_deadline %v", b.ExpiresAt, b.LeaseUntil, b.IdleDeadline)
	}
	ts1.Close()
	r1.Close()

	r2 := open(50 * time.Millisecond)
	ts2 := httptest.NewServer(server.New(server.Config{Runtime: r2}).Handler(false))
	defer ts2.Close()
	var again server.Box
	resp, err := http.Get(ts2.URL + "/v1/boxes/" + b.ID)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&again)
	resp.Body.Close()
	if resp.StatusCode != 200 || !again.ExpiresAt.Equal(b.ExpiresAt) {
		t.Fatalf("after the restart: %d, expires_at %v, was %v", resp.StatusCode, again.ExpiresAt, b.ExpiresAt)
	}
	if st := post(ts2.URL, "/v1/boxes/"+b.ID+"/lease", nil, nil); st != 204 {
		t.Errorf("renew the lease after the restart: %d, want 204", st)
	}
	at := waitGone(t, r2, b.ID, 5*time.Second)
	if d := at.Sub(t0); d < 2500*time.Millisecond {
		t.Errorf("removed %s after create, before its ttl", d)
	}
	resp, err = http.Get(ts2.URL + "/v1/boxes/" + b.ID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("GET the reaped box: %d", resp.StatusCode)
	}
}

// TestHostileClientHugeLifetimes: a ttl, idle_timeout or lease past what
// a duration holds is the longest limit, not one overflowing into the
// past (which would remove the box at once), and a negative one is
// refused.
func TestHostileClientHugeLifetimes(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(20 * time.Millisecond)
	ts := httptest.NewServer(server.New(server.Config{Runtime: r}).Handler(false))
	defer ts.Close()
	post := func(body map[string]any, out any) int {
		t.Helper()
		raw, _ := json.Marshal(body)
		resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(out)
		return resp.StatusCode
	}
	var b server.Box
	if st := post(map[string]any{"image": ref, "network": "none", "ttl": 1e300, "idle_timeout": 1e19, "lease": 9.3e9}, &b); st != 201 {
		t.Fatalf("create: %d", st)
	}
	if b.ExpiresAt.Before(time.Now().AddDate(100, 0, 0)) {
		t.Errorf("expires_at %v for a ttl of 1e300 s", b.ExpiresAt)
	}
	time.Sleep(200 * time.Millisecond) // ten reap passes
	if gone(t, r, b.ID) {
		t.Fatal("a box with the longest limits was reaped")
	}
	var p server.Problem
	if st := post(map[string]any{"image": ref, "network": "none", "lease": -1}, &p); st != 400 && st != 422 {
		t.Errorf("negative lease: %d %+v", st, p)
	}
}

// TestSetTTLAndLabels: SetTTL gives a box without a TTL one counted from
// now, which the reaper enforces; labels are stored, shown by Get and
// List, and bounded.
func TestSetTTLAndLabels(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(50 * time.Millisecond)
	ctx := context.Background()
	labels := map[string]string{"owner": "e2b", "k/with spaces": "välue"}
	b, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Options.Labels; len(got) != 2 || got["owner"] != "e2b" || got["k/with spaces"] != "välue" {
		t.Errorf("Get: labels %v, want %v", got, labels)
	}
	list, _ := r.List(ctx)
	if len(list) != 1 || list[0].Options.Labels["owner"] != "e2b" {
		t.Errorf("List: %+v, want the box with its labels", list)
	}
	if err := b.SetTTL(ctx, 0); !errors.Is(err, airlock.ErrInvalidArgument) {
		t.Errorf("SetTTL(0) = %v, want ErrInvalidArgument", err)
	}
	before := time.Now()
	if err := b.SetTTL(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	info, _ = b.Info(ctx)
	if info.ExpiresAt.Before(before.Add(250*time.Millisecond)) || info.ExpiresAt.After(time.Now().Add(300*time.Millisecond)) {
		t.Errorf("ExpiresAt %v, want about 300ms after %v", info.ExpiresAt, before)
	}
	if at := waitGone(t, r, b.ID(), 5*time.Second); at.Before(before.Add(300 * time.Millisecond)) {
		t.Errorf("box gone at %v, before its TTL", at.Sub(before))
	}

	for name, bad := range map[string]map[string]string{
		"empty key": {"": "v"}, "control": {"k": "a\nb"}, "long value": {"k": string(bytes.Repeat([]byte("v"), airlock.MaxLabelValueLen+1))},
		"not utf-8": {"k": "\xff"},
	} {
		if _, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, Labels: bad}); !errors.Is(err, airlock.ErrInvalidArgument) {
			t.Errorf("%s: Create = %v, want ErrInvalidArgument", name, err)
		}
	}
	many := map[string]string{}
	for i := range airlock.MaxLabels + 1 {
		many[string(rune('a'+i%26))+string(rune('A'+i/26))] = "v"
	}
	if _, err := r.Create(ctx, airlock.BoxOptions{Image: ref, Network: airlock.NetworkNone, Labels: many}); !errors.Is(err, airlock.ErrInvalidArgument) {
		t.Errorf("%d labels: Create = %v, want ErrInvalidArgument", len(many), err)
	}
}

// TestLabelsREST: labels given to POST /v1/boxes are shown by GET and
// matched by GET /v1/boxes?label=; bad ones are 400.
func TestLabelsREST(t *testing.T) {
	open, ref := lifeHome(t)
	r := open(0)
	ts := httptest.NewServer(server.New(server.Config{Runtime: r}).Handler(false))
	defer ts.Close()
	create := func(labels map[string]string) (int, server.Box) {
		t.Helper()
		raw, _ := json.Marshal(map[string]any{"image": ref, "network": "none", "labels": labels})
		resp, err := http.Post(ts.URL+"/v1/boxes", "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b server.Box
		json.NewDecoder(resp.Body).Decode(&b)
		return resp.StatusCode, b
	}
	st, a := create(map[string]string{"team": "a", "tier": "gold"})
	if st != 201 || a.Labels["team"] != "a" || a.Labels["tier"] != "gold" {
		t.Fatalf("create: %d %+v", st, a)
	}
	if st, b := create(map[string]string{"team": "b"}); st != 201 || b.Labels["team"] != "b" {
		t.Fatalf("create b: %d", st)
	}
	if st, _ := create(map[string]string{"bad": "a\x00b"}); st != 400 {
		t.Errorf("a label with a control character: %d, want 400", st)
	}
	list := func(q string) (int, []string) {
		t.Helper()
		resp, err := http.Get(ts.URL + "/v1/boxes" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l server.BoxList
		json.NewDecoder(resp.Body).Decode(&l)
		var ids []string
		for _, b := range l.Boxes {
			ids = append(ids, b.ID)
		}
		return resp.StatusCode, ids
	}
	for q, want := range map[string]int{"": 2, "?label=team=a": 1, "?label=team": 2, "?label=team=a&label=tier=gold": 1, "?label=team=a&label=tier=x": 0, "?label=nope": 0} {
		if st, ids := list(q); st != 200 || len(ids) != want {
			t.Errorf("GET /v1/boxes%s: %d %v, want %d boxes", q, st, ids, want)
		}
	}
	if _, ids := list("?label=team=a"); len(ids) != 1 || ids[0] != a.ID {
		t.Errorf("label=team=a: %v, want [%s]", ids, a.ID)
	}
	if st, _ := list("?label==x"); st != 400 {
		t.Errorf("an empty label key: %d, want 400", st)
	}
}
