// Package e2b serves E2B's API (airlock serve --e2b ADDR), so that
// programs written for E2B's own SDKs (the Python packages e2b and
// e2b-code-interpreter, and their Node twins) run unchanged on airlock
// boxes: they set E2B_API_URL and E2B_SANDBOX_URL to this listener and
// E2B_API_KEY to "e2b_" + the server's token.
//
// One listener answers three APIs, told apart by the headers E2B's SDKs
// send when E2B_SANDBOX_URL is set:
//
//   - the control plane (no E2b-Sandbox-Id header; E2B's OpenAPI document,
//     spec/openapi.yml in e2b-dev/infra): sandboxes are boxes, templates
//     are images, metadata are box labels, a sandbox's timeout is the box's
//     TTL. Authenticated by X-API-Key.
//   - envd, the daemon in an E2B sandbox (E2b-Sandbox-Port 49983): the
//     Connect services process.Process and filesystem.Filesystem
//     (spec/*.proto here, copies of E2B's) and HTTP /files and /health,
//     answered on the host through the box's exec and file calls.
//   - the code interpreter (E2b-Sandbox-Port 49999; e2b-dev/code-interpreter
//     template/server): POST /execute streams NDJSON, /contexts, on
//     codebox contexts.
//
// Data-plane requests are authenticated by the sandbox's access token
// (X-Access-Token, or E2B-Traffic-Access-Token), which the create and
// connect responses hand out: an HMAC of the sandbox id under the server's
// token, so it needs no storage and dies with the token.
//
// The package goes through airlock's public API only, and through the
// REST server's policy: Config.CheckBox and Config.AcquireExec are the
// server's (internal/server: Server.CheckBox, Server.AcquireExec).
// docs/e2b.md lists what of the SDKs works.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/codebox"
)

// Ports of an E2B sandbox that this package answers (E2b-Sandbox-Port).
const (
	// EnvdPort is envd's port: the process and filesystem services.
	EnvdPort = 49983
	// CodeInterpreterPort is the code interpreter server's port.
	CodeInterpreterPort = 49999
)

// EnvdVersion is the envd version the sandboxes report (envdVersion). The
// SDK picks its wire forms by it: from 0.4.0 it leaves the user to envd
// (here: "user"), from 0.5.7 it may upload files as
// application/octet-stream (both forms are answered).
const EnvdVersion = "0.5.7"

// Defaults of Config fields left zero.
const (
	// DefaultTimeout is a sandbox's timeout (its box's TTL) when a create
	// names none: E2B's 300 s.
	DefaultTimeout = 300 * time.Second
	// MaxTimeout is the longest timeout a create or set_timeout may ask:
	// E2B's 24 hours.
	MaxTimeout = 24 * time.Hour
	// DefaultMaxBodyBytes bounds a control-plane or code request body.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxUploadBytes bounds a /files upload.
	DefaultMaxUploadBytes = 1 << 30
)

// labelPrefix marks the labels this package keeps for itself; they are not
// shown as metadata, and metadata may not use the prefix.
const labelPrefix = "airlock.e2b/"

// templateLabel holds the template a sandbox was created from; boxes
// without it are not E2B sandboxes and are not listed.
const templateLabel = labelPrefix + "template"

// tenantLabel is the label that names a box's tenant (airlock serve
// --tenants; server.TenantLabel, which a test checks it equals): no
// sandbox's metadata may set it.
const tenantLabel = "airlock.tenant"

// DefaultTemplates maps E2B's template names to images: "base" to the
// default image, the code interpreter's templates to the Python data image
// (numpy, pandas, matplotlib). Any other template name is taken as an image
// reference.
var DefaultTemplates = map[string]string{
	"base":                  airlock.DefaultImage,
	"code-interpreter-v1":   "airlock/python-data",
	"code-interpreter":      "airlock/python-data",
	"code-interpreter-beta": "airlock/python-data",
}

