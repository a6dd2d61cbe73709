// Package server is airlock's HTTP API (airlock serve): a thin shell over
// the public library (airlock.Runtime, airlock.Box, codebox) described by an
// OpenAPI 3.1 document generated from the Go types of this package (huma).
// Everything lives under /v1; /openapi.json and /metrics sit beside it.
//
// A Server is an http.Handler factory: Handler(true) requires a bearer
// token (TCP listeners), Handler(false) does not (the owner-only unix
// socket). Serve runs listeners until its context ends and then shuts down
// gracefully: in-flight requests drain, boxes keep running.
//
// The wire protocol of the streaming exec WebSocket is described in
// docs/server.md.
package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"golang.org/x/net/netutil"
	"golang.org/x/sys/unix"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/defaults"
	"github.com/airlock-run/airlock/internal/tenant"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxBodyBytes      = 16 << 20
	DefaultMaxExecsPerClient = 32
	DefaultDrainTimeout      = 30 * time.Second
	// DefaultMaxOutputBytes is Config.MaxOutputBytes's default, the
	// library's own (airlock.DefaultMaxOutput, 16 MiB a stream).
	DefaultMaxOutputBytes = airlock.DefaultMaxOutput
	// DefaultMaxConns is Config.MaxConns's default: connections at once
	// on each listener.
	DefaultMaxConns = 256
	// DefaultMaxSubscribers is Config.MaxSubscribers's default.
	DefaultMaxSubscribers = 64
	// DefaultWriteStall is Config.WriteStall's default.
	DefaultWriteStall = 30 * time.Second
	// SocketName is the unix socket's file name in the airlock home.
	SocketName = "airlock.sock"
	// TokenName is the file in the airlock home holding the generated
	// bearer token for TCP listeners.
	TokenName = "server.token"
)

// Config configures a Server.
type Config struct {
	// Runtime serves the boxes; required except for OpenAPI generation.
	Runtime *airlock.Runtime
	// Token is the bearer token TCP clients must send
	// (Authorization: Bearer TOKEN). Handler(true) refuses every request
	// when it is empty.
	Token string
	// Logger receives the access log and server events (default: discard).
	Logger *slog.Logger
	// MaxBodyBytes bounds request bodies (default 16 MiB); larger ones get
	// 413.
	MaxBodyBytes int64
	// MaxUploadBytes bounds the streamed body of a file or tar upload
	// (PUT /v1/boxes/{id}/files and /archive; default 1 GiB); past it the
	// upload is abandoned (nothing is written) and the client gets 413.
	MaxUploadBytes int64
	// MaxExecsPerClient bounds the execs (buffered, streaming, code runs,
	// context cells, installs) one client runs at once (default 32); one
	// more gets 429. A client is one bearer token, or the unix socket.
	MaxExecsPerClient int
	// MaxOutputBytes bounds, in bytes, each of stdout and stderr that a
	// buffered exec keeps (default DefaultMaxOutputBytes, 16 MiB): past it
	// the head and the tail are kept and the result says truncated, with
	// the bytes dropped. Text fields of code runs, cells and installs are
	// cut, with a note, where their JSON encoding passes twice this.
	MaxOutputBytes int64
	// MaxConns bounds the connections Serve keeps open at once on each
	// listener (default DefaultMaxConns, 256); more wait in the listen
	// queue until one closes. On a TCP listener it counts the connections
	// that made a request with the token; those that have not are
	// bounded apart (MaxUnauthenticatedConns, the oldest closed for a new
	// one) and one refused for its token is closed after the 401, so a
	// peer without the token cannot lock the token's clients out (those
	// already waiting for their first request when the bound is reached
	// may still make it: at most MaxUnauthenticatedConns over). The
	// unix socket has its own count, so TCP clients cannot lock its owner
	// out.
	MaxConns int
	// MaxSubscribers bounds the /v1/events streams open at once (default
	// DefaultMaxSubscribers, 64); one more gets 503.
	MaxSubscribers int
	// WriteStall bounds how long one write to a client may block (default
	// DefaultWriteStall, 30 s): a client that stops reading a response,
	// an event stream or an exec WebSocket is cut off past it, and what
	// it held (an exec slot, buffers) is let go.
	WriteStall time.Duration
	// DrainTimeout bounds how long Serve waits for in-flight requests and
	// exec streams at shutdown (default 30 s); then they are cut.
	DrainTimeout time.Duration
	// IdleExit, when positive, makes Serve return after the server has had
	// no request in flight, no open stream and no running box for that
	// long (for a server started on demand by an SDK).
	IdleExit time.Duration
	// Audit, when set, gets one entry per exec, code run, cell and install.
	Audit *AuditLog
	// Policy limits what clients may ask for.
	Policy Policy
	// Events, when set, is served at /v1/events and fed by the server;
	// pass it (in Observers, with Metrics) as airlock.Options.Observer too.
	Events *Events
	// ReapInterval, when positive, makes the server look for boxes past
	// their ttl, idle_timeout or lease this often, besides the Runtime's
	// own reaper (airlock.Options.ReapInterval, which enforces them
	// whether or not a server runs). Default 0: the Runtime's alone.
	ReapInterval time.Duration
	// MCP, when set, is served at /mcp (MCP's streamable HTTP transport).
	MCP http.Handler
	// Metrics, when set, is served at /metrics and fed by the server.
	Metrics *Metrics
	// Tenants, when set, are more bearer tokens for TCP clients, each a
	// tenant that sees only its own boxes, snapshots and named volumes,
	// within its quotas and grants (airlock serve --tenants; tenants.go).
	// Token and the unix socket stay the admin, who sees every box.
	Tenants *tenant.Set
	// Cluster, when set, serves the boxes instead of Runtime (airlock
	// gateway; cluster.go): Runtime is then nil. Tenants are served as
	// with a Runtime (their boxes, quotas of boxes, vCPUs, memory, disk
	// and execs, audit lines); snapshots and volumes are not served.
	Cluster Cluster
}

