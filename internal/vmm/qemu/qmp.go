package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// maxQMPLine bounds one line QEMU sends on QMP (1 MiB; the replies airlock
// asks for are a few KiB): code that took over QEMU is the guest, and a
// line without an end must not grow the host's memory.
const maxQMPLine = 1 << 20

// errQMPLine is the error for a QMP line past maxQMPLine.
var errQMPLine = fmt.Errorf("qmp: QEMU sent a line longer than %d bytes: refused (QEMU may be compromised: stop the box)", maxQMPLine)

// readQMPLine reads one '\n'-terminated line of at most maxQMPLine bytes
// from r (newline included).
func readQMPLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > maxQMPLine {
			return nil, errQMPLine
		}
		line = append(line, frag...)
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// QMP is a minimal client for the QEMU Machine Protocol on a unix socket
// (one command at a time; asynchronous events are skipped).
type QMP struct {
	conn net.Conn
	r    *bufio.Reader
	seq  int // id of the last command sent
}

// DialQMP connects to the QMP socket and negotiates capabilities.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	q := &QMP{conn: conn, r: bufio.NewReader(conn)}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if _, err := readQMPLine(q.r); err != nil { // greeting
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	if _, err := q.Execute("qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// Execute runs one QMP command and returns its "return" value.
func (q *QMP) Execute(cmd string, args any) (json.RawMessage, error) {
	b, id := q.request(cmd, args)
	if _, err := q.conn.Write(b); err != nil {
		return nil, err
	}
	return q.readReturn(cmd, id)
}

// request encodes cmd with args (nil: none) and a fresh id, which QEMU
// echoes in its reply, so that readReturn never takes a late reply to an
// earlier command for this one's.
func (q *QMP) request(cmd string, args any) ([]byte, int) {
	q.seq++
	req := map[string]any{"execute": cmd, "id": q.seq}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	return append(b, '\n'), q.seq
}

// Close closes the connection.
func (q *QMP) Close() error { return q.conn.Close() }
