package airlock_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// BenchmarkWakeOnTraffic measures scale to zero's wake: from an inbound
// connection to a published port of a suspended IdleSuspend box
// (python3 -m http.server behind it) to the first byte of the box's
// answer, the box resuming meanwhile. Reported as ms-to-first-byte; the
// suspend before each connection is not timed. docs/lifetimes.md has the
// figure.
func BenchmarkWakeOnTraffic(b *testing.B) {
	vmtest.Require(b)
	ctx := context.Background()
	r, err := airlock.Open(airlock.Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	box, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.DefaultImage, IdleTimeout: time.Hour,
		IdleAction: airlock.IdleSuspend, Ports: []airlock.PortMapping{{GuestPort: 8000}}})
	if err != nil {
		b.Fatal(err)
	}
	defer box.Remove(context.Background(), true)
	shIn(b, box, "mkdir -p /srv && echo hello > /srv/index.html && cd /srv && { nohup python3 -m http.server 8000 >/dev/null 2>&1 & }")
	shIn(b, box, `for i in $(seq 300); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8000/", timeout=5)' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`)
	ports, err := box.Ports(ctx)
	if err != nil || len(ports) != 1 {
		b.Fatalf("ports %+v %v", ports, err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0].HostPort)
	var total time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := box.Suspend(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", addr, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(2 * time.Minute))
		fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: box\r\n\r\n")
		if _, err := bufio.NewReader(c).ReadByte(); err != nil {
			b.Fatalf("first byte: %v", err)
		}
		d := time.Since(t0)
		c.Close()
		total += d
		b.Logf("connection → first byte on a suspended box: %s", d.Round(time.Millisecond))
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-first-byte")
}