// Server serves the airlock HTTP API.
type Server struct {
	cfg Config
	rt  *airlock.Runtime
	log *slog.Logger
	api huma.API
	mux *http.ServeMux

	inflight atomic.Int64 // requests and streams in progress
	subs     atomic.Int64 // /v1/events streams open
	lastBusy atomic.Int64 // unix nanos of the last request end
	streams  sync.WaitGroup

	events   *Events
	shutdown chan struct{} // closed when Serve starts shutting down

	volumeDirs []string // Policy.AllowVolumeDirs, resolved
	caps       capState // named volumes and snapshots being made (policy.go)
	tenants    tenantState

	mu        sync.Mutex
	codeboxes map[string]*codeState // by box id
	execs     map[string]*execEntry // running execs by exec id
	slots     map[string]chan struct{}
	wsConns   map[*wsConn]struct{}
}

// New returns a Server for cfg.
func New(cfg Config) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if cfg.MaxExecsPerClient <= 0 {
		cfg.MaxExecsPerClient = DefaultMaxExecsPerClient
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxSubscribers <= 0 {
		cfg.MaxSubscribers = DefaultMaxSubscribers
	}
	if cfg.WriteStall <= 0 {
		cfg.WriteStall = DefaultWriteStall
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Policy = cfg.Policy.withDefaults()
	s := &Server{cfg: cfg, rt: cfg.Runtime, log: cfg.Logger, mux: http.NewServeMux(),
		events: cfg.Events, shutdown: make(chan struct{}),
		codeboxes: map[string]*codeState{}, execs: map[string]*execEntry{}, slots: map[string]chan struct{}{}, wsConns: map[*wsConn]struct{}{}}
	s.lastBusy.Store(time.Now().UnixNano())
	if s.rt != nil {
		s.rt.OnReap(s.reaped)
	}
	if dirs, err := ResolveVolumeDirs(cfg.Policy.AllowVolumeDirs); err == nil {
		s.volumeDirs = dirs
	} else {
		// Grant only what resolves; the CLI checks the flags before.
		s.log.Warn("ignoring --allow-volume", "err", err)
		for _, d := range cfg.Policy.AllowVolumeDirs {
			if r, err := ResolveVolumeDirs([]string{d}); err == nil {
				s.volumeDirs = append(s.volumeDirs, r...)
			}
		}
	}
	hc := huma.DefaultConfig("airlock", APIVersion)
	hc.Info.Description = "Run untrusted code in QEMU microVMs (boxes). Errors are RFC 9457 problem details with a stable `code`."
	hc.DocsPath = ""
	hc.SchemasPath = ""
	hc.CreateHooks = nil // no $schema links in bodies
	hc.Components.SecuritySchemes = map[string]*huma.SecurityScheme{
		"bearer": {Type: "http", Scheme: "bearer", Description: "Required on TCP listeners; the unix socket needs none."},
	}
	// huma's own per-operation body limit (1 MiB by default) is the
	// server's.
	hc.OnAddOperation = append(hc.OnAddOperation, func(_ *huma.OpenAPI, op *huma.Operation) { op.MaxBodyBytes = cfg.MaxBodyBytes })
	hc.OnAddOperation = append(hc.OnAddOperation, documentBadRequest)
	s.api = humago.New(s.mux, hc)
	s.registerBoxes()
	s.registerSnapshots()
	s.registerCheckpoints()
	s.registerExec()
	s.registerCode()
	s.registerMisc()
	s.registerPools()
	s.registerLease()
	s.registerSecrets()
	s.registerExecs()
	s.registerEvents()
	s.registerFiles()
	s.registerStats()
	s.registerExport()
	s.mux.HandleFunc("GET /v1/boxes/{id}/exec/ws", s.handleExecWS)
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", adminOnly(cfg.Metrics.Handler()))
	}
	if cfg.MCP != nil {
		s.mux.Handle("/mcp", s.mcpTenants(cfg.MCP))
	}
	return s
}

