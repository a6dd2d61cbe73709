package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/airlock-run/airlock/internal/kubebox"
	"github.com/airlock-run/airlock/internal/server"
)

// boxRoutes are the per-box routes whose answer is the box (its node's
// id and name are replaced by the gateway's).
var boxRoutes = map[string]bool{"start": true, "stop": true, "pause": true, "resume": true}

// ServeBox implements server.Cluster: the request is proxied, unbuffered,
// to the airlock API of the node that runs the box (WebSocket upgrades
// pass through), with the node token instead of the client's. The
// client's going away cancels the node's call. A node that is lost, or
// does not answer, is 409 box_lost naming it.
func (g *Gateway) ServeBox(w http.ResponseWriter, r *http.Request, id string) {
	if path.Clean(r.URL.Path) != r.URL.Path {
		// No dot segments: the path a node gets stays under the box.
		server.WriteProblem(w, &server.Problem{Status: http.StatusBadRequest, Code: server.CodeInvalid,
			Detail: fmt.Sprintf("path %q is not clean (no . or .. segments, no empty ones)", r.URL.Path)})
		return
	}
	p, err := g.findPod(r.Context(), id)
	if err != nil {
		writeErr(w, err)
		return
	}
	if p.Spec.NodeName == "" {
		server.WriteProblem(w, &server.Problem{Status: http.StatusConflict, Code: server.CodeBoxNotRunning,
			Detail: fmt.Sprintf("box %s is not on a node yet (%s)", id, podWhy(p))})
		return
	}
	st, err := g.node(r.Context(), p.Spec.NodeName, false)
	if err != nil {
		writeErr(w, err)
		return
	}
	if st.lost != "" && strings.Contains(st.lost, "does not answer") {
		// Try again: the node may be back, on its address or another.
		st, err = g.node(r.Context(), p.Spec.NodeName, true)
		if err != nil {
			writeErr(w, err)
			return
		}
	}
	if st.lost != "" {
		server.WriteProblem(w, lostProblem(id, st.lost))
		return
	}
	base, err := url.Parse(st.api)
	if err != nil || st.api == "" || (base.Scheme != "http" && base.Scheme != "https") {
		server.WriteProblem(w, &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
			Detail: fmt.Sprintf("node %s advertises no usable airlock API (annotation %s = %q): start it with airlock node --api-listen", st.name, kubebox.APIAnnotation, st.api)})
		return
	}
	if o := r.Header.Get("Origin"); o != "" {
		// airlock serve refuses cross-origin WebSockets; the node would
		// see the gateway's Host, so the check is made here.
		if u, err := url.Parse(o); err != nil || !strings.EqualFold(u.Host, r.Host) {
			server.WriteProblem(w, &server.Problem{Status: http.StatusForbidden, Code: server.CodePolicyDenied,
				Detail: fmt.Sprintf("cross-origin request from %q refused", o)})
			return
		}
	}
	rest := strings.TrimPrefix(r.URL.Path, "/v1/boxes/"+id)
	nodePath := "/v1/boxes/" + kubebox.BoxName(string(p.UID)) + rest
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(base)
			pr.Out.URL.Path, pr.Out.URL.RawPath = nodePath, ""
			pr.Out.Header.Set("Authorization", "Bearer "+g.cfg.NodeToken)
			pr.Out.Header.Del("Origin") // checked above
			pr.Out.Header.Del("Cookie")
			pr.Out.Host = base.Host
		},
		Transport:     g.transport,
		FlushInterval: -1,
		ErrorLog:      nil,
		ModifyResponse: func(resp *http.Response) error {
			g.markReachable(st.name)
			if resp.StatusCode == http.StatusUnauthorized {
				resp.Body.Close()
				return errNodeToken
			}
			if r.Method == http.MethodPost && resp.StatusCode == http.StatusOK && boxRoutes[strings.TrimPrefix(rest, "/")] {
				if rest == "/stop" {
					if o, err := kubebox.ParseOptions(p.Annotations[kubebox.OptionsAnnotation]); err == nil && o.AutoRemove {
						// Removed once stopped, as airlock serve does: later
						// calls are 404.
						if err := g.RemoveBox(r.Context(), id, true); err != nil {
							g.cfg.Logf("box %s (auto_remove) stopped but not removed: %v", id, err)
						}
					}
				}
				return fixBoxResponse(resp, p, tenantOf(r.Context()) != "")
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			switch {
			case r.Context().Err() != nil:
				// The client went away: nobody to answer.
			case errors.Is(err, errNodeToken):
				server.WriteProblem(w, &server.Problem{Status: http.StatusBadGateway, Code: server.CodeInternal,
					Detail: fmt.Sprintf("node %s refused the gateway's node token: give the gateway the nodes' token (airlock gateway --node-token-file, airlock node --api-token-file)", st.name)})
			case isDial(err):
				g.markUnreachable(st.name, err)
				server.WriteProblem(w, lostProblem(id, fmt.Sprintf("node %s does not answer (%v)", st.name, err)))
			default:
				server.WriteProblem(w, &server.Problem{Status: http.StatusBadGateway, Code: server.CodeBoxLost,
					Detail: fmt.Sprintf("the call to box %s on node %s broke off: %v", id, st.name, err)})
			}
		},
	}
	rp.ServeHTTP(w, r)
}

var errNodeToken = errors.New("node refused the node token")

// isDial says whether err is a failure to connect (the node is down, or
// not where it said), not one of a call under way.
func isDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// fixBoxResponse replaces the node's id and name in a box answer; for a
// tenant (tenantView), the name is the tenant's and the tenant label is
// left out, as the server shows its boxes to it.
func fixBoxResponse(resp *http.Response, p *corev1.Pod, tenantView bool) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxNodeBoxBytes))
	resp.Body.Close()
	if err != nil {
		return err
	}
	var b server.Box
	if json.Unmarshal(body, &b) == nil && b.ID != "" {
		fixBox(&b, p)
		if tenantView {
			b.Name = p.Labels[kubebox.NameLabel]
			delete(b.Labels, server.TenantLabel)
			if len(b.Labels) == 0 {
				b.Labels = nil
			}
		}
		if nb, err := json.Marshal(b); err == nil {
			body = nb
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

// writeErr writes a problem for err.
func writeErr(w http.ResponseWriter, err error) {
	var p *server.Problem
	if !errors.As(err, &p) {
		p = &server.Problem{Status: http.StatusInternalServerError, Code: server.CodeInternal, Detail: err.Error()}
	}
	server.WriteProblem(w, p)
}
