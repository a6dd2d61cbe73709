package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultAuditMaxBytes is the size at which the audit log is rotated.
const DefaultAuditMaxBytes = 16 << 20

// AuditLog appends one JSON line per exec (box, command, exit, duration,
// client, tenant) to a file, owner-only. It is bounded on disk: past MaxBytes the
// file becomes PATH.1 (replacing the previous one) and a new file starts,
// so at most twice MaxBytes are kept. Commands longer than 4 KiB are cut.
type AuditLog struct {
	path string
	max  int64

	mu   sync.Mutex
	f    *os.File
	size int64
}

// AuditEntry is one line of the audit log.
type AuditEntry struct {
	Time       time.Time `json:"time"`
	Kind       string    `json:"kind"` // exec, exec_stream, code_run, cell, install
	BoxID      string    `json:"box_id"`
	Cmd        []string  `json:"cmd,omitempty"`
	Code       string    `json:"code,omitempty"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	TimedOut   bool      `json:"timed_out,omitempty"`
	Error      string    `json:"error,omitempty"`
	DurationMS float64   `json:"duration_ms"`
	Client     string    `json:"client"` // "unix", "token:" + a hash prefix of the token, or "tenant:" + the tenant
	// Tenant is the tenant of the request (airlock serve --tenants), or
	// AdminTenant for the server's own token and the unix socket (and
	// for an entry written without one).
	Tenant    string `json:"tenant"`
	RequestID string `json:"request_id,omitempty"`
}

// OpenAuditLog opens (creating, mode 0600) the audit log at path; maxBytes
// <= 0 means DefaultAuditMaxBytes.
func OpenAuditLog(path string, maxBytes int64) (*AuditLog, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultAuditMaxBytes
	}
	a := &AuditLog{path: path, max: maxBytes}
	if err := a.open(); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *AuditLog) open() error {
	f, err := os.OpenFile(a.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	a.f, a.size = f, fi.Size()
	return nil
}

const maxAuditField = 4 << 10

func cut(s string) string {
	if len(s) > maxAuditField {
		return s[:maxAuditField] + "…"
	}
	return s
}

// Write appends e. Errors are dropped (the audit log must not fail an
// exec); a failed rotation keeps writing to the current file.
func (a *AuditLog) Write(e AuditEntry) {
	if a == nil {
		return
	}
	e.Code = cut(e.Code)
	if e.Tenant == "" {
		e.Tenant = AdminTenant
	}
	n := 0
	cmd := make([]string, 0, len(e.Cmd))
	for _, c := range e.Cmd {
		if n > maxAuditField {
			cmd = append(cmd, "…")
			break
		}
		c = cut(c)
		n += len(c)
		cmd = append(cmd, c)
	}
	e.Cmd = cmd
	line, _ := json.Marshal(e)
	line = append(line, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return
	}
	if a.size+int64(len(line)) > a.max && a.size > 0 {
		a.f.Close()
		os.Rename(a.path, a.path+".1")
		if err := a.open(); err != nil {
			a.f = nil
			return
		}
	}
	k, _ := a.f.Write(line)
	a.size += int64(k)
}

// Close closes the file.
func (a *AuditLog) Close() error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	return err
}

// audit writes an entry for an exec-like call that started at t0.
func (s *Server) audit(ctx context.Context, e AuditEntry, t0 time.Time, err error) {
	if s.cfg.Audit == nil {
		return
	}
	e.Time = t0.UTC()
	e.DurationMS = ms(time.Since(t0))
	e.Client = clientOf(ctx)
	e.Tenant = TenantName(ctx)
	if info, ok := ctx.Value(reqInfoKey).(*reqInfo); ok {
		e.RequestID = info.id
	}
	if err != nil {
		e.Error = err.Error()
	}
	s.cfg.Audit.Write(e)
}

func intp(n int) *int { return &n }