// APIVersion is the version of the API described by the OpenAPI document.
const APIVersion = "1.0.0"

// OpenAPI returns the OpenAPI 3.1 document of the API, as served at
// /openapi.json and committed as api/openapi.json.
func OpenAPI() ([]byte, error) {
	s := New(Config{})
	b, err := s.api.OpenAPI().MarshalJSON()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// Version returns the airlock build's version (module version, or the VCS
// revision for a development build).
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && (v == "" || v == "(devel)") {
			if len(s.Value) > 12 {
				return "devel-" + s.Value[:12]
			}
			return "devel-" + s.Value
		}
	}
	if v == "" {
		v = "(devel)"
	}
	return v
}

// DefaultSocket returns $AIRLOCK_SOCKET, else SocketName in home.
func DefaultSocket(home string) string {
	if s := defaults.Socket(); s != "" {
		return s
	}
	return filepath.Join(home, SocketName)
}

// LoadToken returns the bearer token for TCP listeners: explicit if not
// empty, else $AIRLOCK_TOKEN, else the token stored in home/server.token,
// which is generated (32 random bytes, hex, mode 0600) if absent. The
// returned path is where a generated or stored token lives ("" otherwise).
func LoadToken(home, explicit string) (token, path string, err error) {
	if explicit != "" {
		return explicit, "", nil
	}
	if t := defaults.Token(); t != "" {
		return t, "", nil
	}
	p := filepath.Join(home, TokenName)
	if b, err := os.ReadFile(p); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, p, nil
		}
	}
	buf := make([]byte, 32)
	rand.Read(buf)
	t := hex.EncodeToString(buf)
	if err := os.MkdirAll(home, 0o700); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(p, []byte(t+"\n"), 0o600); err != nil {
		return "", "", fmt.Errorf("store server token: %w", err)
	}
	return t, p, nil
}

