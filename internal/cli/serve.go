package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/mcpserver"
	"github.com/airlock-run/airlock/internal/server"
	"github.com/airlock-run/airlock/internal/tenant"
)

func init() { extraCommands = append(extraCommands, newServeCmd) }

func newServeCmd() *cobra.Command {
	var (
		socket, listen, token, logFormat string
		idleExit                         time.Duration
		maxExecs, maxConns, maxSubs      int
		maxMCPSessions                   int
		e2bAddr                          string
		e2bTemplates                     []string
		maxOutput                        int64
		writeStall                       time.Duration
		maxBody, maxUpload               int64
		allowNamedVolumes                bool
		printSpec                        bool
		policy                           server.Policy
		auditPath                        string
		auditMax                         int64
		pools                            []string
		publish                          []string
		tenantsFile                      string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API (REST, WebSocket exec, /metrics) on a unix socket or TCP",
		Long: `serve runs airlock's HTTP API (see docs/server.md; the OpenAPI document is at
/openapi.json and in api/openapi.json).

By default it listens on a unix socket in the airlock home, owner-only
(` + server.SocketName + `; --socket or AIRLOCK_SOCKET for another). With --listen ADDR it
also listens on TCP, where every request needs "Authorization: Bearer TOKEN":
the token is --token, else AIRLOCK_TOKEN, else the one stored in
` + server.TokenName + ` in the home (generated, mode 0600, on first use).

On SIGINT or SIGTERM it stops accepting, drains in-flight requests (30 s) and
exits; boxes keep running. With --idle-exit it exits by itself after that long
with no request and no running box (the SDKs start it so).

--pool IMAGE[=N] (repeatable) keeps N boxes of IMAGE (default 2) ready, each
with a Python context kernel already started: a create with the image and
default options takes one (tens of milliseconds instead of a boot), and its
first context runs at once. They are not listed (GET /v1/pools shows them,
and airlock system df) and are removed on exit. Pool boxes count against
--max-boxes and the host caps: a pool fills only up to them, and a client's
box started at a cap takes the place of a ready pool box (docs/pool.md).

Clients get no more of the host than the policy flags grant (403
policy_denied otherwise): host volumes (--allow-volume), host ports
(--allow-host-port), published ports (--allow-publish), private allow_net
ranges and image pulls from loopback or private registries
(--allow-private-net), and the caps --max-boxes, --max-cpus,
--max-memory, and what they can make it write: --max-disk per box,
--min-free-disk kept free in the home, --max-volumes and --max-volume-space
for named volumes, --max-snapshots (these have defaults). The grants and caps
are server-wide (--max-execs is per client: the token, a tenant, or the unix
socket). The MCP endpoint (/mcp) obeys them too: a session's box is
checked as a REST create is, and its tool calls take the exec slots of one
client, "mcp", or of the session's tenant (--max-mcp-sessions bounds the
sessions).

--tenants FILE adds tenants: each token of FILE (airlock tenant add NAME
makes one) is a tenant that sees, lists and touches only its own boxes,
snapshots and named volumes (another's box is 404, as one that does not
exist), within its own quotas (boxes, vCPUs, memory, disk, snapshots,
concurrent execs) and the server's grants its entry names. The server's own
token and the unix socket stay the admin: they see every box. FILE is
reloaded when it changes (checked every second) and on SIGHUP, so tokens
are added and revoked without a restart. Every audit line names its tenant.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if printSpec {
				spec, err := server.OpenAPI()
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", spec)
				return err
			}
			errw := cmd.ErrOrStderr()
			var h slog.Handler = slog.NewTextHandler(errw, nil)
			if logFormat == "json" {
				h = slog.NewJSONHandler(errw, nil)
			}
			log := slog.New(h)
			dirs, err := server.ResolveVolumeDirs(policy.AllowVolumeDirs)
			if err != nil {
				return err
			}
			policy.AllowVolumeDirs = dirs
			policy.DenyNamedVolumes = !allowNamedVolumes
			// 0 on the command line is no limit, as for the other caps;
			// in Policy it is the default.
			for _, c := range []*int{&policy.MaxSnapshots, &policy.MaxDiskMiB, &policy.MinFreeDiskMiB, &policy.MaxVolumes, &policy.MaxVolumesMiB} {
				if *c <= 0 {
					*c = server.NoLimit
				}
			}
			for _, p := range publish {
				g, err := server.ParsePublishGrant(p)
				if err != nil {
					return err
				}
				policy.AllowPublish = append(policy.AllowPublish, g)
			}
			metrics := server.NewMetrics(server.Version())
			events := server.NewEvents()
			po, err := parsePools(pools)
			if err != nil {
				return usagef(cmd, "serve: %v", err)
			}
			rt, err := airlock.Open(airlock.Options{
				Warn:     func(msg string) { log.Warn(msg) },
				Pull:     pullWithProgress(cmd.Context(), errw),
				Observer: server.Observers{metrics, events},
				Pool:     po,
				// Pool boxes count against --max-boxes: the pools fill
				// only up to it, and give way to clients' boxes.
				PoolMaxHomeBoxes: policy.MaxBoxes,
			})
			if err != nil {
				return err
			}
			defer rt.Close()
			go logPools(cmd.Context(), rt, log)
			metrics.SetRuntime(rt)
			metrics.SetPools(rt)
			if socket == "" {
				socket = server.DefaultSocket(rt.Home())
			}
			var ls []net.Listener
			ul, err := listenReplacing(socket, idleExit, log)
			if err != nil {
				return err
			}
			defer os.Remove(socket)
			ls = append(ls, ul)
			log.Info("listening", "socket", socket)
			if auditPath == "" {
				auditPath = filepath.Join(rt.Home(), "audit.log")
			}
			var audit *server.AuditLog
			if auditPath != "off" {
				if audit, err = server.OpenAuditLog(auditPath, auditMax); err != nil {
					return err
				}
				defer audit.Close()
			}
			// The MCP endpoint obeys the server's policy: its session
			// boxes are checked as REST creates are, and its tool calls
			// take exec slots (srv is set before Serve accepts anything).
			var srv *server.Server
			ms := mcpserver.New(rt, mcpserver.Options{Version: server.Version(),
				CheckBox: func(ctx context.Context, o *airlock.BoxOptions) (func(), error) {
					return srv.CheckBox(ctx, o) // srv is set below, before Serve
				},
				AcquireExec: func(ctx context.Context) (func(), error) {
					return srv.AcquireExec(ctx, server.MCPClient)
				},
				CheckCheckpoint: func(ctx context.Context, b *airlock.Box) error { return srv.CheckCheckpoint(ctx, b) },
				MaxSessions:     maxMCPSessions,
			})
			defer ms.Close()
			cfg := server.Config{Runtime: rt, Audit: audit, MCP: ms.HTTPHandler(), Logger: log, MaxExecsPerClient: maxExecs, MaxBodyBytes: maxBody, MaxUploadBytes: maxUpload,
				IdleExit: idleExit, Metrics: metrics, Events: events, Policy: policy,
				MaxOutputBytes: maxOutput, MaxConns: maxConns, MaxSubscribers: maxSubs, WriteStall: writeStall}
			var tokenFile string // where the generated or stored token is ("" for --token, AIRLOCK_TOKEN)
			if listen != "" || e2bAddr != "" {
				tok, where, err := server.LoadToken(rt.Home(), token)
				if err != nil {
					return err
				}
				cfg.Token, tokenFile = tok, where
			}
			if tenantsFile != "" {
				set, stop, err := watchTenants(cmd.Context(), tenantsFile, log)
				if err != nil {
					return err
				}
				defer stop()
				cfg.Tenants = set
				if listen == "" {
					log.Warn("--tenants without --listen: tenants' tokens are for TCP clients, and the unix socket is the admin's")
				}
			}
			if listen != "" {
				tok, where, err := server.LoadToken(rt.Home(), token)
				if err != nil {
					return err
				}
				cfg.Token = tok
				tl, err := net.Listen("tcp", listen)
				if err != nil {
					ul.Close()
					return err
				}
				ls = append(ls, tl)
				if where != "" {
					log.Info("listening", "tcp", tl.Addr().String(), "token_file", where)
				} else {
					log.Info("listening", "tcp", tl.Addr().String())
				}
			}
			log.Info("grants", "allow_volume", policy.AllowVolumeDirs, "allow_named_volumes", allowNamedVolumes,
				"allow_host_port", policy.AllowHostPorts, "allow_private_net", policy.AllowPrivateNet, "allow_publish", publish, "allow_import_state", policy.AllowImportState,
				"max_disk", policy.MaxDiskMiB, "min_free_disk", policy.MinFreeDiskMiB, "max_volumes", policy.MaxVolumes,
				"max_volume_space", policy.MaxVolumesMiB, "max_snapshots", policy.MaxSnapshots)
			srv = server.New(cfg)
			if e2bAddr != "" {
				stop, err := serveE2B(cmd.Context(), log, rt, cfg.Token, tokenFile, e2bAddr, e2bTemplates, maxConns, maxUpload, audit, srv)
				if err != nil {
					for _, l := range ls {
						l.Close()
					}
					return err
				}
				defer stop()
			}
			return srv.Serve(cmd.Context(), ls...)
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "socket", "", "unix socket path (default $AIRLOCK_SOCKET, else "+server.SocketName+" in the airlock home)")
	f.StringVar(&listen, "listen", "", "also listen on this TCP address (e.g. 127.0.0.1:8100); needs the bearer token")
	f.StringVar(&token, "token", "", "bearer token for TCP clients (default $AIRLOCK_TOKEN, else generated and stored in the home)")
	f.DurationVar(&idleExit, "idle-exit", 0, "exit after this long with no request and no running box (0: never)")
	f.IntVar(&maxExecs, "max-execs", server.DefaultMaxExecsPerClient, "concurrent execs per client (token, or the unix socket)")
	f.Int64Var(&maxBody, "max-body", server.DefaultMaxBodyBytes, "largest request body in bytes")
	f.Int64Var(&maxUpload, "max-upload", server.DefaultMaxUploadBytes, "largest file or tar upload in bytes (streamed, never held in memory)")
	f.Int64Var(&maxOutput, "max-output", server.DefaultMaxOutputBytes, "bytes of each of stdout and stderr a buffered exec returns: past it the head and tail are kept and the result says truncated")
	f.IntVar(&maxConns, "max-conns", server.DefaultMaxConns, "connections at once on each listener; more wait until one closes")
	f.IntVar(&maxMCPSessions, "max-mcp-sessions", mcpserver.DefaultMaxSessions, "MCP sessions (/mcp) open at once, each with its own box; more get 503")
	f.IntVar(&maxSubs, "max-subscribers", server.DefaultMaxSubscribers, "event streams (/v1/events) open at once; more get 503")
	f.DurationVar(&writeStall, "write-stall", server.DefaultWriteStall, "cut off a client that does not take a write (response, event, exec stream) for this long")
	f.StringVar(&logFormat, "log-format", "text", "access log format: text or json")
	f.IntVar(&policy.MaxBoxes, "max-boxes", 0, "most boxes not stopped at once (0: no limit); more are refused with 403")
	f.IntVar(&policy.MaxSnapshots, "max-snapshots", server.DefaultMaxSnapshots, "most memory snapshots clients may keep (0: no limit); more are refused with 403")
	f.IntVar(&policy.MaxDiskMiB, "max-disk", server.DefaultMaxDiskMiB, "most MiB of disk (disk_size_mib, the writable layer a box can fill) per box (0: no limit)")
	f.IntVar(&policy.MinFreeDiskMiB, "min-free-disk", server.DefaultMinFreeDiskMiB, "MiB that creates, starts, forks, snapshots and pauses to disk must leave free on the airlock home's filesystem, counting disks as if full (0: no check)")
	f.IntVar(&policy.MaxVolumes, "max-volumes", server.DefaultMaxVolumes, "most named volumes in the home when a create makes new ones (0: no limit)")
	f.IntVar(&policy.MaxVolumesMiB, "max-volume-space", server.DefaultMaxVolumesMiB, "most MiB of named volumes in the home when a create makes new ones (0: no limit)")
	f.IntVar(&policy.MaxCPUs, "max-cpus", 0, "most vCPUs per box (0: no limit)")
	f.IntVar(&policy.MaxMemoryMiB, "max-memory", 0, "most MiB of RAM per box (0: no limit)")
	f.StringArrayVar(&policy.AllowVolumeDirs, "allow-volume", nil, "let clients attach host directories under DIR as volumes (symlinks resolved); repeatable; none by default")
	f.BoolVar(&allowNamedVolumes, "allow-named-volumes", true, "let clients create and attach named volumes")
	f.IntSliceVar(&policy.AllowHostPorts, "allow-host-port", nil, "let a box's network open this host port (allow_host_ports); repeatable; none by default")
	f.BoolVar(&policy.AllowPrivateNet, "allow-private-net", false, "let allow_net list IPs/CIDRs in private ranges (RFC 1918, CGNAT, ULA), and image pulls reach registries there and on loopback")
	f.BoolVar(&policy.AllowImportState, "allow-import-state", false, "let POST /v1/boxes/import take archives with checkpoints (their device state, made by the client, is loaded into the box's confined QEMU at a rollback)")
	f.StringArrayVar(&publish, "allow-publish", nil, "let clients publish box ports on these host ports: [ADDR:]LOW[-HIGH][/tcp|udp], ADDR 127.0.0.1 by default (another address must be named; 0.0.0.0 or :: covers every address of its family); a range from 0 also grants host_port 0 (a free port); repeatable; none by default")
	f.StringVar(&auditPath, "audit-log", "", `exec audit log, JSON lines (default audit.log in the home; "off": none)`)
	f.Int64Var(&auditMax, "audit-max", server.DefaultAuditMaxBytes, "audit log size at which it is rotated to .1 (at most twice this is kept)")
	f.StringArrayVar(&pools, "pool", nil, "keep boxes of IMAGE ready, with Python started: IMAGE[=N] (N default 2; repeatable)")
	f.StringVar(&e2bAddr, "e2b", "", "also serve E2B's API on this TCP address (e.g. 127.0.0.1:3000), for E2B's own SDKs: E2B_API_URL and E2B_SANDBOX_URL=http://ADDR, E2B_API_KEY=e2b_TOKEN (docs/e2b.md); the token must be hex")
	f.StringArrayVar(&e2bTemplates, "e2b-template", nil, "map an E2B template to an image: NAME=IMAGE (repeatable; base and code-interpreter-v1 are mapped by default)")
	f.StringVar(&tenantsFile, "tenants", "", "tenants file (airlock tenant add): more tokens, each a tenant with its own boxes, quotas and grants; reloaded on change and on SIGHUP")
	f.BoolVar(&printSpec, "print-openapi", false, "print the OpenAPI document and exit (regenerates api/openapi.json)")
	return cmd
}

// listenUnixReplace is how long listenReplacing waits for a replaced
// server to let go of the socket.
const listenUnixReplace = 15 * time.Second

// listenReplacing listens on socket. A server that an SDK started there
// on demand (--idle-exit) gives way to one the user starts without
// --idle-exit: it is told to stop (SIGTERM: it drains its requests, its
// boxes keep running) and the socket is taken once it has let go.
func listenReplacing(socket string, idleExit time.Duration, log *slog.Logger) (net.Listener, error) {
	ul, err := server.ListenUnix(socket)
	var inUse *server.SocketInUseError
	if !errors.As(err, &inUse) || inUse.IdleExit <= 0 || inUse.PID <= 0 || idleExit > 0 {
		return ul, err
	}
	log.Info("replacing the on-demand server on the socket", "pid", inUse.PID, "idle_exit", inUse.IdleExit)
	if err := syscall.Kill(inUse.PID, syscall.SIGTERM); err != nil {
		return nil, fmt.Errorf("%w (telling it to stop: %v)", inUse, err)
	}
	deadline := time.Now().Add(listenUnixReplace)
	for {
		ul, err = server.ListenUnix(socket)
		if !errors.As(err, &inUse) || time.Now().After(deadline) {
			return ul, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// watchTenants opens the tenants file and keeps it loaded until ctx ends
// or stop is called: reloaded when it changes and on SIGHUP; a file that
// fails to load leaves the tenants loaded before (logged).
func watchTenants(ctx context.Context, file string, log *slog.Logger) (set *tenant.Set, stop func(), err error) {
	set, err = tenant.Open(file)
	if err != nil {
		return nil, nil, err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reload := make(chan struct{}, 1)
	go func() {
		for range hup {
			select {
			case reload <- struct{}{}:
			default:
			}
		}
	}()
	go set.Watch(ctx, reload, func(err error) {
		if err != nil {
			log.Error("tenants file not reloaded: the tenants loaded before stay", "file", file, "err", err)
			return
		}
		log.Info("tenants reloaded", "file", file, "tenants", len(set.File().Tenants))
	})
	log.Info("tenants", "file", file, "tenants", len(set.File().Tenants))
	return set, func() { signal.Stop(hup) }, nil
}
