package netstack

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// Request is one call on a helper's control socket (one JSON object per
// connection, answered by one Response).
type Request struct {
	// Op is "stats", "policy" (replace the policy with Policy), "ports",
	// "connect": open a TCP connection to Port in the guest; after the
	// answer, the control connection carries its bytes (Connect), or
	// "secret": replace the value of the secret named Secret.Name by
	// Secret.Value (its hosts and placeholder stay).
	Op     string  `json:"op"`
	Policy *Policy `json:"policy,omitempty"`
	Port   int     `json:"port,omitempty"`
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
			br := bufio.NewReader(&limitReader{c, maxRequest})
			dec := json.NewDecoder(br)
			if err := dec.Decode(&req); err != nil {
				json.NewEncoder(c).Encode(Response{Error: "bad request: " + err.Error()})
				return
			}
			var resp Response
			switch req.Op {
			case "connect":
				if n, _ := dec.Buffered().Read(make([]byte, 1)); n > 0 || br.Buffered() > 0 {
					resp.Error = "connect: bytes sent before the answer"
					break
				}
				in, err := n.dialGuest(req.Port)
				if err != nil {
					resp.Error = err.Error()
					break
				}
				if err := json.NewEncoder(c).Encode(resp); err != nil {
					in.Close()
					return
				}
				c.SetDeadline(time.Time{})
				n.e.conns.Add(1)
				relayTCP(c, in, &n.e.bytesIn, &n.e.bytesOut)
				return
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

// Connect opens a TCP connection to port in the guest through the helper's
// control socket at path: the returned connection carries its bytes
// (CloseWrite half-closes it). ctx bounds the setup only.
func Connect(ctx context.Context, path string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: want 1-65535", port)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("network helper not running (no %s)", path)
		}
		return nil, fmt.Errorf("network helper: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	b, _ := json.Marshal(Request{Op: "connect", Port: port}) // no newline: the helper reads exactly this
	if _, err := c.Write(b); err != nil {
		c.Close()
		return nil, fmt.Errorf("network helper: %w", err)
	}
	// The answer is one line; read it byte by byte so that no byte of
	// the connection's own is taken with it.
	var line []byte
	one := make([]byte, 1)
	for {
		if _, err := io.ReadFull(c, one); err != nil {
			c.Close()
			return nil, fmt.Errorf("network helper: %w", err)
		}
		if one[0] == '\n' {
			break
		}
		if len(line) >= 64<<10 {
			c.Close()
			return nil, errors.New("network helper: answer too long")
		}
		line = append(line, one[0])
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		c.Close()
		return nil, fmt.Errorf("network helper: %w", err)
	}
	if resp.Error != "" {
		c.Close()
		return nil, errors.New(resp.Error)
	}
	c.SetDeadline(time.Time{})
	return c, nil
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