// ListenUnix listens on a unix socket at path, owner-only (0600) from
// the moment the path exists: the socket is bound in a new directory only
// the owner can enter (next to path, so on the same filesystem), made
// 0600 there and then linked to path. So no other local user can connect
// in between, whatever the process umask, and the umask (process-wide)
// is left alone. A stale socket file (nothing accepting on it) is
// replaced; a live one is an error, since another server is using it.
// Closing the listener removes path.
func ListenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			e := &SocketInUseError{Path: path}
			e.PID, e.IdleExit = peerServer(c.(*net.UnixConn))
			c.Close()
			return nil, e
		}
		os.Remove(path)
	}
	priv, err := os.MkdirTemp(dir, ".sock-") // 0700
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(priv)
	tmp := filepath.Join(priv, "s")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ul.SetUnlinkOnClose(false) // the path to unlink is path, not tmp
	if err := os.Chmod(tmp, 0o600); err != nil {
		ul.Close()
		return nil, err
	}
	// link(2), unlike rename(2), fails if path exists (another server
	// started meanwhile) instead of replacing it.
	if err := os.Link(tmp, path); err != nil {
		ul.Close()
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("another airlock server started on %s meanwhile (stop it, or use --socket)", path)
		}
		return nil, err
	}
	if listenUnixHook != nil {
		listenUnixHook(path)
	}
	os.Remove(tmp) // path is the socket's one name from now (its ctime set)
	fi, err := os.Lstat(path)
	if err != nil {
		ul.Close()
		return nil, err
	}
	return &unixListener{UnixListener: ul, addr: &net.UnixAddr{Name: path, Net: "unix"}, file: fi}, nil
}

// SocketInUseError is ListenUnix's error when a server answers on the
// socket already.
type SocketInUseError struct {
	Path string
	// PID is the process listening (0 when unknown).
	PID int
	// IdleExit is that server's --idle-exit (0: it runs until stopped,
	// or unknown): one started on demand, by an SDK, says so.
	IdleExit time.Duration
}

func (e *SocketInUseError) Error() string {
	who := "another airlock server"
	if e.PID > 0 {
		who += fmt.Sprintf(" (pid %d)", e.PID)
	}
	if e.IdleExit > 0 {
		who += fmt.Sprintf(", started on demand (an SDK's, --idle-exit %s),", e.IdleExit)
	}
	stop := "stop it"
	if e.PID > 0 {
		stop = fmt.Sprintf("stop it (kill %d; its boxes keep running)", e.PID)
	}
	return fmt.Sprintf("%s is listening on %s: %s, or use --socket", who, e.Path, stop)
}

// peerServer asks the server on c for its pid (SO_PEERCRED) and its idle
// exit (GET /v1/health), within 2 s; zeros for what it cannot learn.
func peerServer(c *net.UnixConn) (pid int, idleExit time.Duration) {
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
				pid = int(cred.Pid)
			}
		})
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("GET /v1/health HTTP/1.1\r\nHost: airlock\r\nConnection: close\r\n\r\n")); err != nil {
		return pid, 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(io.LimitReader(c, 64<<10)), nil)
	if err != nil {
		return pid, 0
	}
	defer resp.Body.Close()
	var h Health
	if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&h) == nil && h.IdleExit > 0 {
		idleExit = time.Duration(h.IdleExit * float64(time.Second))
	}
	return pid, idleExit
}

// listenUnixHook, when set (by tests), is called by ListenUnix as soon as
// the socket exists at its path.
var listenUnixHook func(path string)

// unixListener is a unix socket listener bound elsewhere and linked to
// addr's path: it shows that path and removes it when closed.
type unixListener struct {
	*net.UnixListener
	addr      *net.UnixAddr
	file      os.FileInfo // the socket file linked at addr's path (sameSocket)
	closeOnce sync.Once
}

