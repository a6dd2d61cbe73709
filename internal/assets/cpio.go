package assets

import (
	"fmt"
	"io"
	"strings"
)

// cpioWriter writes the "newc" (SVR4, no CRC) cpio format that the Linux
// kernel unpacks as an initramfs (Documentation/driver-api/early-userspace/
// buffer-format.rst).
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

const (
	cpioDir  = 0o040000
	cpioFile = 0o100000
	cpioChr  = 0o020000
)

func (c *cpioWriter) header(name string, mode uint32, size int, rmaj, rmin int) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if mode&cpioDir != 0 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rmaj, rmin, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad(len(hdr) + len(name) + 1)
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// Dir adds a directory.
func (c *cpioWriter) Dir(name string) {
	c.header(strings.TrimPrefix(name, "/"), cpioDir|0o755, 0, 0, 0)
}

// File adds a regular file with the given permission bits.
func (c *cpioWriter) File(name string, perm uint32, data []byte) {
	c.header(strings.TrimPrefix(name, "/"), cpioFile|perm, len(data), 0, 0)
	c.write(data)
	c.pad(len(data))
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm uint32, major, minor int) {
	c.header(strings.TrimPrefix(name, "/"), cpioChr|perm, 0, major, minor)
}

// Close writes the trailer.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	return c.err
}
