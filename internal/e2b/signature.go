package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
)

// Signed file URLs: sandbox.download_url(path) and upload_url(path) of
// E2B's SDKs name GET or POST /files with a signature instead of the
// access token, so that a browser or curl can use them. envd's scheme
// (v1): signature = "v1_" + unpadded base64 of SHA-256 of
// "PATH:OPERATION:USERNAME:ACCESS_TOKEN" (":EXPIRATION" appended when the
// URL carries signature_expiration, a Unix time in seconds), OPERATION
// "read" for GET and "write" for POST, USERNAME "" when the URL names
// none (the default user).
//
// With E2B_SANDBOX_URL set, such a URL carries no E2b-Sandbox-Id header:
// the server finds its sandbox as the one whose access token the
// signature was made with (one SHA-256 per E2B sandbox that runs).

// Signing operations, as envd names them.
const (
	signRead  = "read"
	signWrite = "write"
)

// fileSignature is envd's v1 signature of a /files URL.
func fileSignature(path, op, user, token string, exp *int64) string {
	raw := strings.Join([]string{path, op, user, token}, ":")
	if exp != nil {
		raw += ":" + strconv.FormatInt(*exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedFileRequest says whether r is a /files request that may be
// authorized by a signature (GET or POST /files to envd), and returns
// its operation.
func signedFileRequest(r *http.Request) (op string, ok bool) {
	if r.URL.Path != "/files" {
		return "", false
	}
	switch p := r.Header.Get("E2b-Sandbox-Port"); p {
	case "", strconv.Itoa(EnvdPort):
	default:
		return "", false
	}
	switch r.Method {
	case http.MethodGet:
		return signRead, true
	case http.MethodPost:
		return signWrite, true
	}
	return "", false
}

// signatureError is a signed URL's refusal (401, as envd answers).
type signatureError string

func (e signatureError) Error() string { return string(e) }

// errBadSignature is a signature that does not match.
var errBadSignature error = signatureError("invalid signature: the URL's signature does not match its path, user and sandbox (make the URL again with sandbox.download_url or upload_url)")

// checkSignature checks r's signature for sandbox id, as envd does: a
// missing or wrong signature, or one past its signature_expiration, is
// refused.
func (s *Server) checkSignature(r *http.Request, id, op string) error {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return signatureError("missing signature query parameter: send the sandbox's access token (X-Access-Token), or use a URL from sandbox.download_url or upload_url")
	}
	var exp *int64
	if e := q.Get("signature_expiration"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return signatureError(fmt.Sprintf("signature_expiration %q: want a Unix time in seconds", e))
		}
		exp = &n
	}
	want := fileSignature(q.Get("path"), op, q.Get("username"), s.accessToken(id), exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) != 1 {
		return errBadSignature
	}
	if exp != nil && *exp < time.Now().Unix() {
		return signatureError(fmt.Sprintf("signature is already expired (at %s): make the URL again with a later use_signature_expiration", time.Unix(*exp, 0).UTC().Format(time.RFC3339)))
	}
	return nil
}

// maxSignedCandidates bounds the sandboxes a signed URL without the E2B
// headers is checked against.
const maxSignedCandidates = 10000

// signedSandbox finds the running E2B sandbox whose access token r's
// signature was made with.
func (s *Server) signedSandbox(ctx context.Context, r *http.Request, op string) (string, error) {
	boxes, err := s.rt.List(ctx)
	if err != nil {
		return "", err
	}
	for i, info := range boxes {
		if i == maxSignedCandidates {
			break
		}
		if _, ok := info.Options.Labels[templateLabel]; !ok || info.State != airlock.BoxRunning {
			continue
		}
		if err := s.checkSignature(r, info.ID, op); !errors.Is(err, errBadSignature) {
			// A match (nil), or a match that expired.
			return info.ID, err
		}
	}
	return "", errBadSignature
}

// signedFiles answers a signed /files URL that names no sandbox (the
// SDK's form with E2B_SANDBOX_URL set): the data plane of the sandbox the
// signature belongs to.
func (s *Server) signedFiles(w http.ResponseWriter, r *http.Request, op string) {
	id, err := s.signedSandbox(r.Context(), r, op)
	if err != nil {
		writeError(w, statusOfSigned(err), err.Error())
		return
	}
	r.Header.Set("E2b-Sandbox-Id", id)
	r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
	s.dataPlane(w, r, id)
}

// statusOfSigned is the status of a signature's refusal: 401, as envd
// answers; else that of the error (listing the boxes failed).
func statusOfSigned(err error) int {
	var se signatureError
	if errors.As(err, &se) {
		return http.StatusUnauthorized
	}
	return statusOf(err)
}
