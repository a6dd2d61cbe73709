package netstack

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Engine decides which flows a box may open and keeps the box's counters
// and its log of denied attempts. It is safe for concurrent use.
type Engine struct {
	hostAddrs    map[netip.Addr]bool
	testInternet netip.Prefix // see TestInternetEnv
	log          io.Writer    // denied attempts, one line each; nil: none

	mu      sync.Mutex
	pol     *compiled
	learned map[netip.Addr]map[string]bool // allowlist: address -> names that resolved to it
	// bound reports whether a secret is bound to a name (nil: the box has
	// no secrets); boundAddrs maps the addresses such names resolved to,
	// for the box, to those names (in every mode).
	bound      func(name string) bool
	boundAddrs map[netip.Addr]map[string]bool
	flows      map[*flow]struct{}
	logged     map[string]time.Time // recent log lines, for rate limiting
	rate       *rate.Limiter        // new flows

	bytesIn, bytesOut, denied, conns, queries atomic.Uint64
}

// maxLearned bounds how many addresses DNS answers may add to an
// allowlist (beyond it the oldest knowledge is dropped: names are looked up
// again).
const maxLearned = 1 << 16

// Stats are a box's network counters since its helper started.
type Stats struct {
	// BytesOut is payload sent by the box (TCP and UDP, to any
	// destination, published ports included); BytesIn what it received.
	BytesOut uint64 `json:"bytes_out"`
	BytesIn  uint64 `json:"bytes_in"`
	// Denied counts refused connections, datagrams flows and DNS queries.
	Denied uint64 `json:"denied"`
	// Connections counts allowed TCP connections and UDP flows.
	Connections uint64 `json:"connections"`
	// DNSQueries counts queries the box's resolver answered.
	DNSQueries uint64 `json:"dns_queries"`
}

// Verdict is the decision on one flow.
type Verdict struct {
	Allow  bool
	Reason string         // why not, when denied
	Dial   netip.AddrPort // where to connect on the host side, when allowed
}

// NewEngine returns an engine enforcing p that writes one line per denied
// attempt to log (nil: no log).
func NewEngine(p Policy, log io.Writer) (*Engine, error) {
	c, err := compile(p)
	if err != nil {
		return nil, err
	}
	return &Engine{hostAddrs: hostAddrs(), testInternet: testInternet(), log: log, pol: c,
		learned: map[netip.Addr]map[string]bool{}, boundAddrs: map[netip.Addr]map[string]bool{}, flows: map[*flow]struct{}{}, logged: map[string]time.Time{},
		rate: rate.NewLimiter(flowRate, flowBurst)}, nil
}

// Policy returns the policy in force.
func (e *Engine) Policy() Policy {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pol.Policy
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	return Stats{BytesOut: e.bytesOut.Load(), BytesIn: e.bytesIn.Load(), Denied: e.denied.Load(),
		Connections: e.conns.Load(), DNSQueries: e.queries.Load()}
}

// SetPolicy replaces the policy and closes the open flows it no longer
// allows. It returns how many it closed.
func (e *Engine) SetPolicy(p Policy) (int, error) {
	c, err := compile(p)
	if err != nil {
		return 0, err
	}
	e.mu.Lock()
	e.pol = c
	var stale []*flow
	for f := range e.flows {
		if f.gateway {
			continue
		}
		if v := e.checkLocked(f.proto, f.dst); !v.Allow {
			stale = append(stale, f)
		}
	}
	e.mu.Unlock()
	for _, f := range stale {
		e.Deny(f.proto, f.dst.String(), "policy changed")
		f.close()
	}
	return len(stale), nil
}

// Check decides whether the box may open a proto ("tcp" or "udp") flow to
// dst. It neither counts nor logs a denial (see Deny).
func (e *Engine) Check(proto string, dst netip.AddrPort) Verdict {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.checkLocked(proto, dst)
}

func deny(reason string) Verdict { return Verdict{Reason: reason} }

func (e *Engine) checkLocked(proto string, dst netip.AddrPort) Verdict {
	c := e.pol
	a, port := dst.Addr().Unmap(), dst.Port()
	if a == GatewayAddr || a == DNSAddr {
		if a == GatewayAddr && c.hostPorts[port] {
			return Verdict{Allow: true, Dial: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port)}
		}
		return deny("gateway (only DNS, and the ports --allow-host-port opens)")
	}
	always, private := e.classify(a)
	if always != "" {
		return deny(always)
	}
	allow := Verdict{Allow: true, Dial: netip.AddrPortFrom(e.dialAddr(a), port)}
	if c.Mode == ModeAllowlist {
		if port == 53 {
			return deny("DNS server other than the box's resolver")
		}
		if private != "" {
			if c.listedPrivate(privateRange(a), a, port, false) {
				return allow
			}
			return deny(private)
		}
		if c.listed(a, port) {
			return allow
		}
		for name := range e.learned[a] {
			if c.nameAllowsPort(name, port) {
				return allow
			}
		}
		return deny("not in allowlist")
	}
	if private != "" {
		return deny(private)
	}
	if c.denied(a, port) && !c.listed(a, port) {
		return deny("in deny-net")
	}
	return allow
}

// NameAllowed reports whether the box may resolve name (lower case, no
// final dot).
func (e *Engine) NameAllowed(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pol.nameAllowed(name)
}