// Config configures a Server.
type Config struct {
	// Runtime serves the boxes; required.
	Runtime *airlock.Runtime
	// Token is the server's token: the E2B API key is "e2b_" + Token, so
	// it must be lower-case hex (CheckToken); required.
	Token string
	// CheckBox applies the server's policy to a box about to be made
	// (server.Server.CheckBox); nil: none.
	CheckBox func(context.Context, *airlock.BoxOptions) (release func(), err error)
	// CheckStart and CheckSuspend, when set, apply the server's policy to
	// a connect that starts or resumes a box and to a pause to disk
	// (server.Server.CheckStart, CheckSuspend).
	CheckStart, CheckSuspend func(context.Context, *airlock.Box) error
	// CheckSnapshot and CheckFork, when set, apply the server's policy to
	// a create_snapshot and to a fork into n boxes
	// (server.Server.CheckSnapshot, CheckFork).
	CheckSnapshot func(context.Context, *airlock.Box) (release func(), err error)
	CheckFork     func(ctx context.Context, b *airlock.Box, n int) error
	// CheckNetwork, when set, applies the server's network grants to the
	// destinations an update_network opens (server.Server.CheckNetwork).
	CheckNetwork func(ctx context.Context, allow []string) error
	// PullContext, when set, returns the context a create runs under, so
	// that the pull of an absent image obeys the server's network grants
	// (server.Server.PullContext).
	PullContext func(context.Context) context.Context
	// AcquireExec takes an exec slot for a process or a code run
	// (server.Server.AcquireExec); nil: no limit.
	AcquireExec func(context.Context) (release func(), err error)
	// Audit, when set, gets one record per process started through envd
	// (when it ends) and per code run (airlock serve's audit log).
	Audit func(AuditRecord)
	// Templates maps template names to images, over DefaultTemplates.
	Templates map[string]string
	// Logger gets errors the client does not see (default: discard).
	Logger *slog.Logger
	// MaxBodyBytes bounds control-plane, RPC and code request bodies
	// (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// MaxUploadBytes bounds a /files upload (default
	// DefaultMaxUploadBytes).
	MaxUploadBytes int64
	// UserSetup, when set, replaces the making and looking up of a user in
	// a box (for tests on the fake driver, whose boxes share the host's
	// files): it returns the user's uid, gid and home.
	UserSetup func(ctx context.Context, b *airlock.Box, name string) (uid, gid int, home string, err error)
}

// AuditRecord is one process or code run, for the server's audit log.
type AuditRecord struct {
	Kind     string // "exec_stream" (a process) or "cell" (a code run)
	BoxID    string
	Cmd      []string // the process's command and arguments
	Code     string   // the cell's code
	ExitCode *int     // the process's exit status (nil: none)
	TimedOut bool
	Error    string
	Duration time.Duration
}

// audit hands r to Config.Audit.
func (s *Server) audit(r AuditRecord) {
	if s.cfg.Audit != nil {
		s.cfg.Audit(r)
	}
}

// hexToken is what CheckToken accepts: E2B's SDK sends keys of this form.
var hexToken = regexp.MustCompile(`^[0-9a-f]{16,}$`)

// CheckToken says whether token can make an E2B API key ("e2b_" + lower-
// case hex, at least 16 digits): airlock serve refuses --e2b otherwise.
func CheckToken(token string) error {
	if !hexToken.MatchString(token) {
		return errors.New("the E2B API key is e2b_ + the server's token, which must then be lower-case hex of at least 16 digits (as the generated token is): use --token with such a value, or leave it to airlock")
	}
	return nil
}

// Server answers the E2B API.
type Server struct {
	cfg       Config
	rt        *airlock.Runtime
	log       *slog.Logger
	key       []byte // "e2b_" + token
	templates map[string]string

	mu    sync.Mutex
	boxes map[string]*sandbox // by box id: what the data plane keeps of a sandbox
}

