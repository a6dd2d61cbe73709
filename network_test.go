package airlock_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// The network VM tests send packets only to loopback. They stand in for
// the internet with servers on 127.0.0.2 and 127.0.0.3 that the box reaches
// as 198.18.0.2 and 198.18.0.3 (netstack.TestInternetEnv, a test-only
// override: the helper treats 198.18.0.0/24 as internet addresses and dials
// them on 127.0.0.0/24), and point the helper's upstream resolver at a DNS
// server of their own (AIRLOCK_DNS_UPSTREAM).

// dnsZone is a DNS server on loopback answering A records from a zone and
// counting the queries per name.
type dnsZone struct {
	addr string
	zone map[string]string
	mu   sync.Mutex
	seen map[string]int
}

func startDNS(t *testing.T, zone map[string]string) *dnsZone {
	t.Helper()
	z := &dnsZone{zone: zone, seen: map[string]int{}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	z.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		name := strings.TrimSuffix(strings.ToLower(q.Question[0].Name), ".")
		z.mu.Lock()
		z.seen[name]++
		z.mu.Unlock()
		m := new(dns.Msg).SetReply(q)
		if ip, ok := z.zone[name]; !ok {
			m.Rcode = dns.RcodeNameError
		} else if q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(ip)})
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return z
}

func (z *dnsZone) queries(name string) int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.seen[name]
}

// greeter listens on addr and sends greeting to each connection, then
// keeps it open until the peer closes it.
func greeter(t *testing.T, addr, greeting string) int {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte(greeting + "\n"))
				io.Copy(io.Discard, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// probeScript defines probe(host, port) in the box: the first line the
// server sends, or the error's class.
const probeScript = `
import socket, sys
def probe(host, port):
    try:
        s = socket.create_connection((host, port), timeout=5)
    except socket.gaierror as e:
        return "dns-error"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return "error:" + type(e).__name__
    try:
        return s.makefile().readline().strip()
    except OSError as e:
        return "read-error:" + type(e).__name__
    finally:
        s.close()
for a in sys.argv[1:]:
    h, p = a.rsplit(":", 1)
    print(a, probe(h, int(p)))
`

// pingScript sends one ICMP echo request (raw socket: the box runs as
// root) to each address and prints whether a matching reply came.
const pingScript = `
import socket, struct, sys, time
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
for i, a in enumerate(sys.argv[1:]):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.settimeout(4)
    body = b"airlock-ping"
    h = struct.pack("!BBHHH", 8, 0, 0, 0x4242, i + 1)
    s.sendto(struct.pack("!BBHHH", 8, 0, csum(h + body), 0x4242, i + 1) + body, (a, 0))
    got = "no reply"
    end = time.time() + 4
    try:
        while time.time() < end:
            d, src = s.recvfrom(2048)
            icmp = d[(d[0] & 15) * 4:]
            if src[0] == a and icmp[0] == 0 and struct.unpack("!HH", icmp[4:8]) == (0x4242, i + 1) and icmp[8:] == body:
                got = "reply"; break
    except OSError:
        pass
    print(a, got)
`

// probe runs probeScript in b for each host:port and returns the answers.
func probe(t *testing.T, b *airlock.Box, dsts ...string) map[string]string {
	t.Helper()
	res := exec(t, b, airlock.ExecOptions{Timeout: 60 * time.Second}, "python3", append([]string{"-c", probeScript}, dsts...)...)
	if res.ExitCode != 0 {
		t.Fatalf("probe: exit %d: %s", res.ExitCode, res.Stderr)
	}
	out := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		k, v, _ := strings.Cut(l, " ")
		out[k] = v
	}
	return out
}

func expect(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
}

