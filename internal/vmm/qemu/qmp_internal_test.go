package qemu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A QEMU taken over by the guest is the guest: a QMP line without an end
// is refused at maxQMPLine, not read into memory until the connection's
// deadline. Here the "QEMU" greets and then streams 64 MiB with no newline.
func TestHostileGuestQMPLineIsBounded(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, `{"QMP": {"version": {}}}`+"\n")
		bufio.NewReader(c).ReadString('\n') // qmp_capabilities
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for i := 0; i < 64; i++ {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := DialQMP(ctx, sock)
	if err == nil {
		q.Close()
	}
	runtime.ReadMemStats(&ms)
	alloc := ms.TotalAlloc - before
	t.Logf("DialQMP: %v; allocated %d MiB", err, alloc>>20)
	if !errors.Is(err, errQMPLine) {
		t.Fatalf("DialQMP on an endless line: %v, want errQMPLine", err)
	}
	if alloc > 16<<20 {
		t.Fatalf("reading the line allocated %d MiB", alloc>>20)
	}
}

// FuzzQMPReply feeds arbitrary bytes from "QEMU" to the reply reader: it
// returns an error or a reply, within the line bound, and never panics.
func FuzzQMPReply(f *testing.F) {
	f.Add([]byte(`{"return": {}, "id": 1}` + "\n"))
	f.Add([]byte(`{"event": "STOP"}` + "\n" + `{"return": {"status": "paused"}, "id": 1}` + "\n"))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "no"}, "id": 1}` + "\n"))
	f.Add([]byte(`{"return": 1, "id": 2}` + "\n" + `{"return": [], "id": 1}` + "\n"))
	f.Add([]byte(`{"id": 1, "return": ` + strings.Repeat("[", 10000)))
	f.Add([]byte("\x00\xff{\n"))
	f.Add(bytes.Repeat([]byte("x"), 70000))
	f.Fuzz(func(t *testing.T, data []byte) {
		q := &QMP{r: bufio.NewReaderSize(bytes.NewReader(data), 4096)}
		ret, err := q.readReturn("test", 1)
		if err == nil && len(ret) > maxQMPLine {
			t.Fatalf("a reply of %d bytes", len(ret))
		}
		line, err := readQMPLine(bufio.NewReaderSize(bytes.NewReader(data), 16))
		if len(line) > maxQMPLine {
			t.Fatalf("a line of %d bytes", len(line))
		}
		if err == nil && (len(line) == 0 || line[len(line)-1] != '\n') {
			t.Fatalf("line %q without its newline", line)
		}
	})
}
