package netstack

import (
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/time/rate"
)

// tcpQuery asks the box's resolver for HostName over a new TCP connection
// (answered by the resolver itself, no upstream) and returns the open
// connection, or an error when the gateway refused it.
func (g *guest) tcpQuery(t *testing.T) (*dns.Conn, error) {
	t.Helper()
	c, err := g.dial(t, DNSAddr.String()+":53")
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	co := &dns.Conn{Conn: c}
	if err := co.WriteMsg(new(dns.Msg).SetQuestion(HostName+".", dns.TypeA)); err != nil {
		c.Close()
		return nil, err
	}
	r, err := co.ReadMsg()
	if err != nil {
		c.Close()
		return nil, err
	}
	if len(r.Answer) != 1 {
		c.Close()
		t.Fatalf("%s over TCP: %v", HostName, r)
	}
	return co, nil
}

// TestHostileGuestDNSOverTCPFlows: connections to the gateway's resolver
// over TCP count against the box's flow cap and new-flow rate like any
// other flow: a box cannot hold more, or open them faster, there.
func TestHostileGuestDNSOverTCPFlows(t *testing.T) {
	g := startNet(t, Config{Policy: Policy{Mode: ModePublic}})
	e := g.n.Engine()

	// An open DNS connection is a flow while it lasts.
	co, err := g.tcpQuery(t)
	if err != nil {
		t.Fatalf("DNS over TCP: %v", err)
	}
	e.mu.Lock()
	n := len(e.flows)
	e.mu.Unlock()
	if n != 1 {
		t.Errorf("%d flows with one DNS connection open, want 1", n)
	}
	// A policy change does not close it (the resolver is always allowed).
	if closed, err := e.SetPolicy(Policy{Mode: ModeAllowlist}); err != nil || closed != 0 {
		t.Errorf("SetPolicy closed %d flows (%v), want 0", closed, err)
	}
	co.Close()

	// The flow cap: with maxFlows open elsewhere, the next DNS connection
	// is refused, and counted as denied.
	var fillers []func()
	for len(fillers) < maxFlows {
		fillers = append(fillers, e.track(&flow{close: func() {}}))
	}
	denied := e.Stats().Denied
	if co, err := g.tcpQuery(t); err == nil {
		co.Close()
		t.Error("DNS over TCP answered beyond the flow cap")
	}
	if e.Stats().Denied == denied || !strings.Contains(g.log.String(), "tcp 10.0.2.3:53 denied: too many open connections") {
		t.Errorf("DNS connection beyond the cap not denied (denied %d -> %d); log:\n%s", denied, e.Stats().Denied, g.log)
	}
	for _, untrack := range fillers {
		untrack()
	}

	// The new-flow rate: a burst of 2 admits two connections, not a third.
	e.mu.Lock()
	e.rate = rate.NewLimiter(0.001, 2)
	e.mu.Unlock()
	for i := 0; i < 2; i++ {
		co, err := g.tcpQuery(t)
		if err != nil {
			t.Fatalf("DNS connection %d within the rate: %v", i, err)
		}
		co.Close()
	}
	if co, err := g.tcpQuery(t); err == nil {
		co.Close()
		t.Error("DNS over TCP answered beyond the new-flow rate")
	}
	if !strings.Contains(g.log.String(), "tcp 10.0.2.3:53 denied: too many new connections per second") {
		t.Errorf("log lacks the rate refusal:\n%s", g.log)
	}
}
