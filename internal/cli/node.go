package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock/internal/server"

	"github.com/airlock-run/airlock/kubenode"
	"github.com/spf13/cobra"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
)

func init() { extraCommands = append(extraCommands, newNodeCmd) }

func newNodeCmd() *cobra.Command {
	var kubeconfig, name, servingCert, certFile, keyFile, clientCA, address, nodeIP, apiListen, apiTokenFile string
	var allowVolumes []string
	var kubeletPort int
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Join a Kubernetes cluster as a node whose pods run as boxes",
		Long: `node registers this host as Kubernetes node NAME (through virtual-kubelet) and
runs each pod bound to it as an airlock box, until SIGINT or SIGTERM. The node
carries the label and NoSchedule taint airlock.dev/runtime=true: pods reach it
with runtimeClassName: airlock (kubectl apply -f deploy/kubernetes/). Its
capacity is the host's CPUs and airlock's host caps (AIRLOCK_MAX_MEMORY,
AIRLOCK_MAX_BOXES) and the free disk of the airlock home.

A pod runs as one box named k8s-<pod UID>: one container (a pod with more is
refused: status.reason UnsupportedPodSpec), its image (as imagePullPolicy
says; ErrImagePull, then ImagePullBackOff, while it cannot be pulled;
ErrImageNeverPull), command and args (with the
image's entrypoint and cmd, as Kubernetes defines them), env (valueFrom and
envFrom through the API), volumes (emptyDir, configMap, secret, projected;
kept in step with their sources), workingDir, runAsUser, resources.limits cpu
and memory (the box's size), restartPolicy (with a kubelet's back-off) and
activeDeadlineSeconds (DeadlineExceeded).
Its ports are published on the node (hostIP:hostPort, else the node's
IP:containerPort). Deleting the pod removes its box. A restarted node adopts
the boxes of its pods (their commands ended with the node: restartPolicy
applies) and removes those whose pod is gone. deploy/kubernetes/daemonset
runs it on every host of a cluster.

kubectl logs, exec, attach and port-forward, and /stats/summary, reach the
node through its kubelet API, served on --kubelet-port over TLS with the
certificate that --serving-cert says:
  csr   (the default without --tls-cert-file) one from the cluster's CSR API,
        as a kubelet's with serverTLSBootstrap: signer
        kubernetes.io/kubelet-serving, CN system:node:NAME, O system:nodes,
        SAN --node-ip. Kubernetes approves no such request itself: approve it
        (kubectl get csr; kubectl certificate approve NAME); until then those
        commands fail. Kept in $AIRLOCK_HOME/kube/pki and renewed before it
        expires (a new CSR to approve, unless an approver does it).
  file  (the default with --tls-cert-file) the pair
        --tls-cert-file/--tls-private-key-file (a certificate for --node-ip
        signed by the CA of the API server's --kubelet-certificate-authority).
  self  a self-signed pair in $AIRLOCK_HOME/kube/pki: only for API servers that
        do not verify kubelets' certificates.
  off   no kubelet API.
Requests are authenticated by a client certificate of --client-ca-file (the
API server's --kubelet-client-certificate) or a bearer token (TokenReview), and
authorised with SubjectAccessReviews, as a kubelet's are. hack/kube-up.sh DIR
makes a serving pair in DIR/pki (node.crt, node.key, ca.crt). See
docs/kubernetes.md.

The node serves airlock's REST API (the API of airlock serve) for its own
boxes on --api-listen (default port 7770 on --address), for airlock gateway:
requests need the node token (--api-token-file, default
$AIRLOCK_HOME/node.token, made when absent; give every node and gateway the
same one). It advertises the address on its Node (annotation
airlock.dev/api). --api-listen off serves none.

--kubeconfig defaults to $KUBECONFIG; without either, the in-cluster
configuration of a pod's service account is used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if (certFile == "") != (keyFile == "") {
				return usagef(cmd, "--tls-cert-file and --tls-private-key-file go together")
			}
			switch servingCert {
			case "":
				servingCert = kubenode.ServingCertCSR
				if certFile != "" {
					servingCert = kubenode.ServingCertFile
				}
			case kubenode.ServingCertFile:
				if certFile == "" {
					return usagef(cmd, "--serving-cert file needs --tls-cert-file and --tls-private-key-file")
				}
			case kubenode.ServingCertCSR, kubenode.ServingCertSelf, "off":
				if certFile != "" {
					return usagef(cmd, "--serving-cert %s does not use --tls-cert-file: leave it out, or use --serving-cert file", servingCert)
				}
			default:
				return usagef(cmd, "--serving-cert %q: want csr, file, self or off", servingCert)
			}
			if servingCert == "off" {
				servingCert = ""
			}
			if kubeletPort < 0 || kubeletPort > 65535 {
				return usagef(cmd, "--kubelet-port %d: want 0-65535", kubeletPort)
			}
			if name == "" {
				h, err := os.Hostname()
				if err != nil {
					return err
				}
				name = h
			}
			if kubeconfig == "" {
				kubeconfig = os.Getenv("KUBECONFIG")
			}
			if kubeconfig != "" {
				if _, err := os.Stat(kubeconfig); err != nil {
					return usagef(cmd, "--kubeconfig: %v", err)
				}
			}
			client, err := nodeutil.ClientsetFromEnv(kubeconfig)
			if err != nil {
				return err
			}
			// The node's API streams its boxes' events (/v1/events),
			// which airlock gateway follows.
			events := server.NewEvents()
			rt, err := openRuntimeObserved(cmd, events)
			if err != nil {
				return err
			}
			defer rt.Close()
			errw := cmd.ErrOrStderr()
			logf := func(format string, args ...any) {
				fmt.Fprintf(errw, "%s %s\n", time.Now().Format(time.TimeOnly), fmt.Sprintf(format, args...))
			}
			var apiAddr string
			if apiListen != "off" {
				if apiListen == "" {
					apiListen = net.JoinHostPort(address, strconv.Itoa(DefaultNodeAPIPort))
				}
				if apiTokenFile == "" {
					apiTokenFile = filepath.Join(rt.Home(), NodeTokenName)
				}
				tok, err := loadNodeToken(apiTokenFile, true)
				if err != nil {
					return err
				}
				l, err := net.Listen("tcp", apiListen)
				if err != nil {
					return fmt.Errorf("--api-listen: %w", err)
				}
				apiAddr = l.Addr().String()
				// Every gateway's calls are one client here (the node
				// token): the gateways bound each user's execs
				// (--max-execs, tenants' quotas), not the node.
				srv := server.New(server.Config{Runtime: rt, Token: tok, MaxExecsPerClient: NodeAPIMaxExecs, Events: events,
					Logger: slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelWarn}))})
				done := make(chan struct{})
				defer func() { <-done }()
				ctx, cancel := context.WithCancel(cmd.Context())
				defer cancel()
				go func() { defer close(done); srv.Serve(ctx, l) }()
				logf("airlock API for this node's boxes on %s (token in %s)", apiAddr, apiTokenFile)
			}
			return kubenode.Run(cmd.Context(), kubenode.Config{
				Name: name, Client: client, Runtime: rt, Logf: logf,
				Ready:       func() { logf("node %s registered and Ready", name) },
				ServingCert: servingCert, TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: clientCA,
				KubeletAddr: net.JoinHostPort(address, strconv.Itoa(kubeletPort)), NodeIP: nodeIP,
				APIAddr: apiAddr, AllowVolumeDirs: allowVolumes,
			})
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster to join (default $KUBECONFIG, else in-cluster)")
	cmd.Flags().StringVar(&name, "name", "", "the Node's name (default the host name)")
	cmd.Flags().StringVar(&servingCert, "serving-cert", "", "the kubelet API's serving certificate: csr (the cluster's CSR API), file (--tls-cert-file), self (self-signed) or off (no kubelet API); default file with --tls-cert-file, else csr")
	cmd.Flags().StringVar(&certFile, "tls-cert-file", "", "serving certificate of the kubelet API (PEM; --serving-cert file)")
	cmd.Flags().StringVar(&keyFile, "tls-private-key-file", "", "private key of --tls-cert-file (PEM)")
	cmd.Flags().StringVar(&clientCA, "client-ca-file", "", "CA of the client certificates the kubelet API accepts (the API server's --kubelet-client-certificate)")
	cmd.Flags().IntVar(&kubeletPort, "kubelet-port", kubenode.DefaultKubeletPort, "port of the kubelet API (0 picks a free one)")
	cmd.Flags().StringVar(&address, "address", "", "address the kubelet API listens on (default all)")
	cmd.Flags().StringVar(&nodeIP, "node-ip", "", "the node's InternalIP, where the API server reaches the kubelet API (default --address, else the host's first global IPv4 address)")
	cmd.Flags().StringVar(&apiListen, "api-listen", "", "address of airlock's API for this node's boxes, for airlock gateway (default --address:7770; off: none)")
	cmd.Flags().StringArrayVar(&allowVolumes, "allow-volume", nil, "host directory under which boxes made through airlock gateway may attach host directory volumes (repeatable; default none)")
	cmd.Flags().StringVar(&apiTokenFile, "api-token-file", "", "the node token that --api-listen requires (default $AIRLOCK_HOME/node.token, made when absent)")
	return cmd
}

// NodeAPIMaxExecs bounds the execs at once on a node's API, from all the
// gateways together (the node token is one client).
const NodeAPIMaxExecs = 1024

// DefaultNodeAPIPort is the port of airlock node's API (--api-listen).
const DefaultNodeAPIPort = 7770

// NodeTokenName is the node token's file in the airlock home.
const NodeTokenName = "node.token"

// loadNodeToken reads the node token from path; with create, a missing
// file is made (32 random bytes, hex, mode 0600).
func loadNodeToken(path string, create bool) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if len(b) > 4096 {
			return "", fmt.Errorf("node token %s: %d bytes, more than 4096", path, len(b))
		}
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
		return "", fmt.Errorf("node token %s is empty", path)
	}
	if !create || !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("node token: %w", err)
	}
	buf := make([]byte, 32)
	rand.Read(buf)
	t := hex.EncodeToString(buf)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("node token: %w", err)
	}
	return t, nil
}
