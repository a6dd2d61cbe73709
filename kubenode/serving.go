package kubenode

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate"
	"k8s.io/client-go/util/keyutil"
)

// Where the kubelet API's serving certificate comes from (Config.ServingCert).
const (
	// ServingCertFile: the configured pair, Config.TLSCertFile and
	// TLSKeyFile (read once at start).
	ServingCertFile = "file"
	// ServingCertCSR: a certificate from the cluster's CSR API, as a
	// kubelet's with serverTLSBootstrap: the node requests one (signer
	// kubernetes.io/kubelet-serving, subject CN system:node:NAME and O
	// system:nodes, SAN the node's InternalIP), which a cluster admin
	// approves (kubectl certificate approve; Kubernetes approves no
	// kubelet-serving CSR itself), and renews it at 70-90% of its life
	// (client-go's certificate manager). The key and certificate are kept
	// in the airlock home (kube/pki/kubelet-server-current.pem), so a
	// restarted node serves at once with its last one. Until the first is
	// issued, TLS handshakes fail (kubectl logs and exec with them).
	ServingCertCSR = "csr"
	// ServingCertSelf: a self-signed pair for the node's InternalIP, made
	// once in the airlock home (kube/pki/kubelet-self.crt, .key) and
	// remade when it expires within 30 days or names another IP. Only an
	// API server that does not verify kubelets' certificates (no
	// --kubelet-certificate-authority) accepts it.
	ServingCertSelf = "self"
)

// servingCertTTL is the lifetime a node asks of the CSR API (the signer
// may give less: kube-controller-manager's --cluster-signing-duration).
const servingCertTTL = 365 * 24 * time.Hour

// servingSource gives the kubelet API its certificate.
type servingSource struct {
	get  func() *tls.Certificate
	stop func()
}

// getCertificate is the TLS server's GetCertificate.
func (s *servingSource) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.get(); c != nil {
		return c, nil
	}
	return nil, errors.New("kubenode: no serving certificate yet (its CSR awaits approval: kubectl get csr)")
}

// servingCert returns the kubelet API's serving certificate source for
// cfg.ServingCert, with pki the directory of the pairs it keeps and ip
// the node's InternalIP.
func servingCert(ctx context.Context, cfg Config, client kubernetes.Interface, pki, ip string) (*servingSource, error) {
	switch cfg.ServingCert {
	case ServingCertFile:
		pair, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("kubenode: the kubelet API's serving pair (%s, %s): %w", cfg.TLSCertFile, cfg.TLSKeyFile, err)
		}
		return &servingSource{get: func() *tls.Certificate { return &pair }, stop: func() {}}, nil
	case ServingCertSelf:
		pair, err := selfSigned(pki, ip)
		if err != nil {
			return nil, err
		}
		return &servingSource{get: func() *tls.Certificate { return pair }, stop: func() {}}, nil
	case ServingCertCSR:
		return csrServing(ctx, cfg, client, pki, ip)
	}
	return nil, fmt.Errorf("kubenode: ServingCert %q: want %s, %s or %s", cfg.ServingCert, ServingCertFile, ServingCertCSR, ServingCertSelf)
}

// ServingCSRTemplate is the certificate request of node name's kubelet
// API in ServingCertCSR mode: CN system:node:NAME, O system:nodes, the
// node's IP as its one SAN (what kube-controller-manager's
// kubernetes.io/kubelet-serving signer requires).
func ServingCSRTemplate(name, ip string) *x509.CertificateRequest {
	t := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}}}
	if p := net.ParseIP(ip); p != nil {
		t.IPAddresses = []net.IP{p}
	} else {
		t.DNSNames = []string{ip}
	}
	return t
}

// servingUsages are the usages a serving CSR asks for, as a kubelet's:
// digital signature, key encipherment (RSA keys only) and server auth.
func servingUsages(key any) []certificatesv1.KeyUsage {
	if _, ok := key.(*rsa.PrivateKey); ok {
		return []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}
	}
	return []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
}

// csrServing starts client-go's certificate manager for the node's
// serving certificate (ServingCertCSR).
func csrServing(ctx context.Context, cfg Config, client kubernetes.Interface, pki, ip string) (*servingSource, error) {
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, fmt.Errorf("kubenode: the serving certificate's directory: %w", err)
	}
	store, err := certificate.NewFileStore("kubelet-server", pki, pki, "", "")
	if err != nil {
		return nil, fmt.Errorf("kubenode: the serving certificate's store %s: %w", pki, err)
	}
	ttl := servingCertTTL
	mctx, cancel := context.WithCancel(ctx)
	m, err := certificate.NewManager(&certificate.Config{
		ClientsetFn:                  func(*tls.Certificate) (kubernetes.Interface, error) { return client, nil },
		Template:                     ServingCSRTemplate(cfg.Name, ip),
		SignerName:                   certificatesv1.KubeletServingSignerName,
		GetUsages:                    servingUsages,
		RequestedCertificateLifetime: &ttl,
		CertificateStore:             store,
		Name:                         "kubelet-serving",
		Ctx:                          &mctx,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("kubenode: the serving certificate's manager: %w", err)
	}
	m.Start()
	if m.Current() == nil && cfg.Logf != nil {
		cfg.Logf("kubelet API: requested a serving certificate for %s from the cluster's CSR API (signer %s); until it is approved (kubectl get csr; kubectl certificate approve NAME) kubectl logs, exec, attach and port-forward fail",
			ip, certificatesv1.KubeletServingSignerName)
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-mctx.Done():
					return
				case <-t.C:
					if c := m.Current(); c != nil {
						cfg.Logf("kubelet API: serving certificate issued by %s, valid until %s", c.Leaf.Issuer.CommonName, c.Leaf.NotAfter.Format(time.RFC3339))
						return
					}
				}
			}
		}()
	}
	return &servingSource{get: m.Current, stop: func() { cancel(); m.Stop() }}, nil
}

// selfSigned returns the node's self-signed serving pair in pki for ip,
// making it when it is missing, expires within 30 days or is not for ip.
func selfSigned(pki, ip string) (*tls.Certificate, error) {
	certPath, keyPath := filepath.Join(pki, "kubelet-self.crt"), filepath.Join(pki, "kubelet-self.key")
	if pair, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil && pair.Leaf != nil &&
		time.Until(pair.Leaf.NotAfter) > 30*24*time.Hour && pair.Leaf.VerifyHostname(ip) == nil {
		return &pair, nil
	}
	var ips []net.IP
	var dns []string
	if p := net.ParseIP(ip); p != nil {
		ips = []net.IP{p}
	} else {
		dns = []string{ip}
	}
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey(ip, ips, dns)
	if err != nil {
		return nil, fmt.Errorf("kubenode: a self-signed serving pair: %w", err)
	}
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, fmt.Errorf("kubenode: the serving pair's directory: %w", err)
	}
	if err := keyutil.WriteKey(keyPath, keyPEM); err != nil {
		return nil, fmt.Errorf("kubenode: the serving pair's key: %w", err)
	}
	if err := cert.WriteCert(certPath, certPEM); err != nil {
		return nil, fmt.Errorf("kubenode: the serving pair's certificate: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("kubenode: the self-signed serving pair: %w", err)
	}
	return &pair, nil
}
