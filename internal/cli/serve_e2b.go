package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"golang.org/x/net/netutil"

	"github.com/airlock-run/airlock"
	"github.com/airlock-run/airlock/internal/e2b"
	"github.com/airlock-run/airlock/internal/server"
)

// serveE2B serves E2B's API (airlock serve --e2b ADDR) on its own
// listener, under the REST server's policy and exec slots (srv's). stop shuts it down.
// tokenFile is where token is stored ("" when it came from --token or
// AIRLOCK_TOKEN): the listening line names it, since E2B_API_KEY is made
// from it.
func serveE2B(ctx context.Context, log *slog.Logger, rt *airlock.Runtime, token, tokenFile, addr string, templates []string, maxConns int, maxUpload int64, audit *server.AuditLog, srv *server.Server) (stop func(), err error) {
	if err := e2b.CheckToken(token); err != nil {
		return nil, fmt.Errorf("--e2b: %w", err)
	}
	tm := map[string]string{}
	for _, t := range templates {
		name, img, ok := strings.Cut(t, "=")
		if !ok || name == "" || img == "" {
			return nil, fmt.Errorf("--e2b-template %q: want NAME=IMAGE", t)
		}
		tm[name] = img
	}
	es, err := e2b.New(e2b.Config{Runtime: rt, Token: token, Logger: log, Templates: tm, MaxUploadBytes: maxUpload,
		CheckBox:    func(ctx context.Context, o *airlock.BoxOptions) (func(), error) { return srv.CheckBox(ctx, o) },
		PullContext: srv.PullContext, CheckStart: srv.CheckStart, CheckSuspend: srv.CheckSuspend,
		CheckSnapshot: srv.CheckSnapshot, CheckFork: srv.CheckFork, CheckNetwork: srv.CheckNetwork,
		Audit: func(r e2b.AuditRecord) {
			audit.Write(server.AuditEntry{Time: time.Now(), Kind: r.Kind, BoxID: r.BoxID, Cmd: r.Cmd, Code: r.Code,
				ExitCode: r.ExitCode, TimedOut: r.TimedOut, Error: r.Error, DurationMS: float64(r.Duration) / float64(time.Millisecond),
				Client: server.E2BClient})
		},
		AcquireExec: func(ctx context.Context) (func(), error) {
			return srv.AcquireExec(ctx, server.E2BClient)
		}})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	// HTTP/1.1 and HTTP/2 without TLS (h2c): the SDKs speak either.
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: es.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, Protocols: &protos,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	if maxConns <= 0 {
		maxConns = server.DefaultMaxConns
	}
	go hs.Serve(netutil.LimitListener(l, maxConns))
	key := "e2b_ followed by the token of --token or AIRLOCK_TOKEN"
	if tokenFile != "" {
		key = "e2b_$(cat " + tokenFile + ")"
	}
	log.Info("listening", "e2b", l.Addr().String(), "E2B_API_URL", "http://"+l.Addr().String(), "E2B_SANDBOX_URL", "http://"+l.Addr().String(),
		"E2B_API_KEY", key, "token_file", tokenFile)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
		es.Close()
	}, nil
}
