package netstack

import (
	"net"
	"strconv"
	"testing"
)

// BenchmarkConnect measures TCP connection setup from the stand-in guest
// through the stack to a server on the host's loopback (a host port).
func BenchmarkConnect(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	g := startNet(b, Config{Policy: Policy{Mode: ModePublic, HostPorts: []int{port}}})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := g.dial(b, "10.0.2.2:"+strconv.Itoa(port))
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkConnectRefused is BenchmarkConnect's baseline: a connection the
// policy refuses (reset at once, no host dial).
func BenchmarkConnectRefused(b *testing.B) {
	g := startNet(b, Config{Policy: Policy{Mode: ModePublic}})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if c, err := g.dial(b, "10.0.2.2:9"); err == nil {
			c.Close()
			b.Fatal("connected")
		}
	}
}
