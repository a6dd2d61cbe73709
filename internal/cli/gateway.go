package cli

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"

	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/gateway"
	"github.com/airlock-run/airlock/internal/server"
)

func init() { extraCommands = append(extraCommands, newGatewayCmd) }

// DefaultGatewayListen is airlock gateway's --listen default.
const DefaultGatewayListen = "127.0.0.1:7771"

func newGatewayCmd() *cobra.Command {
	var kubeconfig, listen, tokenFile, nodeTokenFile, namespace, logFormat, tenantsFile, auditPath string
	var createTimeout time.Duration
	var publish []string
	var hostPorts []int
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve airlock's API over the airlock nodes of a Kubernetes cluster",
		Long: `gateway serves airlock's REST API (the OpenAPI of airlock serve, so the SDKs, with
AIRLOCK_URL and AIRLOCK_TOKEN) on --listen for the airlock nodes of a
Kubernetes cluster, until SIGINT or SIGTERM. It keeps no state: a box is a pod
(named box-ID, with runtimeClassName: airlock, in --namespace), placed by the
Kubernetes scheduler on an airlock node; every call into a box is proxied to
the airlock API of its node (airlock node --api-listen), authenticated with the
node token (--node-token-file), never the client's. Any number of gateways
answer for the same boxes.

Clients send Authorization: Bearer TOKEN, the token of --token-file (else
$AIRLOCK_TOKEN). A box whose node is NotReady, has lost its lease or does not
answer is reported with state lost, and calls into it fail with box_lost: it
is never recreated. See docs/kubernetes.md.

--tenants FILE (airlock tenant add NAME --tenants FILE, as for airlock serve)
adds tenants: each token of FILE is a tenant that sees, lists and touches only
its own boxes (their pods carry the label airlock.dev/tenant), within its
quotas of boxes, vCPUs, memory, disk and execs, counted from the cluster's
pods, so they hold across gateways. The token of --token-file is the admin,
who sees every box. FILE is reloaded when it changes and on SIGHUP.
--audit-log FILE gets one JSON line per exec, code run, cell and install,
naming the tenant.

--kubeconfig defaults to $KUBECONFIG; without either, the in-cluster
configuration of a pod's service account is used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			token := os.Getenv("AIRLOCK_TOKEN")
			if tokenFile != "" {
				t, err := loadNodeToken(tokenFile, false)
				if err != nil {
					return usagef(cmd, "--token-file: %v", err)
				}
				token = t
			}
			if token == "" {
				return usagef(cmd, "no token for clients: --token-file FILE or AIRLOCK_TOKEN")
			}
			if nodeTokenFile == "" {
				nodeTokenFile = filepath.Join(defaults.Home(), NodeTokenName)
			}
			nodeToken, err := loadNodeToken(nodeTokenFile, false)
			if err != nil {
				return usagef(cmd, "--node-token-file: %v (the token of the nodes' airlock node --api-token-file)", err)
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
			errw := cmd.ErrOrStderr()
			var h slog.Handler = slog.NewTextHandler(errw, nil)
			if logFormat == "json" {
				h = slog.NewJSONHandler(errw, nil)
			}
			log := slog.New(h)
			cfg := server.Config{Token: token, Logger: log, Metrics: server.NewMetrics(server.Version()), Events: server.NewEvents()}
			for _, p := range publish {
				g, err := server.ParsePublishGrant(p)
				if err != nil {
					return usagef(cmd, "%v", err)
				}
				cfg.Policy.AllowPublish = append(cfg.Policy.AllowPublish, g)
			}
			cfg.Policy.AllowHostPorts = hostPorts
			if tenantsFile != "" {
				set, stop, err := watchTenants(cmd.Context(), tenantsFile, log)
				if err != nil {
					return err
				}
				defer stop()
				cfg.Tenants = set
			}
			if auditPath != "" {
				audit, err := server.OpenAuditLog(auditPath, 0)
				if err != nil {
					return err
				}
				defer audit.Close()
				cfg.Audit = audit
			}
			gw, err := gateway.New(gateway.Config{Client: client, Namespace: namespace, NodeToken: nodeToken,
				CreateTimeout: createTimeout, Logf: func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...)) }})
			if err != nil {
				return err
			}
			defer gw.Close()
			if err := gw.Start(cmd.Context()); err != nil {
				return err
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen: %w", err)
			}
			log.Info("airlock gateway", "listen", l.Addr().String(), "namespace", namespace)
			cfg.Cluster = gw
			return server.New(cfg).Serve(cmd.Context(), l)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file of the cluster (default $KUBECONFIG, else in-cluster)")
	f.StringVar(&listen, "listen", DefaultGatewayListen, "TCP address to serve the API on")
	f.StringVar(&tokenFile, "token-file", "", "file holding the bearer token clients send (default $AIRLOCK_TOKEN)")
	f.StringVar(&nodeTokenFile, "node-token-file", "", "file holding the nodes' API token (airlock node --api-token-file; default $AIRLOCK_HOME/node.token)")
	f.StringVar(&namespace, "namespace", gateway.DefaultNamespace, "namespace of the boxes' pods")
	f.DurationVar(&createTimeout, "create-timeout", gateway.DefaultCreateTimeout, "how long a create waits for its pod to run on a node")
	f.StringVar(&logFormat, "log-format", "text", "access log format: text or json")
	f.StringVar(&tenantsFile, "tenants", "", "tenants file (airlock tenant add): more tokens, each a tenant with its own boxes, quotas and grants; reloaded on change and on SIGHUP")
	f.StringArrayVar(&publish, "allow-publish", nil, "host addresses and ports of the nodes that boxes may publish: [ADDR:]PORT[-PORT][/tcp|/udp], as airlock serve --allow-publish (repeatable; default none)")
	f.IntSliceVar(&hostPorts, "allow-host-port", nil, "ports of a node's 127.0.0.1 that boxes may reach (allow_host_ports), as airlock serve --allow-host-port (default none)")
	f.StringVar(&auditPath, "audit-log", "", "file to append a JSON line to per exec, code run, cell and install (default none)")
	return cmd
}