func (l *unixListener) Addr() net.Addr { return l.addr }

// sameSocket reports whether a and b are the same socket file: the same
// inode and the same change time, since a replacing server's new socket
// may get the inode number the removed one had.
func sameSocket(a, b os.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && os.SameFile(a, b) && sa.Ctim == sb.Ctim
}

// Close closes the listener and removes its path, unless the path is
// another socket by now: a server that replaced this one (listenReplacing
// in the CLI) may have bound it once this one stopped accepting.
func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.closeOnce.Do(func() {
		if cur, err := os.Lstat(l.addr.Name); err == nil && sameSocket(cur, l.file) {
			os.Remove(l.addr.Name)
		}
	})
	return err
}

type ctxKey int

const (
	clientKey ctxKey = iota
	reqInfoKey
)

// reqInfo carries access-log fields filled in by handlers.
type reqInfo struct {
	id     string
	tenant string // the tenant auth found ("" until then)
}

// Handler returns the API handler. With requireToken every request needs
// Authorization: Bearer <Config.Token>; without a token or with a wrong one
// it gets 401 and nothing else.
func (s *Server) Handler(requireToken bool) http.Handler {
	client := "unix"
	if requireToken {
		sum := sha256.Sum256([]byte(s.cfg.Token))
		client = "token:" + hex.EncodeToString(sum[:6])
	}
	h := unrouted(s.mux)
	if s.cfg.Cluster != nil {
		h = s.cluster(h)
	}
	h = s.limits(h)
	if requireToken {
		h = s.auth(h)
	}
	return s.withClient(client, s.accessLog(h))
}

func (s *Server) withClient(client string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientKey, client)))
	})
}

// clientOf is the client whose exec slots a request takes: its tenant
// ("tenant:NAME"), else the listener's (the server token's, or "unix").
func clientOf(ctx context.Context) string {
	if t := tenantOf(ctx); t != nil {
		return "tenant:" + t.Name
	}
	c, _ := ctx.Value(clientKey).(string)
	return c
}

func (s *Server) auth(next http.Handler) http.Handler {
	want := []byte("Bearer " + s.cfg.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		admin := s.cfg.Token != "" && subtle.ConstantTimeCompare(got, want) == 1
		var t *tenant.Tenant
		if !admin {
			if tok, ok := strings.CutPrefix(string(got), "Bearer "); ok {
				t, _ = s.cfg.Tenants.Lookup(tok)
			}
		}
		if !admin && t == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
			// A peer without the token keeps no connection open.
			w.Header().Set("Connection", "close")
			writeProblem(w, &Problem{Status: http.StatusUnauthorized, Title: "Unauthorized", Code: CodeUnauthorized,
				Detail: "missing or wrong bearer token: send Authorization: Bearer $AIRLOCK_TOKEN (airlock serve prints where the token is stored)"})
			return
		}
		markAuthenticated(r.Context())
		if t != nil {
			if info, ok := r.Context().Value(reqInfoKey).(*reqInfo); ok {
				info.tenant = t.Name
			}
			r = r.WithContext(context.WithValue(r.Context(), tenantCtxKey{}, t))
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) limits(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit, flag := s.cfg.MaxBodyBytes, "--max-body"
		if isUpload(r) {
			limit, flag = s.cfg.MaxUploadBytes, "--max-upload"
		}
		if r.ContentLength > limit {
			writeProblem(w, &Problem{Status: http.StatusRequestEntityTooLarge, Title: "Request Entity Too Large", Code: CodeBodyTooLarge,
				Detail: fmt.Sprintf("request body of %d bytes is over the server's limit of %d (airlock serve %s)", r.ContentLength, limit, flag)})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		if r.Method == http.MethodGet && r.URL.Path == "/v1/events" {
			if n := s.subs.Add(1); n > int64(s.cfg.MaxSubscribers) {
				s.subs.Add(-1)
				w.Header().Set("Retry-After", "10")
				writeProblem(w, &Problem{Status: http.StatusServiceUnavailable, Title: "Service Unavailable", Code: CodeTooManySubscribers,
					Detail: fmt.Sprintf("%d event streams are open, the server's limit (airlock serve --max-subscribers): close one, or retry later", s.cfg.MaxSubscribers)})
				return
			}
			defer s.subs.Add(-1)
		}
		next.ServeHTTP(w, r)
	})
}

