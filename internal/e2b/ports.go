package e2b

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"regexp"
	"strconv"
	"time"
)

// maxProxiedPorts bounds the box ports one sandbox's proxy keeps
// transports for.
const maxProxiedPorts = 32

// hostPort matches the host name E2B's get_host gives a port of a sandbox:
// PORT-SANDBOXID.DOMAIN.
var hostPort = regexp.MustCompile(`^([0-9]{1,5})-([0-9a-f]{12})\.`)

// hostRoute returns the sandbox and port a Host header names (E2B's
// PORT-ID.DOMAIN form), ok false when it names none.
func hostRoute(host string) (id, port string, ok bool) {
	m := hostPort.FindStringSubmatch(host)
	if m == nil {
		return "", "", false
	}
	return m[2], m[1], true
}

// proxy returns the reverse proxy to port of the box: HTTP and WebSocket,
// over connections Box.DialPort opens through the box's network (no port
// need be published). The data plane's own headers are not passed on.
func (sb *sandbox) proxy(port int) (http.Handler, error) {
	sb.cmu.Lock()
	defer sb.cmu.Unlock()
	if h, ok := sb.proxies[port]; ok {
		return h, nil
	}
	if len(sb.proxies) >= maxProxiedPorts {
		return nil, badRequest("the sandbox's proxy serves %d ports already, the most it may", maxProxiedPorts)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return sb.box.DialPort(ctx, port)
		},
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "http", "127.0.0.1:"+strconv.Itoa(port)
			r.Out.Host = r.In.Host
			for _, h := range []string{"X-Access-Token", "E2B-Traffic-Access-Token", "X-API-Key", "E2b-Sandbox-Id", "E2b-Sandbox-Port"} {
				r.Out.Header.Del(h)
			}
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: port %d: %v (is a server listening on it in the box, and has the box a network?)", sb.box.ID(), port, err))
		},
	}
	sb.proxies[port] = p
	sb.transports = append(sb.transports, tr)
	return p, nil
}
