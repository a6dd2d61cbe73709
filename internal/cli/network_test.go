package cli_test

import (
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"

	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// TestCLINetwork: --allow-net at creation (listed name allowed, unlisted
// name and address refused, the unlisted query never reaching the
// upstream), -p with airlock port and ls, airlock network to show and
// change a running box's policy, logs --network, and clear errors for bad
// flags. Traffic stays on loopback: the "internet" is 198.18.0.0/24, which
// the helper's test-only override (netstack.TestInternetEnv) reaches on
// 127.0.0.0/24, and the upstream resolver is this test's.
func TestCLINetwork(t *testing.T) {
	vmtest.Require(t)
	t.Setenv(netstack.TestInternetEnv, "198.18.0.0/24")
	site := listenGreeting(t, "127.0.0.2:0", "allowed site")
	other := listenGreeting(t, "127.0.0.3:0", "other site")
	var unlistedQueries atomic.Int64
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg).SetReply(q)
		switch q.Question[0].Name {
		case "allowed.test.":
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "allowed.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP("198.18.0.2")})
		case "unlisted.test.":
			unlistedQueries.Add(1)
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "unlisted.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP("198.18.0.3")})
		default:
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	defer srv.Shutdown()
	t.Setenv(netstack.UpstreamEnv, pc.LocalAddr().String())
	c := cli{t, t.TempDir()}
	sp, op := strconv.Itoa(site), strconv.Itoa(other)
	probe := `
import socket, sys
for a in sys.argv[1:]:
    h, p = a.rsplit(":", 1)
    try:
        s = socket.create_connection((h, int(p)), timeout=5)
        print(a, s.makefile().readline().strip())
    except socket.gaierror:
        print(a, "dns-error")
    except OSError as e:
        print(a, type(e).__name__)
`
	out, errs, code := c.run("run", "--rm", "--allow-net", "allowed.test", "python:slim", "python3", "-c", probe,
		"allowed.test:"+sp, "unlisted.test:"+op, "198.18.0.3:"+op)
	want := "allowed.test:" + sp + " allowed site\nunlisted.test:" + op + " dns-error\n198.18.0.3:" + op + " ConnectionRefusedError\n"
	if code != 0 || out != want {
		t.Errorf("allowlist run: code %d\n%s\nwant\n%s\nstderr %s", code, out, want, errs)
	}
	if n := unlistedQueries.Load(); n != 0 {
		t.Errorf("the upstream got %d queries for the unlisted name", n)
	}

	if out, errs, code = c.run("create", "--name", "web", "-p", "0:8000", "python:slim"); code != 0 {
		t.Fatalf("create -p: %d %q %q", code, out, errs)
	}
	defer c.run("rm", "-f", "web")
	out, _, _ = c.run("port", "web")
	if !strings.HasPrefix(out, "8000/tcp -> 127.0.0.1:") {
		t.Errorf("port: %q", out)
	}
	hostPort := strings.TrimSpace(strings.TrimPrefix(out, "8000/tcp -> 127.0.0.1:"))
	if out, _, _ = c.run("ls"); !strings.Contains(out, "PORTS") || !strings.Contains(out, "127.0.0.1:"+hostPort+"->8000/tcp") {
		t.Errorf("ls: %q", out)
	}
	if out, _, _ = c.run("exec", "web", "python3", "-c", probe, "10.0.2.2:"+sp, "198.18.0.3:"+op); out != "10.0.2.2:"+sp+" ConnectionRefusedError\n198.18.0.3:"+op+" other site\n" {
		t.Errorf("public box: %q", out)
	}
	if out, errs, code = c.run("network", "web", "--allow-net", "allowed.test:"+sp); code != 0 {
		t.Fatalf("network --allow-net: %d %q %q", code, out, errs)
	}
	if out, _, _ = c.run("exec", "web", "python3", "-c", probe, "198.18.0.3:"+op, "allowed.test:"+sp); out != "198.18.0.3:"+op+" ConnectionRefusedError\nallowed.test:"+sp+" allowed site\n" {
		t.Errorf("after airlock network: %q", out)
	}
	// A flag alone keeps the rest: the box stays an allowlist box.
	if out, errs, code = c.run("network", "web", "--allow-host-port", "5432"); code != 0 {
		t.Fatalf("network --allow-host-port: %d %q %q", code, out, errs)
	}
	out, _, _ = c.run("network", "web")
	for _, w := range []string{"mode:", "allowlist", "allow-net:", "allowed.test:" + sp, "allow-host-port:", "5432", "publish:", "denied:"} {
		if !strings.Contains(out, w) {
			t.Errorf("network web lacks %q:\n%s", w, out)
		}
	}
	out, _, _ = c.run("logs", "--network", "web")
	for _, w := range []string{"tcp 10.0.2.2:" + sp + " denied: gateway", "tcp 198.18.0.3:" + op + " denied: not in allowlist"} {
		if !strings.Contains(out, w) {
			t.Errorf("logs --network lacks %q:\n%s", w, out)
		}
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--rm", "--allow-net", "api.*.example.com", "python:slim", "true"}, "wildcard"},
		{[]string{"run", "--rm", "--allow-net", "10.0.0.0/40", "python:slim", "true"}, "malformed CIDR"},
		{[]string{"run", "--rm", "--network", "none", "-p", "8080:80", "python:slim", "true"}, "need a network"},
		{[]string{"run", "--rm", "-p", "8080:99999", "python:slim", "true"}, "out of range"},
		{[]string{"run", "--rm", "--allow-host-port", "70000", "python:slim", "true"}, "out of range"},
	} {
		_, errs, code := c.run(bad.args...)
		if code != 125 || !strings.Contains(errs, bad.want) {
			t.Errorf("%v: code %d, stderr %q; want 125 and %q", bad.args, code, errs, bad.want)
		}
	}
}

// listenGreeting serves greeting on each connection to addr.
func listenGreeting(t *testing.T, addr, greeting string) int {
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
