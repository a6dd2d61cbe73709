package netstack

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Request is one call on a helper's control socket (one JSON object per
// connection, answered by one Response).
type Request struct {
	// Op is "stats", "policy" (replace the policy with Policy), "ports"
	// or "secret" (replace the value of the secret named Secret.Name by
	// Secret.Value; its hosts and placeholder stay).
	Op     string  `json:"op"`
	Policy *Policy `json:"policy,omitempty"`
	Secret *Secret `json:"secret,omitempty"`
}

// Response answers a Request.
type Response struct {
	Error     string    `json:"error,omitempty"`
	Stats     Stats     `json:"stats"`
	Published []Publish `json:"published,omitempty"`
	// Closed is how many open flows a policy change closed.
	Closed int `json:"closed,omitempty"`
}

// maxRequest bounds a control request.
const maxRequest = 1 << 20

// serveControl answers requests on l until it is closed.
func serveControl(l net.Listener, n *Net) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			var req Request
			if err := json.NewDecoder(bufio.NewReader(&limitReader{c, maxRequest})).Decode(&req); err != nil {
				json.NewEncoder(c).Encode(Response{Error: "bad request: " + err.Error()})
				return
			}
			var resp Response
			switch req.Op {
			case "stats":
			case "ports":
				resp.Published = n.Published()
			case "policy":
				if req.Policy == nil {
					resp.Error = "policy missing"
					break
				}
				k, err := n.e.SetPolicy(*req.Policy)
				if err != nil {
					resp.Error = err.Error()
				}
				resp.Closed = k
			case "secret":
				if req.Secret == nil {
					resp.Error = "secret missing"
				} else if n.ic == nil {
					resp.Error = "the box has no secrets"
				} else if err := n.ic.setValue(req.Secret.Name, req.Secret.Value); err != nil {
					resp.Error = err.Error()
				}
			default:
				resp.Error = fmt.Sprintf("unknown op %q", req.Op)
			}
			resp.Stats = n.e.Stats()
			json.NewEncoder(c).Encode(resp)
		}()
	}
}

type limitReader struct {
	c net.Conn
	n int
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("request too large")
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	k, err := l.c.Read(p)
	l.n -= k
	return k, err
}

// Call sends req to the helper's control socket at path.
func Call(ctx context.Context, path string, req Request) (Response, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Response{}, fmt.Errorf("network helper not running (no %s)", path)
		}
		return Response{}, fmt.Errorf("network helper: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return Response{}, fmt.Errorf("network helper: %w", err)
	}
	var resp Response
	if err := json.NewDecoder(&limitReader{c, maxRequest}).Decode(&resp); err != nil {
		return Response{}, fmt.Errorf("network helper: %w", err)
	}
	if resp.Error != "" {
		return resp, errors.New(resp.Error)
	}
	return resp, nil
}
