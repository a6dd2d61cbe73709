package kubenode

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"net"
	"slices"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// TestSelfSignedServing: --serving-cert self makes a pair for the node's
// IP in the given directory, serves the same one after a restart, and
// makes a new one when the node's IP changes.
func TestSelfSignedServing(t *testing.T) {
	dir := t.TempDir()
	a, err := selfSigned(dir, "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Leaf.VerifyHostname("10.1.2.3"); err != nil {
		t.Fatalf("the self-signed pair: %v", err)
	}
	b, err := selfSigned(dir, "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Certificate[0], b.Certificate[0]) {
		t.Error("a second start made a new pair; want the kept one")
	}
	c, err := selfSigned(dir, "10.9.9.9")
	if err != nil {
		t.Fatal(err)
	}
	if c.Leaf.VerifyHostname("10.9.9.9") != nil || bytes.Equal(a.Certificate[0], c.Certificate[0]) {
		t.Error("a new IP kept the old pair")
	}
}

// TestServingCSRTemplate: the request is what kube-controller-manager's
// kubernetes.io/kubelet-serving signer signs: O system:nodes, CN
// system:node:NAME, an IP (or DNS) SAN, server auth usages.
func TestServingCSRTemplate(t *testing.T) {
	r := ServingCSRTemplate("n1", "192.0.2.7")
	if r.Subject.CommonName != "system:node:n1" || !slices.Equal(r.Subject.Organization, []string{"system:nodes"}) ||
		len(r.IPAddresses) != 1 || !r.IPAddresses[0].Equal(net.ParseIP("192.0.2.7")) || len(r.DNSNames) != 0 {
		t.Errorf("template %+v", r)
	}
	if r := ServingCSRTemplate("n1", "node.example"); !slices.Equal(r.DNSNames, []string{"node.example"}) || len(r.IPAddresses) != 0 {
		t.Errorf("template for a name: %+v", r)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ds, ke, sa := certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth
	if u := servingUsages(rk); !slices.Equal(u, []certificatesv1.KeyUsage{ds, ke, sa}) {
		t.Errorf("RSA usages %v", u)
	}
	if u := servingUsages(ek); !slices.Equal(u, []certificatesv1.KeyUsage{ds, sa}) {
		t.Errorf("ECDSA usages %v", u)
	}
}