// Resolved vets one address a DNS answer for name gives: it returns a
// reason when the box must not get it (an address the box may never reach:
// DNS rebinding), else "" and, in allowlist mode, lets the box connect to
// it on the ports name's rules allow.
func (e *Engine) Resolved(name string, addr netip.Addr) (refused string) {
	addr = addr.Unmap()
	e.mu.Lock()
	defer e.mu.Unlock()
	always, private := e.classify(addr)
	if always != "" {
		return always
	}
	if private != "" && !(e.pol.Mode == ModeAllowlist && e.pol.listedPrivate(privateRange(addr), addr, 0, true)) {
		return private
	}
	if addr == GatewayAddr || addr == DNSAddr {
		return "gateway"
	}
	if e.bound != nil && e.bound(name) {
		if len(e.boundAddrs) >= maxLearned {
			clear(e.boundAddrs)
		}
		m := e.boundAddrs[addr]
		if m == nil {
			m = map[string]bool{}
			e.boundAddrs[addr] = m
		}
		if len(m) < 64 {
			m[name] = true
		}
	}
	if e.pol.Mode == ModeAllowlist {
		if len(e.learned) >= maxLearned {
			clear(e.learned)
		}
		m := e.learned[addr]
		if m == nil {
			m = map[string]bool{}
			e.learned[addr] = m
		}
		if len(m) < 64 {
			m[name] = true
		}
	}
	return ""
}

// BoundNames returns the names a secret is bound to that resolved to addr
// for the box (sorted; nil: none).
func (e *Engine) BoundNames(addr netip.Addr) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for n := range e.boundAddrs[addr.Unmap()] {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Note logs line (not a denial: a secret's substitution), at most once a
// second for the same line.
func (e *Engine) Note(line string) {
	if e.log == nil {
		return
	}
	now := time.Now()
	e.mu.Lock()
	if t, ok := e.logged[line]; ok && now.Sub(t) < time.Second {
		e.mu.Unlock()
		return
	}
	if len(e.logged) >= 4096 {
		clear(e.logged)
	}
	e.logged[line] = now
	e.mu.Unlock()
	fmt.Fprintf(e.log, "%s %s\n", now.UTC().Format(time.RFC3339), line)
}

// Deny counts a denied attempt and logs it: proto ("tcp", "udp", "icmp",
// "dns"), destination (address:port or name) and reason. The same attempt
// is logged at most once a second (a box retrying, or flooding, counts
// every time but fills no disk).
func (e *Engine) Deny(proto, dst, reason string) {
	e.denied.Add(1)
	if e.log == nil {
		return
	}
	key := proto + " " + dst + " denied: " + reason
	now := time.Now()
	e.mu.Lock()
	if t, ok := e.logged[key]; ok && now.Sub(t) < time.Second {
		e.mu.Unlock()
		return
	}
	if len(e.logged) >= 4096 {
		clear(e.logged)
	}
	e.logged[key] = now
	e.mu.Unlock()
	fmt.Fprintf(e.log, "%s %s\n", now.UTC().Format(time.RFC3339), key)
}

// maxFlows bounds a box's open TCP connections and UDP flows (with
// buffers of at most 1 MiB each way per connection).
const maxFlows = 1024

// New flows (connections, UDP flows, pings) a box may open per second,
// with bursts of up to flowBurst: the host dials for each, so a box must
// not turn it into a flood.
const (
	flowRate  = 500
	flowBurst = 1000
)

// admit reports why a new, allowed flow must still be refused ("" if it
// need not): the box has maxFlows open or opens them too fast.
func (e *Engine) admit() string {
	e.mu.Lock()
	n := len(e.flows)
	e.mu.Unlock()
	if n >= maxFlows {
		return "too many open connections"
	}
	if !e.rate.Allow() {
		return "too many new connections per second"
	}
	return ""
}

// flow is an open connection or UDP flow, closed when a policy change
// denies it.
type flow struct {
	proto string
	dst   netip.AddrPort
	close func()
	// gateway marks a connection to the gateway's own services (DNS over
	// TCP): it counts as a flow, but no policy closes it.
	gateway bool
}

// track registers an open flow; the returned func unregisters it.
func (e *Engine) track(f *flow) func() {
	e.conns.Add(1)
	e.mu.Lock()
	e.flows[f] = struct{}{}
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		delete(e.flows, f)
		e.mu.Unlock()
	}
}

// LogFile is an io.Writer appending to a file that it keeps under max
// bytes by moving its content to path.1 when full (one old generation
// kept). Both files are opened once, by OpenLog: rotating needs no access
// to their directory, so the helper keeps its log after it gives up its
// privileges (see HelperConfig.UID).
type LogFile struct {
	max int64

	mu     sync.Mutex
	f, old *os.File
	size   int64
}

// OpenLog opens (creating) the log file at path and its old generation
// path.1, kept under max bytes.
func OpenLog(path string, max int64) (*LogFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	old, err := os.OpenFile(path+".1", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		f.Close()
		return nil, err
	}
	st, _ := f.Stat()
	l := &LogFile{max: max, f: f, old: old}
	if st != nil {
		l.size = st.Size()
	}
	return l, nil
}

// Write appends p, rotating first when p would make the file too large.
func (l *LogFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size+int64(len(p)) > l.max && l.size > 0 {
		// The current content becomes the old generation (copied: the
		// descriptors stay), and the file starts again.
		l.old.Truncate(0)
		if _, err := l.f.Seek(0, io.SeekStart); err == nil {
			io.Copy(&offsetWriter{f: l.old}, io.LimitReader(l.f, l.max))
		}
		if err := l.f.Truncate(0); err != nil {
			return 0, err
		}
		l.size = 0
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

// offsetWriter writes to f from its start, with WriteAt (f's own offset
// is not used).
type offsetWriter struct {
	f   *os.File
	off int64
}

func (w *offsetWriter) Write(p []byte) (int, error) {
	n, err := w.f.WriteAt(p, w.off)
	w.off += int64(n)
	return n, err
}

// Close closes the files.
func (l *LogFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.old.Close()
	return l.f.Close()
}

func itoa(i int) string { return strconv.Itoa(i) }
