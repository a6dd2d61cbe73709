package airlock

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-run/airlock/internal/measure"
	"github.com/airlock-run/airlock/internal/netstack/helper"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// BenchmarkNetwork compares the box network backends on the same kernel
// and image, in one run (not a timed test; run it with
//
//	go test -run '^$' -bench BenchmarkNetwork -benchtime 1x .
//
// ): "helper" is airlock's own stack (cmd/airlock-net), "slirp" QEMU's
// user-mode networking (kept here only, as the yardstick), "none" a box
// without a network device (cold start only). For each it reports, as
// medians: cold start (Create to the first Exec result), TCP throughput
// box → host server and host server → box (MiB/s, over the host's loopback:
// 10.0.2.2, the gateway, opened by AllowHostPorts under the helper), TCP
// connection setup as the box sees it, and the helper's RSS.
func BenchmarkNetwork(b *testing.B) {
	vmtest.Require(b)
	RequireTestFaults(b) // the slirp yardstick is a test-only seam
	const runs, mib = 5, 32
	srv := newBenchServer(b, mib)
	r, err := Open(Options{Home: b.TempDir(), ImagesDir: vmtest.ImagesDir(), Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	type figures struct{ cold, up, down, connect, idle, rss, hwm []float64 }
	res := map[string]*figures{}
	order := []string{"none", "slirp", "helper"}
	for _, k := range order {
		res[k] = &figures{}
	}
	for i := 0; i < runs; i++ {
		// Rotate the order each run: the host's load drifts.
		for j := range order {
			k := order[(i+j)%len(order)]
			setBenchSlirp(k == "slirp")
			opts := BoxOptions{Network: NetworkPublic, AllowHostPorts: []int{srv.port, srv.port + 1}}
			if k == "none" {
				opts = BoxOptions{Network: NetworkNone}
			}
			t0 := time.Now()
			box, err := r.Create(ctx, opts)
			if err == nil {
				_, err = box.Exec(ctx, "true", nil, ExecOptions{})
			}
			if err != nil {
				if box != nil {
					box.Remove(ctx, true)
				}
				b.Fatalf("%s: %v", k, err)
			}
			f := res[k]
			f.cold = append(f.cold, float64(time.Since(t0).Milliseconds()))
			if pid, ok := helper.PID(box.dir); ok {
				f.idle = append(f.idle, float64(measure.ProcStatusKiB(pid, "VmRSS"))/1024)
			}
			if k != "none" {
				// The host's loopback is 10.0.2.2 under slirp, and the
				// ports AllowHostPorts opens are there under the helper
				// too (host.airlock.internal resolves to it).
				out, err := box.Exec(ctx, "python3", []string{"-c", benchGuestScript, "10.0.2.2", strconv.Itoa(srv.port), strconv.Itoa(mib)}, ExecOptions{Timeout: 5 * time.Minute})
				if err != nil || out.ExitCode != 0 {
					box.Remove(ctx, true)
					b.Fatalf("%s: guest script: %v %+v", k, err, out)
				}
				var connectUS float64
				fmt.Sscan(strings.TrimSpace(string(out.Stdout)), &connectUS)
				f.connect = append(f.connect, connectUS)
				f.up = append(f.up, <-srv.up)
				f.down = append(f.down, <-srv.down)
				if pid, ok := helper.PID(box.dir); ok {
					f.rss = append(f.rss, float64(measure.ProcStatusKiB(pid, "VmRSS"))/1024)
					f.hwm = append(f.hwm, float64(measure.ProcStatusKiB(pid, "VmHWM"))/1024)
				}
			}
			box.Remove(ctx, true)
		}
	}
	setBenchSlirp(false)
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		iv := make([]int64, len(v))
		for i, x := range v {
			iv[i] = int64(x * 1000)
		}
		return float64(measure.Median(iv)) / 1000
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nnetwork benchmark, medians of %d runs, %d MiB each way\n", runs, mib)
	fmt.Fprintf(&sb, "%-8s %12s %16s %16s %14s %s\n", "backend", "cold start", "box→host MiB/s", "host→box MiB/s", "connect (µs)", "helper RSS MiB: idle, after traffic (peak)")
	for _, k := range order {
		f := res[k]
		fmt.Fprintf(&sb, "%-8s %10.0fms %16.1f %16.1f %14.0f %.1f, %.1f (%.1f)\n", k, med(f.cold), med(f.up), med(f.down), med(f.connect), med(f.idle), med(f.rss), med(f.hwm))
	}
	h, s, n := res["helper"], res["slirp"], res["none"]
	fmt.Fprintf(&sb, "helper/slirp: throughput up %.2f (target ≥1), down %.2f (target ≥1), connect %.2f (target ≤1); cold start helper/none %.2f (target ≤1.05)\n",
		med(h.up)/med(s.up), med(h.down)/med(s.down), med(h.connect)/med(s.connect), med(h.cold)/med(n.cold))
	b.Log(sb.String())
	b.ReportMetric(med(h.up), "helper-up-MiB/s")
	b.ReportMetric(med(s.up), "slirp-up-MiB/s")
	b.ReportMetric(med(h.rss), "helper-RSS-MiB")
}

// benchGuestScript: connect 50 times to the host server's port+1 (it
// closes at once) and print the median setup time in µs; then send MiB
// MiB to the port, then read MiB MiB from it.
const benchGuestScript = `
import socket, sys, time
host, port, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ts = []
for i in range(50):
    t = time.perf_counter()
    s = socket.create_connection((host, port + 1), timeout=10)
    ts.append(time.perf_counter() - t)
    s.close()
ts.sort()
buf = b"x" * (1 << 20)
s = socket.create_connection((host, port), timeout=60)
s.sendall(b"U")
for i in range(mib):
    s.sendall(buf)
s.shutdown(socket.SHUT_WR)
s.recv(1)
s.close()
s = socket.create_connection((host, port), timeout=60)
s.sendall(b"D")
n = 0
while n < mib << 20:
    d = s.recv(1 << 20)
    if not d:
        break
    n += len(d)
s.sendall(b"k")
s.close()
print(ts[len(ts)//2] * 1e6)
`

// benchServer is the host side: on port, "U" connections are read to EOF
// (box → host throughput), "D" connections get mib MiB (host → box, until
// the box's one-byte ack); port+1 accepts and closes (connect latency).
type benchServer struct {
	port     int
	up, down chan float64
}

func newBenchServer(b *testing.B, mib int) *benchServer {
	var l, l2 net.Listener
	var err error
	for try := 0; try < 20; try++ {
		l, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if l2, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+1)); err == nil {
			break
		}
		l.Close()
	}
	if l2 == nil {
		b.Fatal("no two adjacent free ports")
	}
	b.Cleanup(func() { l.Close(); l2.Close() })
	s := &benchServer{port: l.Addr().(*net.TCPAddr).Port, up: make(chan float64, 10), down: make(chan float64, 10)}
	go func() {
		for {
			c, err := l2.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var op [1]byte
				if _, err := io.ReadFull(c, op[:]); err != nil {
					return
				}
				t0 := time.Now()
				switch op[0] {
				case 'U':
					n, _ := io.Copy(io.Discard, c)
					s.up <- float64(n) / (1 << 20) / time.Since(t0).Seconds()
					c.Write([]byte("k"))
				case 'D':
					buf := make([]byte, 1<<20)
					for i := 0; i < mib; i++ {
						if _, err := c.Write(buf); err != nil {
							return
						}
					}
					c.Read(op[:])
					s.down <- float64(mib) / time.Since(t0).Seconds()
				}
			}()
		}
	}()
	return s
}