// TestBoxNetwork covers the network rules on real boxes: a public box
// reaches the internet but not the host's loopback services (through any
// gateway address), except the ports AllowHostPorts opens as
// host.airlock.internal; names resolving to denied ranges are refused; a
// published port is reachable from the host; switching the running box to
// an allowlist closes its connection to a destination no longer allowed,
// resolves only listed names (the upstream never sees the others) and
// refuses unlisted addresses; the helper goes away when QEMU is killed, on
// Stop, at the next Open when it was left behind, and when the box is
// removed.
func TestBoxNetwork(t *testing.T) {
	vmtest.Require(t)
	t.Setenv(netstack.TestInternetEnv, "198.18.0.0/24")
	secret := greeter(t, "127.0.0.1:0", "host secret")
	opened := greeter(t, "127.0.0.1:0", "opened host port")
	site := greeter(t, "127.0.0.2:0", "allowed site")
	other := greeter(t, "127.0.0.3:0", "other site")
	z := startDNS(t, map[string]string{
		"allowed.test": "198.18.0.2", "other.test": "198.18.0.3", "unlisted.test": "198.18.0.3",
		"rebind.test": "127.0.0.1", "private.test": "192.168.1.10", "meta.test": "169.254.169.254",
	})
	t.Setenv(netstack.UpstreamEnv, z.addr)
	home := t.TempDir()
	r := openRuntime(t, home)
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{
		AllowHostPorts: []int{opened},
		Ports:          []airlock.PortMapping{{GuestPort: 8000}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	s, o, sp, op := strconv.Itoa(secret), strconv.Itoa(opened), strconv.Itoa(site), strconv.Itoa(other)

	t.Run("public", func(t *testing.T) {
		got := probe(t, b,
			"10.0.2.2:"+s, "10.0.2.3:"+s, "host.airlock.internal:"+s, "10.0.2.2:"+o, "host.airlock.internal:"+o,
			"allowed.test:"+sp, "198.18.0.3:"+op, "rebind.test:"+s, "private.test:80", "meta.test:80", "169.254.169.254:80", "192.168.1.10:80")
		expect(t, got, map[string]string{
			"10.0.2.2:" + s: "refused", "10.0.2.3:" + s: "refused", "host.airlock.internal:" + s: "refused",
			"10.0.2.2:" + o: "opened host port", "host.airlock.internal:" + o: "opened host port",
			"allowed.test:" + sp: "allowed site", "198.18.0.3:" + op: "other site",
			"rebind.test:" + s: "dns-error", "private.test:80": "dns-error", "meta.test:80": "dns-error",
			"169.254.169.254:80": "refused", "192.168.1.10:80": "refused",
		})
		pings := exec(t, b, airlock.ExecOptions{Timeout: 60 * time.Second}, "python3", "-c", pingScript, "198.18.0.2", "10.0.2.2", "169.254.169.254")
		if want := "198.18.0.2 reply\n10.0.2.2 reply\n169.254.169.254 no reply\n"; string(pings.Stdout) != want {
			t.Errorf("ping: %q (stderr %q), want %q", pings.Stdout, pings.Stderr, want)
		}
		res := exec(t, b, airlock.ExecOptions{}, "python3", "-c", `
import socket
lo = socket.create_server(("127.0.0.1", 0))
socket.create_connection(lo.getsockname(), timeout=5).close()
print("loopback ok")
print(open("/etc/resolv.conf").read().strip())`)
		if string(res.Stdout) != "loopback ok\nnameserver 10.0.2.3\n" {
			t.Errorf("got %q (stderr %q)", res.Stdout, res.Stderr)
		}
		st, err := b.NetworkStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Denied < 6 || st.BytesIn == 0 || st.Connections < 4 || st.DNSQueries == 0 {
			t.Errorf("stats %+v", st)
		}
		log, _ := os.ReadFile(b.NetworkLog())
		for _, want := range []string{"tcp 10.0.2.2:" + s + " denied: gateway", "dns rebind.test denied: resolves to host loopback (rebinding)", "tcp 169.254.169.254:80 denied: link-local", "icmp 169.254.169.254 denied: link-local"} {
			if !strings.Contains(string(log), want) {
				t.Errorf("network log lacks %q:\n%s", want, log)
			}
		}
	})

	t.Run("published", func(t *testing.T) {
		exec(t, b, airlock.ExecOptions{}, "sh", "-c", "mkdir -p /srv && echo hello from the box > /srv/index.html && cd /srv && nohup python3 -m http.server 8000 >/dev/null 2>&1 &")
		ports, err := b.Ports(ctx)
		if err != nil || len(ports) != 1 || ports[0].HostPort == 0 || ports[0].HostIP != "127.0.0.1" || ports[0].GuestPort != 8000 {
			t.Fatalf("ports %+v, %v", ports, err)
		}
		list, _ := r.List(ctx)
		if len(list) != 1 || len(list[0].Ports) != 1 || list[0].Ports[0] != ports[0] {
			t.Errorf("List ports %+v, want %+v", list, ports)
		}
		url := fmt.Sprintf("http://127.0.0.1:%d/", ports[0].HostPort)
		var body string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			resp, err := http.Get(url)
			if err != nil {
				continue
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(raw)
			break
		}
		if body != "hello from the box\n" {
			t.Errorf("GET %s: %q", url, body)
		}
	})

	t.Run("set-network", func(t *testing.T) {
		// A connection open to other.test, which the new policy denies.
		done := make(chan *airlock.ExecResult, 1)
		go func() {
			res, _ := b.Exec(ctx, "python3", []string{"-c", `
import socket, time
s = socket.create_connection(("198.18.0.3", ` + op + `), timeout=5)
print(s.makefile().readline().strip(), flush=True)
open("/tmp/ready", "w").close()
s.settimeout(60)
try:
    print("closed" if s.recv(100) == b"" else "data")
except OSError as e:
    print("closed:", type(e).__name__)
`}, airlock.ExecOptions{Timeout: 90 * time.Second})
			done <- res
		}()
		for i := 0; ; i++ {
			if res := exec(t, b, airlock.ExecOptions{}, "test", "-e", "/tmp/ready"); res.ExitCode == 0 {
				break
			}
			if i > 200 {
				t.Fatal("the box's connection did not open")
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := b.SetNetwork(ctx, airlock.NetworkPolicy{AllowNet: []string{"allowed.test"}}); err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-done:
			if res == nil || !strings.HasPrefix(string(res.Stdout), "other site\nclosed") {
				t.Errorf("open connection: %+v", res)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the connection the new policy denies stays open")
		}
		before := z.queries("allowed.test")
		got := probe(t, b, "allowed.test:"+sp, "unlisted.test:"+op, "198.18.0.3:"+op, "198.18.0.2:"+sp, "host.airlock.internal:"+o)
		expect(t, got, map[string]string{
			"allowed.test:" + sp: "allowed site", "unlisted.test:" + op: "dns-error", "198.18.0.3:" + op: "refused",
			"198.18.0.2:" + sp: "allowed site", "host.airlock.internal:" + o: "refused",
		})
		if pings := exec(t, b, airlock.ExecOptions{Timeout: 60 * time.Second}, "python3", "-c", pingScript, "198.18.0.3"); string(pings.Stdout) != "198.18.0.3 no reply\n" {
			t.Errorf("ping of an unlisted address: %q", pings.Stdout)
		}
		if n := z.queries("unlisted.test"); n != 0 {
			t.Errorf("the upstream got %d queries for unlisted.test", n)
		}
		if z.queries("allowed.test") == before {
			t.Error("allowed.test was not resolved upstream")
		}
		// DNS to any other server, e.g. straight to the upstream's address
		// as the box sees the host, is refused.
		res := exec(t, b, airlock.ExecOptions{}, "python3", "-c", `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x08unlisted\x04test\x00\x00\x01\x00\x01", ("198.18.0.2", 53))
s.settimeout(2)
try:
    s.recv(512); print("answered")
except OSError:
    print("no answer")`)
		if strings.TrimSpace(string(res.Stdout)) != "no answer" {
			t.Errorf("DNS to another server: %q", res.Stdout)
		}
		info, _ := b.Info(ctx)
		if info.Options.Network != airlock.NetworkAllowlist || len(info.Options.AllowNet) != 1 {
			t.Errorf("stored options %+v", info.Options)
		}
	})

	t.Run("helper-lifetime", func(t *testing.T) {
		helper := func() int {
			raw, err := os.ReadFile(filepath.Join(home, "boxes", b.ID(), "net.pid"))
			if err != nil {
				return 0
			}
			var pid int
			fmt.Sscan(string(raw), &pid)
			return pid
		}
		gone := func(pid int) bool {
			for i := 0; i < 100; i++ {
				if syscall.Kill(pid, 0) != nil {
					return true
				}
				time.Sleep(50 * time.Millisecond)
			}
			return false
		}
		info, _ := b.Info(ctx)
		hp := helper()
		if hp == 0 || syscall.Kill(hp, 0) != nil {
			t.Fatal("no network helper runs for the box")
		}
		syscall.Kill(info.PID, syscall.SIGKILL)
		if !gone(hp) {
			t.Fatalf("helper %d still runs after kill -9 of QEMU", hp)
		}
		// Start again: the published port spec is kept.
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if ports, _ := b.Ports(ctx); len(ports) != 1 || ports[0].GuestPort != 8000 {
			t.Errorf("ports after restart: %+v", ports)
		}
		hp = helper()
		if hp == 0 || syscall.Kill(hp, 0) != nil {
			t.Fatal("no network helper after restart")
		}
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if !gone(hp) {
			t.Fatalf("helper %d still runs after Stop", hp)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		hp = helper()
		// A helper left behind (stopped here, so that it cannot notice its
		// QEMU going) is killed by the next Open's reconcile.
		syscall.Kill(hp, syscall.SIGSTOP)
		info, _ = b.Info(ctx)
		syscall.Kill(info.PID, syscall.SIGKILL)
		time.Sleep(200 * time.Millisecond)
		if syscall.Kill(hp, 0) != nil {
			t.Fatal("the stopped helper is gone before any reconcile")
		}
		openRuntime(t, home)
		if !gone(hp) {
			syscall.Kill(hp, syscall.SIGKILL)
			t.Fatalf("orphan helper %d survived Open's reconcile", hp)
		}
		if err := b.Start(ctx); err != nil {
			t.Fatal(err)
		}
		hp = helper()
		if err := b.Remove(ctx, true); err != nil {
			t.Fatal(err)
		}
		if !gone(hp) {
			t.Fatalf("helper %d still runs after rm -f", hp)
		}
	})
}

// TestNetworkOptionErrors: bad network options fail Create with a clear
// error before any VM starts, and leave no box behind; so does a published
// port in use.
func TestNetworkOptionErrors(t *testing.T) {
	r := openRuntime(t, "")
	ctx := context.Background()
	for _, c := range []struct {
		opts airlock.BoxOptions
		want string
	}{
		{airlock.BoxOptions{AllowNet: []string{"10.0.0.0/33"}}, "malformed CIDR"},
		{airlock.BoxOptions{AllowNet: []string{"example.com:99999"}}, "out of range"},
		{airlock.BoxOptions{AllowNet: []string{"api.*.example.com"}}, "wildcard"},
		{airlock.BoxOptions{AllowNet: []string{"127.0.0.1:5432"}}, "--allow-host-port"},
		{airlock.BoxOptions{Network: airlock.NetworkPublic, AllowNet: []string{"example.com"}}, "need network mode"},
		{airlock.BoxOptions{Network: airlock.NetworkNone, Ports: []airlock.PortMapping{{HostPort: 8080, GuestPort: 80}}}, "need a network"},
		{airlock.BoxOptions{Network: "open"}, `network "open"`},
		{airlock.BoxOptions{AllowHostPorts: []int{0}}, "out of range"},
		{airlock.BoxOptions{Ports: []airlock.PortMapping{{HostPort: 8080, GuestPort: 0}}}, "out of range"},
	} {
		_, err := r.Create(ctx, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.opts, err, c.want)
		}
	}
	if vmtest.Missing() == "" && !testing.Short() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		_, err = r.Create(ctx, airlock.BoxOptions{Ports: []airlock.PortMapping{{HostPort: port, GuestPort: 80}}})
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			t.Errorf("port in use: %v", err)
		}
	}
	if boxes, _ := r.List(ctx); len(boxes) != 0 {
		t.Errorf("boxes left behind: %+v", boxes)
	}
}