// New returns a Server for cfg; CheckToken must accept cfg.Token.
func New(cfg Config) (*Server, error) {
	if cfg.Runtime == nil {
		return nil, errors.New("e2b: no runtime")
	}
	if err := CheckToken(cfg.Token); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	t := map[string]string{}
	for k, v := range DefaultTemplates {
		t[k] = v
	}
	for k, v := range cfg.Templates {
		t[k] = v
	}
	return &Server{cfg: cfg, rt: cfg.Runtime, log: cfg.Logger, key: []byte("e2b_" + cfg.Token), templates: t,
		boxes: map[string]*sandbox{}}, nil
}

// Close ends what the server keeps of its sandboxes (the processes it
// follows are killed, code contexts closed); the boxes keep running.
func (s *Server) Close() error {
	s.mu.Lock()
	boxes := s.boxes
	s.boxes = map[string]*sandbox{}
	s.mu.Unlock()
	for _, sb := range boxes {
		sb.close()
	}
	return nil
}

// Handler returns the handler of the listener: the control plane, or the
// data plane of the sandbox named by E2b-Sandbox-Id.
func (s *Server) Handler() http.Handler {
	control := s.controlMux()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("E2b-Sandbox-Id")
		if id == "" {
			// get_host's form: PORT-ID.DOMAIN in the Host header.
			if hid, port, ok := hostRoute(r.Host); ok {
				r.Header.Set("E2b-Sandbox-Port", port)
				s.dataPlane(w, r, hid)
				return
			}
		}
		if id == "" && r.Header.Get("X-Access-Token") == "" && r.URL.Query().Has("signature") {
			// A signed URL of download_url or upload_url.
			if op, ok := signedFileRequest(r); ok {
				s.signedFiles(w, r, op)
				return
			}
		}
		if id == "" {
			if !s.apiKeyOK(r) {
				writeError(w, http.StatusUnauthorized, "missing or wrong API key: set E2B_API_KEY to e2b_ followed by the airlock server's token (airlock serve prints where it is stored)")
				return
			}
			control.ServeHTTP(w, r)
			return
		}
		s.dataPlane(w, r, id)
	})
}