var boxPath = regexp.MustCompile(`^/v1/boxes/([^/]+)`)

// statusWriter records the status for the access log, and bounds each
// write to the client (writeStall): a client that stops reading a
// response is cut off rather than holding the handler, and what it
// buffered, forever. Unwrap lets websocket.Accept find the Hijacker.
type statusWriter struct {
	http.ResponseWriter
	rc     *http.ResponseController
	stall  time.Duration
	status int
	bytes  int64
}

// writeChunk is the most written under one deadline, so that a large
// response to a slow but live client is not cut.
const writeChunk = 1 << 20

// deadline gives the next write writeStall to complete. Errors (a
// recorder, a hijacked connection) leave writes unbounded.
func (w *statusWriter) deadline() {
	if w.rc != nil {
		w.rc.SetWriteDeadline(time.Now().Add(w.stall))
	}
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	total := 0
	for len(b) > 0 {
		n := min(len(b), writeChunk)
		w.deadline()
		n, err := w.ResponseWriter.Write(b[:n])
		total += n
		w.bytes += int64(n)
		if err != nil {
			return total, err
		}
		b = b[n:]
	}
	return total, nil
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	w.deadline()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func newRequestID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		s.inflight.Add(1)
		defer func() {
			s.lastBusy.Store(time.Now().UnixNano())
			s.inflight.Add(-1)
		}()
		id := r.Header.Get("X-Request-Id")
		if id == "" || len(id) > 64 {
			id = newRequestID()
		}
		w.Header().Set("X-Request-Id", id)
		sw := &statusWriter{ResponseWriter: w, rc: http.NewResponseController(w), stall: s.cfg.WriteStall}
		// No deadline left from an earlier request on this connection
		// (http.Server sets none itself without a WriteTimeout); each
		// write sets its own, and the last one covers the final flush.
		sw.rc.SetWriteDeadline(time.Time{})
		info := &reqInfo{id: id}
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), reqInfoKey, info)))
		sw.deadline()
		client, tenantName := clientOf(r.Context()), AdminTenant
		if info.tenant != "" {
			client, tenantName = "tenant:"+info.tenant, info.tenant
		}
		if sw.status == http.StatusUnauthorized {
			// The listener's client is the token holder: a request
			// refused for its token is not theirs.
			client, tenantName = "unauthenticated", ""
		}
		attrs := []any{"request_id", id, "method", r.Method, "path", r.URL.Path, "status", sw.status,
			"duration_ms", float64(time.Since(t0).Microseconds()) / 1000, "client", client, "tenant", tenantName}
		if m := boxPath.FindStringSubmatch(r.URL.Path); m != nil {
			attrs = append(attrs, "box", m[1])
		}
		s.log.Info("request", attrs...)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.request(r.Method, s.routeOf(r), sw.status, time.Since(t0))
		}
	})
}

// routeOf returns the registered pattern r matches, for metric labels
// (bounded cardinality: never the raw path).
func (s *Server) routeOf(r *http.Request) string {
	if _, pat := s.mux.Handler(r); pat != "" {
		return pat
	}
	return "other"
}

