package airlock_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/netstack"
	"github.com/airlock-run/airlock/internal/vmtest"
)

// testCert makes a certificate for names (nil: a CA) signed by parent
// (nil: self-signed), with its tls.Certificate.
func testCert(t *testing.T, names []string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, tls.Certificate) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "airlock test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: names,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if names == nil {
		tmpl.Subject.CommonName = "airlock test CA"
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage, tmpl.ExtKeyUsage = true, true, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature, nil
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}
}

// seenRequests records what servers saw of each request, by path. The
// servers answer "ok" only: the box must never get a value back.
type seenRequests struct {
	mu   sync.Mutex
	seen map[string]string
}

func (s *seenRequests) get(path string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[path]
}

// echoServer serves HTTP (TLS when cert is set) on addr, recording each
// request in seen.
func echoServer(t *testing.T, addr string, cert *tls.Certificate, seen *seenRequests) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EACCES) {
		t.Skipf("listen on %s: %v (the test binds ports 80 and 443 of loopback addresses: run it as root)", addr, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if cert != nil {
		l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: []string{"h2", "http/1.1"}})
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		seen.mu.Lock()
		seen.seen[r.URL.Path] = fmt.Sprintf("host=%s proto=%s url=%s auth=%s body=%s", r.Host, r.Proto, r.URL.RequestURI(), r.Header.Get("Authorization"), body)
		seen.mu.Unlock()
		fmt.Fprint(w, "ok")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

// secretsScript sends Authorization: Bearer $TOKEN to each URL with
// urllib (and pip's vendored requests for the first, when the image has
// it) and prints what came back, or the error's class.
const secretsScript = `
import os, ssl, sys, urllib.request
tok = os.environ["TOKEN"]
def get(url, cafile=None):
    req = urllib.request.Request(url + "?k=" + tok, data=("body " + tok).encode(), headers={"Authorization": "Bearer " + tok})
    ctx = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as r:
            return r.read().decode()
    except Exception as e:
        return "error:" + type(e).__name__ + ":" + str(e)[:200]
print("token", tok)
print("api", get("https://api.test/api"))
print("other", get("https://other.test/other", cafile="/tmp/test-ca.pem"))
print("plain", get("http://api.test/plain"))
print("badcert", get("https://badcert.test/badcert"))
try:
    from pip._vendor import requests
    r = requests.get("https://api.test/r", headers={"Authorization": "Bearer " + tok}, timeout=20)
    print("requests", r.text)
except ImportError:
    print("requests", "missing")
except Exception as e:
    print("requests", "error:" + type(e).__name__)
`

// TestSecretsVM runs a box with a secret bound to api.test (and
// badcert.test) under an allowlist that lists neither, in the network
// test harness (the "internet" on loopback addresses, a DNS server of the
// test's own, the HTTPS servers' test CA trusted by the helper through
// AIRLOCK_EXTRA_CA): the server of api.test sees the value in the
// Authorization header (urllib; pip's requests when present) and the
// placeholder in the URL and body; other.test, listed but not bound, gets
// the placeholder and shows the box its real certificate; plain HTTP to
// api.test carries the placeholder; badcert.test, whose certificate the
// helper cannot verify, fails the box's request; the value is nowhere in
// the box (env, /proc/*/environ, the kernel command line, its files, a
// memory snapshot, its export archives, the writable layer), and the
// network log names the secret, not its value. A second box, of
// vmtest.NetClientsImage, sends through curl (HTTP/1.1 and HTTP/2),
// requests, httpx and Node's fetch: each trusts the box's CA and the
// server sees the value.
func TestSecretsVM(t *testing.T) {
	vmtest.Require(t)
	t.Setenv(netstack.TestInternetEnv, "198.18.0.0/24")
	ca, caKey, _ := testCert(t, nil, nil, nil)
	_, _, good := testCert(t, []string{"api.test", "other.test"}, ca, caKey)
	_, _, bad := testCert(t, []string{"badcert.test"}, nil, nil) // self-signed: not verifiable
	seen := &seenRequests{seen: map[string]string{}}
	echoServer(t, "127.0.0.71:443", &good, seen)
	echoServer(t, "127.0.0.71:80", nil, seen)
	echoServer(t, "127.0.0.72:443", &good, seen)
	echoServer(t, "127.0.0.73:443", &bad, seen)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	caFile := filepath.Join(t.TempDir(), "test-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(netstack.ExtraCAEnv, caFile)
	z := startDNS(t, map[string]string{"api.test": "198.18.0.71", "other.test": "198.18.0.72", "badcert.test": "198.18.0.73"})
	t.Setenv(netstack.UpstreamEnv, z.addr)

	rb := make([]byte, 12)
	rand.Read(rb)
	value := "sk-airlock-test-" + hex.EncodeToString(rb)
	r := openRuntime(t, t.TempDir())
	ctx := context.Background()
	b, err := r.Create(ctx, airlock.BoxOptions{
		AllowNet: []string{"other.test:443", "api.test:80"}, // api.test:443 and badcert.test:443 come with the secret
		Secrets:  map[string]airlock.Secret{"TOKEN": {Value: value, Hosts: []string{"api.test", "badcert.test"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove(context.Background(), true) })
	if err := b.WriteFile(ctx, "/tmp/test-ca.pem", caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	res := exec(t, b, airlock.ExecOptions{Timeout: 120 * time.Second}, "python3", "-c", secretsScript)
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	ph := got["token"]
	if !strings.HasPrefix(ph, "airlock-secret-") {
		t.Fatalf("TOKEN in the box: %q (stdout %q, stderr %q)", ph, res.Stdout, res.Stderr)
	}
	for k, want := range map[string]string{
		"api":   "host=api.test proto=HTTP/1.1 url=/api?k=" + ph + " auth=Bearer " + value + " body=body " + ph,
		"other": "host=other.test proto=HTTP/1.1 url=/other?k=" + ph + " auth=Bearer " + ph + " body=body " + ph,
		"plain": "host=api.test proto=HTTP/1.1 url=/plain?k=" + ph + " auth=Bearer " + ph + " body=body " + ph,
	} {
		if got[k] != "ok" || seen.get("/"+k) != want {
			t.Errorf("%s: the box got %q; the server saw %q, want %q", k, got[k], seen.get("/"+k), want)
		}
	}
	if !strings.HasPrefix(got["badcert"], "error:") || seen.get("/badcert") != "" {
		t.Errorf("badcert: %q (the server saw %q), want the request to fail", got["badcert"], seen.get("/badcert"))
	}
	if g := got["requests"]; g != "missing" && (g != "ok" || seen.get("/r") != "host=api.test proto=HTTP/1.1 url=/r auth=Bearer "+value+" body=") {
		t.Errorf("pip's requests: %q, the server saw %q", g, seen.get("/r"))
	}
	t.Logf("requests: %s; badcert: %s", got["requests"], got["badcert"])

	// A new value (Box.SetSecret) applies to the running box at once.
	if err := b.SetSecret(ctx, "TOKEN", value+"-rotated"); err != nil {
		t.Fatal(err)
	}
	rot := exec(t, b, airlock.ExecOptions{Timeout: 60 * time.Second}, "python3", "-c", `
import os, urllib.request
r = urllib.request.Request("https://api.test/rotated", headers={"Authorization": "Bearer " + os.environ["TOKEN"]})
print(urllib.request.urlopen(r, timeout=20).read().decode())`)
	if want := "host=api.test proto=HTTP/1.1 url=/rotated auth=Bearer " + value + "-rotated body="; seen.get("/rotated") != want {
		t.Errorf("after SetSecret the server saw %q (box: %q %q), want %q", seen.get("/rotated"), rot.Stdout, rot.Stderr, want)
	}

	// A memory snapshot of the box (its RAM, device state and writable
	// layer) holds no value (taken before the scan below gives the box the
	// value to look for).
	if _, err := b.Snapshot(ctx, "secrets"); err != nil {
		t.Fatal(err)
	}
	filepath.Walk(filepath.Join(r.Home(), "snapshots", "secrets"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if n, err := scanAllocated(p, []byte(value)); err != nil || n > 0 {
				t.Errorf("snapshot file %s holds the value %d times (%v)", filepath.Base(p), n, err)
			}
		}
		return nil
	})
	// Nor does that snapshot's export archive (what leaves the host).
	var snapArchive bytes.Buffer
	if _, err := r.ExportSnapshot(ctx, "secrets", &snapArchive); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(snapArchive.Bytes(), []byte(value)); n > 0 || snapArchive.Len() == 0 {
		t.Errorf("the snapshot's export archive (%d bytes) holds the value %d times", snapArchive.Len(), n)
	}
	// The value is nowhere in the box: its environment, its processes'
	// (/proc/*/environ), its kernel command line and its writable places
	// (in the box; the scan gets the value in two halves, so that its own
	// command line is all that has it whole), and, once stopped, its
	// writable layer, every allocated byte of it, read on the host (the
	// image's base was made before the box, and is read-only).
	h := len(value) / 2
	scan := exec(t, b, airlock.ExecOptions{Timeout: 120 * time.Second}, "sh", "-c", `
v="$1$2"
env | grep -cF "$v"
cat /proc/*/environ /proc/cmdline 2>/dev/null | grep -caF "$v"
grep -rlsF "$v" /etc /root /tmp /run /home /dev/shm | head
echo scanned`, "sh", value[:h], value[h:])
	if out := string(scan.Stdout); out != "0\n0\nscanned\n" {
		t.Errorf("the value is in the box: %q (stderr %q)", out, scan.Stderr)
	}
	ca2, err := b.ReadFile(ctx, "/etc/airlock/ca.pem")
	if err != nil || !strings.Contains(string(ca2), "BEGIN CERTIFICATE") || strings.Contains(string(ca2), "PRIVATE") {
		t.Errorf("the box's CA in the box: %q, %v", ca2, err)
	}
	log, _ := os.ReadFile(b.NetworkLog())
	if !strings.Contains(string(log), "https api.test secret TOKEN substituted") || strings.Contains(string(log), value) {
		t.Errorf("network log:\n%s", log)
	}
	if !strings.Contains(string(log), "tls badcert.test denied: real host not verified") {
		t.Errorf("network log lacks the unverified host:\n%s", log)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	rw := filepath.Join(r.Home(), "boxes", b.ID(), "rw.ext4")
	if n, err := scanAllocated(rw, []byte(value)); err != nil || n > 0 {
		t.Errorf("the box's writable layer holds the value %d times (%v)", n, err)
	}
	// The stopped box's export archive (its writable layer) holds no value
	// either.
	var boxArchive bytes.Buffer
	if _, err := b.Export(ctx, &boxArchive, airlock.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(boxArchive.Bytes(), []byte(value)); n > 0 || boxArchive.Len() == 0 {
		t.Errorf("the box's export archive (%d bytes) holds the value %d times", boxArchive.Len(), n)
	}
	// The scan finds what is there: a line of the CA certificate the box
	// was given.
	if lines := strings.Split(string(ca2), "\n"); len(lines) > 2 {
		if n, err := scanAllocated(rw, []byte(lines[1])); err != nil || n == 0 {
			t.Errorf("the scan of the writable layer does not find the box's CA certificate (%d, %v)", n, err)
		}
		if !bytes.Contains(boxArchive.Bytes(), []byte(lines[1])) {
			t.Errorf("the box's export archive does not hold the box's CA certificate: the scan of it finds nothing")
		}
	}

	// The HTTP clients users run trust the box's CA and get the value
	// substituted: curl (HTTP/1.1 and HTTP/2), Python's requests and
	// httpx, Node's fetch.
	vmtest.RequireImage(t, vmtest.NetClientsImage)
	c, err := r.Create(ctx, airlock.BoxOptions{Image: vmtest.NetClientsImage, AllowNet: []string{"other.test:443"},
		Secrets: map[string]airlock.Secret{"TOKEN": {Value: value, Hosts: []string{"api.test"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Remove(context.Background(), true) })
	clients := exec(t, c, airlock.ExecOptions{Timeout: 180 * time.Second}, "sh", "-c", `
auth="Authorization: Bearer $TOKEN"
echo "curl $(curl -sS --http1.1 -H "$auth" https://api.test/curl 2>&1)"
echo "curl2 $(curl -sS --http2 -H "$auth" https://api.test/curl2 2>&1)"
echo "requests $(python3 -c 'import os, requests; print(requests.get("https://api.test/requests", headers={"Authorization": "Bearer " + os.environ["TOKEN"]}, timeout=30).text)' 2>&1 | tail -1)"
echo "httpx $(python3 -c 'import os, httpx; print(httpx.get("https://api.test/httpx", headers={"Authorization": "Bearer " + os.environ["TOKEN"]}, timeout=30).text)' 2>&1 | tail -1)"
echo "node $(node -e 'fetch("https://api.test/node", {headers: {Authorization: "Bearer " + process.env.TOKEN}}).then(r => r.text()).then(console.log, e => console.log("error: " + e + " " + (e.cause || "")))' 2>&1 | tail -1)"
`)
	for _, l := range strings.Split(strings.TrimSpace(string(clients.Stdout)), "\n") {
		k, v, _ := strings.Cut(l, " ")
		proto := "HTTP/1.1"
		if k == "curl2" {
			proto = "HTTP/2.0"
		}
		if want := "host=api.test proto=" + proto + " url=/" + k + " auth=Bearer " + value + " body="; v != "ok" || seen.get("/"+k) != want {
			t.Errorf("%s in a box: got %q; the server saw %q, want %q", k, v, seen.get("/"+k), want)
		}
	}
	if n := strings.Count(string(clients.Stdout), "\n"); n != 5 {
		t.Errorf("clients: %d lines, want 5: %q (stderr %q)", n, clients.Stdout, clients.Stderr)
	}
}

// scanAllocated counts the occurrences of v in the allocated parts of the
// sparse file p.
func scanAllocated(p string, v []byte) (int, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, _ := f.Stat()
	n := 0
	buf := make([]byte, 4<<20)
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data past off
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return n, err
		}
		// Read the extent in overlapping chunks (a match may span two).
		for pos := data; pos < hole; pos += int64(len(buf) - len(v)) {
			k, err := f.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if k == 0 && err != nil {
				return n, err
			}
			n += bytes.Count(buf[:k], v)
			if pos+int64(k) >= hole {
				break
			}
		}
		off = hole
	}
	return n, nil
}