// apiKeyOK checks the control plane's X-API-Key (or a bearer token of the
// same value, E2B's access-token form).
func (s *Server) apiKeyOK(r *http.Request) bool {
	got := r.Header.Get("X-API-Key")
	if got == "" {
		got = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	return subtle.ConstantTimeCompare([]byte(got), s.key) == 1
}

// accessToken is sandbox id's data-plane token.
func (s *Server) accessToken(id string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("envd-access:" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// dataOK checks a data-plane request's token for sandbox id.
func (s *Server) dataOK(r *http.Request, id string) bool {
	want := []byte(s.accessToken(id))
	for _, h := range []string{"X-Access-Token", "E2B-Traffic-Access-Token"} {
		if got := r.Header.Get(h); got != "" && subtle.ConstantTimeCompare([]byte(got), want) == 1 {
			return true
		}
	}
	return s.apiKeyOK(r)
}

// dataPlane routes a request for sandbox id by its port.
func (s *Server) dataPlane(w http.ResponseWriter, r *http.Request, id string) {
	if !s.dataOK(r, id) {
		op, signable := signedFileRequest(r)
		if !signable || r.Header.Get("X-Access-Token") != "" || !r.URL.Query().Has("signature") {
			writeError(w, http.StatusUnauthorized, "missing or wrong sandbox access token (X-Access-Token): connect to the sandbox with the SDK (Sandbox.connect) to get it")
			return
		}
		// envd's signed URLs: the signature stands for the token, for
		// the path, user and operation it was made for.
		if err := s.checkSignature(r, id, op); err != nil {
			writeError(w, statusOfSigned(err), err.Error())
			return
		}
		r.Header.Del("Authorization") // the user is the signed one
	}
	sb, err := s.sandbox(r.Context(), id)
	if err != nil {
		writeBoxError(w, err)
		return
	}
	switch port := r.Header.Get("E2b-Sandbox-Port"); port {
	case fmt.Sprint(EnvdPort), "":
		sb.envd.ServeHTTP(w, r)
	case fmt.Sprint(CodeInterpreterPort):
		sb.code.ServeHTTP(w, r)
	default:
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("E2b-Sandbox-Port %q: want a port number", port))
			return
		}
		h, err := sb.proxy(n)
		if err != nil {
			writeBoxError(w, err)
			return
		}
		h.ServeHTTP(w, r)
	}
}

// apiError is the body of E2B's errors (its OpenAPI Error).
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// statusOf maps a library error to an HTTP status.
func statusOf(err error) int {
	var p interface{ GetStatus() int }
	switch {
	case errors.As(err, &p):
		return p.GetStatus()
	case errors.Is(err, airlock.ErrBoxNotFound), errors.Is(err, airlock.ErrImageNotFound), errors.Is(err, errNotSandbox):
		return http.StatusNotFound
	case errors.Is(err, airlock.ErrInvalidArgument), errors.Is(err, errBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// writeBoxError answers err with its status and message.
func writeBoxError(w http.ResponseWriter, err error) {
	writeError(w, statusOf(err), err.Error())
}

var (
	errNotSandbox = errors.New("not an E2B sandbox")
	errBadRequest = errors.New("bad request")
	errTooLarge   = errors.New("request too large")
)

// badRequest is an errBadRequest with a message.
func badRequest(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, a...))
}

// sandbox returns what the data plane keeps of box id (made on first use).
func (s *Server) sandbox(ctx context.Context, id string) (*sandbox, error) {
	s.mu.Lock()
	sb := s.boxes[id]
	s.mu.Unlock()
	if sb != nil {
		info, err := sb.box.Info(ctx)
		if err == nil {
			// Kept across an auto-pause (its code contexts reattach).
			if err := callable(info); err != nil {
				return nil, err
			}
			return sb, nil
		}
		s.forget(id)
	}
	b, err := s.rt.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	info, err := b.Info(ctx)
	if err != nil {
		return nil, err
	}
	if err := callable(info); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.boxes[id]; sb != nil {
		return sb, nil
	}
	sb = newSandbox(s, b)
	s.boxes[id] = sb
	return sb, nil
}

// callable says why the data plane does not serve the box of info: it is
// not running, and it is not a sandbox that a call resumes (autoPause
// with autoResume: airlock's idle suspend, which the box's next exec,
// file or port call wakes from).
func callable(info airlock.BoxInfo) error {
	if info.State == airlock.BoxRunning || (info.Suspended && autoResumes(info.Options)) {
		return nil
	}
	return fmt.Errorf("sandbox %s is not running (state %s): connect to it to resume it: %w", info.ID, info.State, airlock.ErrBoxNotFound)
}

// forget drops what the data plane keeps of box id.
func (s *Server) forget(id string) {
	s.mu.Lock()
	sb := s.boxes[id]
	delete(s.boxes, id)
	s.mu.Unlock()
	if sb != nil {
		sb.close()
	}
}

// sandbox is what the data plane keeps of one box: its users, the
// processes started through it, its code contexts.
type sandbox struct {
	s    *Server
	box  *airlock.Box
	envd http.Handler
	code http.Handler

	userOnce sync.Mutex
	users    map[string]userInfo // by name, once looked up

	procs   *procTable
	watches *watchTable

	defMu      sync.Mutex // serialises the making of default contexts
	cmu        sync.Mutex
	proxies    map[int]http.Handler // by box port (ports.go)
	transports []*http.Transport
	cb         *codebox.CodeBox
	contexts   map[string]*codeContext
}

func newSandbox(s *Server, b *airlock.Box) *sandbox {
	sb := &sandbox{s: s, box: b, users: map[string]userInfo{}, procs: newProcTable(), watches: newWatchTable(), contexts: map[string]*codeContext{},
		proxies: map[int]http.Handler{}}
	sb.envd = sb.envdHandler()
	sb.code = sb.codeHandler()
	return sb
}

func (sb *sandbox) close() {
	sb.procs.killAll()
	sb.watches.stopAll()
	sb.closeCode()
	sb.cmu.Lock()
	for _, tr := range sb.transports {
		tr.CloseIdleConnections()
	}
	sb.cmu.Unlock()
}