// acquire takes one of the client's exec slots; release returns it. A
// client with none free gets 429.
func (s *Server) acquire(ctx context.Context) (release func(), err error) {
	client, limit := clientOf(ctx), s.cfg.MaxExecsPerClient
	t := tenantOf(ctx)
	if t != nil {
		q := t.Quota
		if cur, ok := s.cfg.Tenants.Get(t.Name); ok {
			q = cur.Quota // the file as reloaded
		}
		if q.Execs > 0 {
			limit = q.Execs
		}
		// A quota changed by a reload takes a new set of slots.
		client = fmt.Sprintf("%s:%d", client, limit)
	}
	s.mu.Lock()
	ch, ok := s.slots[client]
	if !ok {
		ch = make(chan struct{}, limit)
		s.slots[client] = ch
	}
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	default:
		if t != nil {
			return nil, &Problem{Status: http.StatusTooManyRequests, Title: "Too Many Requests", Code: CodeTooManyExecs,
				Detail: fmt.Sprintf("tenant %s already runs %d execs, its limit (airlock tenant add --max-execs, else airlock serve --max-execs); wait for one to finish", t.Name, limit)}
		}
		return nil, &Problem{Status: http.StatusTooManyRequests, Title: "Too Many Requests", Code: CodeTooManyExecs,
			Detail: fmt.Sprintf("this client already runs %d execs, the server's limit (airlock serve --max-execs); wait for one to finish", s.cfg.MaxExecsPerClient)}
	}
}

// Serve serves s on the listeners (tcp ones need the token, unix ones do
// not) until ctx ends or, with Config.IdleExit, the server has been idle
// that long. It then stops accepting, waits up to DrainTimeout for
// in-flight requests and exec streams, and returns. Boxes keep running.
func (s *Server) Serve(ctx context.Context, listeners ...net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if ce, ok := s.cfg.Cluster.(ClusterEvents); ok && s.events != nil {
		go ce.RunEvents(ctx, func(ev Event, labels map[string]string) {
			if ev.BoxID != "" {
				s.noteOwner(ev.BoxID, labels)
			}
			s.events.publish(ev)
		})
	}
	var servers []*http.Server
	errc := make(chan error, len(listeners))
	for _, l := range listeners {
		_, isUnix := l.Addr().(*net.UnixAddr)
		if isUnix {
			l = netutil.LimitListener(l, s.cfg.MaxConns)
		} else {
			// Only connections that made a request with the token count
			// against MaxConns; the others have a bound of their own.
			l = newAuthLimitListener(l, s.cfg.MaxConns, MaxUnauthenticatedConns)
		}
		hs := &http.Server{
			ConnContext:       withConn,
			Handler:           s.Handler(!isUnix),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
			BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		}
		servers = append(servers, hs)
		go func() {
			if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	if s.cfg.IdleExit > 0 {
		s.lastBusy.Store(time.Now().UnixNano()) // idle counts from serving
		go s.watchIdle(ctx, cancel)
	}
	go s.reap(ctx)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	s.log.Info("shutting down: draining requests; boxes keep running")
	close(s.shutdown)
	dctx, dcancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer dcancel()
	for _, hs := range servers {
		hs.Shutdown(dctx)
	}
	done := make(chan struct{})
	go func() { s.streams.Wait(); close(done) }()
	select {
	case <-done:
	case <-dctx.Done():
		s.closeStreams()
	}
	// Past the drain, requests still in flight are cut: Shutdown alone
	// leaves their connections served (and kept alive) after it returns.
	for _, hs := range servers {
		hs.Close()
	}
	s.closeCodeboxes()
	return err
}

func (s *Server) watchIdle(ctx context.Context, stop func()) {
	t := time.NewTicker(min(s.cfg.IdleExit/4+time.Millisecond, 5*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.inflight.Load() > 0 || time.Since(time.Unix(0, s.lastBusy.Load())) < s.cfg.IdleExit {
			continue
		}
		boxes, err := s.rt.List(ctx)
		if err != nil {
			continue
		}
		running := 0
		for _, b := range boxes {
			if b.State == airlock.BoxRunning {
				running++
			}
		}
		if running == 0 {
			s.log.Info("idle: no request and no running box", "for", s.cfg.IdleExit)
			stop()
			return
		}
	}
}
