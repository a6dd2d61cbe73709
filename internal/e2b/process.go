package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-run/airlock"
	pb "github.com/airlock-run/airlock/internal/e2b/envdpb/process"
	"github.com/airlock-run/airlock/internal/e2b/envdpb/process/processconnect"
)

// Bounds of the process service.
const (
	// maxProcs bounds the processes one sandbox runs through envd at once.
	maxProcs = 256
	// subscriberStall is how long a process waits for a stream that does
	// not take its output before it drops that stream (the process goes
	// on; Connect attaches again).
	subscriberStall = 30 * time.Second
	// maxKeepalive bounds the keep-alive interval a client may ask.
	maxKeepalive = 10 * time.Minute
	// maxStreams bounds the streams (Start's and Connect's) that follow
	// one process at once.
	maxStreams = 16
	// firstPID is the first pid handed out: pids are airlock's numbers for
	// the processes started through envd, not the guest's.
	firstPID = 1000
)

// airlockRoot runs a setup exec as root in /.
func airlockRoot() airlock.ExecOptions {
	return airlock.ExecOptions{User: "root", WorkingDir: "/", Timeout: time.Minute}
}

// procTable is a sandbox's processes started through envd.
type procTable struct {
	mu      sync.Mutex
	next    uint32
	byPID   map[uint32]*proc
	stopped bool
}

func newProcTable() *procTable { return &procTable{next: firstPID, byPID: map[uint32]*proc{}} }

// proc is one process: its airlock process and the streams that follow it.
type proc struct {
	pid  uint32
	tag  string
	cfg  *pb.ProcessConfig
	p    *airlock.Process
	pty  bool
	done chan struct{}

	mu   sync.Mutex
	subs map[chan *pb.ProcessEvent]struct{}
	end  *pb.ProcessEvent_EndEvent
}

func (t *procTable) get(sel *pb.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p := t.byPID[s.Pid]; p != nil && p.p != nil {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range t.byPID {
			if p.tag == s.Tag && p.p != nil {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector: want a pid or a tag"))
}

func (t *procTable) killAll() {
	t.mu.Lock()
	t.stopped = true
	ps := make([]*proc, 0, len(t.byPID))
	for _, p := range t.byPID {
		if p.p != nil {
			ps = append(ps, p)
		}
	}
	t.mu.Unlock()
	for _, p := range ps {
		p.p.Kill()
	}
}

// subscribe adds a stream; it gets the events from now on (and the end,
// if the process has ended). nil: maxStreams follow the process already.
func (p *proc) subscribe() chan *pb.ProcessEvent {
	ch := make(chan *pb.ProcessEvent, 64)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		ch <- &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: p.end}}
		close(ch)
		return ch
	}
	if len(p.subs) >= maxStreams {
		return nil
	}
	p.subs[ch] = struct{}{}
	return ch
}

func (p *proc) unsubscribe(ch chan *pb.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.subs[ch]; ok {
		delete(p.subs, ch)
		close(ch)
	}
}

// publish hands ev to every stream, waiting at most subscriberStall for
// each (the process's output waits meanwhile: backpressure).
func (p *proc) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]chan *pb.ProcessEvent, 0, len(p.subs))
	for ch := range p.subs {
		subs = append(subs, ch)
	}
	p.mu.Unlock()
	for _, ch := range subs {
		t := time.NewTimer(subscriberStall)
		func() {
			defer func() { recover() }() // closed by unsubscribe meanwhile
			select {
			case ch <- ev:
			case <-t.C:
				p.unsubscribe(ch)
			}
		}()
		t.Stop()
	}
}

// output is an io.Writer of one of a process's streams.
type output struct {
	p    *proc
	kind int // 1 stdout, 2 stderr, 3 pty
}

func (o output) Write(b []byte) (int, error) {
	d := &pb.ProcessEvent_DataEvent{}
	c := slices.Clone(b)
	switch o.kind {
	case 1:
		d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: c}
	case 2:
		d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: c}
	default:
		d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: c}
	}
	o.p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}})
	return len(b), nil
}

// processService is envd's process.Process for one sandbox.
type processService struct {
	sb *sandbox
}

var _ processconnect.ProcessHandler = processService{}

// startWith runs req's process and registers it; hook is called with it
// before it runs.
func (s processService) startWith(ctx context.Context, user string, req *pb.StartRequest, hook func(*proc)) (*proc, error) {
	sb := s.sb
	cfg := req.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd: required"))
	}
	u, err := sb.user(ctx, user)
	if err != nil {
		return nil, connectErr(err)
	}
	opts := airlock.ExecOptions{User: strconv.Itoa(u.UID) + ":" + strconv.Itoa(u.GID), WorkingDir: u.resolve(cfg.GetCwd()),
		Env: []string{"HOME=" + u.Home, "USER=" + u.Name, "LOGNAME=" + u.Name}}
	keys := make([]string, 0, len(cfg.GetEnvs()))
	for k := range cfg.GetEnvs() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		opts.Env = append(opts.Env, k+"="+cfg.GetEnvs()[k])
	}
	pr := &proc{tag: req.GetTag(), cfg: cfg, done: make(chan struct{}), subs: map[chan *pb.ProcessEvent]struct{}{}}
	if pty := req.GetPty(); pty != nil {
		opts.TTY, pr.pty = true, true
		opts.Rows, opts.Cols = int(pty.GetSize().GetRows()), int(pty.GetSize().GetCols())
		opts.Stdout = output{pr, 3}
	} else {
		opts.Stdout, opts.Stderr = output{pr, 1}, output{pr, 2}
	}
	var release func()
	if acquire := sb.s.cfg.AcquireExec; acquire != nil {
		if release, err = acquire(ctx); err != nil {
			return nil, connectErr(err)
		}
	}
	t := sb.procs
	t.mu.Lock()
	if t.stopped || len(t.byPID) >= maxProcs {
		t.mu.Unlock()
		if release != nil {
			release()
		}
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the sandbox runs %d processes started through envd, the most it may: wait for one to end, or kill one", maxProcs))
	}
	pr.pid = t.next
	t.next++
	t.byPID[pr.pid] = pr
	t.mu.Unlock()
	hook(pr)
	// The process outlives the request that started it (a background
	// command's stream may end first); Kill and the sandbox's end stop it.
	p, err := sb.box.ExecStream(context.WithoutCancel(ctx), cfg.GetCmd(), cfg.GetArgs(), opts)
	if err != nil {
		t.mu.Lock()
		delete(t.byPID, pr.pid)
		t.mu.Unlock()
		if release != nil {
			release()
		}
		close(pr.done)
		return nil, connectErr(err)
	}
	t.mu.Lock()
	pr.p = p
	t.mu.Unlock()
	if !pr.pty && req.Stdin != nil && !req.GetStdin() {
		p.Stdin().Close()
	}
	t0 := time.Now()
	go func() {
		res, err := p.Wait()
		if release != nil {
			release()
		}
		rec := AuditRecord{Kind: "exec_stream", BoxID: sb.box.ID(), Cmd: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Duration: time.Since(t0)}
		if err != nil {
			rec.Error = err.Error()
		} else {
			code := res.ExitCode
			rec.ExitCode, rec.TimedOut, rec.Error = &code, res.TimedOut, res.ErrorMessage
		}
		sb.s.audit(rec)
		end := &pb.ProcessEvent_EndEvent{}
		switch {
		case err != nil:
			end.ExitCode, end.Status = -1, "error"
			msg := err.Error()
			end.Error = &msg
		default:
			end.ExitCode, end.Exited = int32(res.ExitCode), true
			end.Status = "exit status " + strconv.Itoa(res.ExitCode)
			if res.Signal != 0 {
				end.Exited = false
				end.Status = "signal: " + syscall.Signal(res.Signal).String()
			}
			if res.ErrorMessage != "" {
				msg := res.ErrorMessage
				end.Error = &msg
			}
		}
		pr.mu.Lock()
		pr.end = end
		subs := pr.subs
		pr.subs = map[chan *pb.ProcessEvent]struct{}{}
		pr.mu.Unlock()
		ev := &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}
		for ch := range subs {
			select {
			case ch <- ev:
			case <-time.After(subscriberStall):
			}
			close(ch)
		}
		t.mu.Lock()
		delete(t.byPID, pr.pid)
		t.mu.Unlock()
		close(pr.done)
	}()
	return pr, nil
}

// keepaliveOf is the interval the client asks for keep-alive events
// (Keepalive-Ping-Interval, seconds), 0 for none.
func keepaliveOf(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		return 0
	}
	return min(time.Duration(n)*time.Second, maxKeepalive)
}

// follow sends the events of ch to send until the process ends; when the
// request's deadline (the command's timeout) passes first, the process is
// killed, as envd does; when the client goes, the process goes on.
func follow(ctx context.Context, pr *proc, ch chan *pb.ProcessEvent, keepalive time.Duration, send func(*pb.ProcessEvent) error) error {
	defer pr.unsubscribe(ch)
	var tick <-chan time.Time
	if keepalive > 0 {
		t := time.NewTicker(keepalive)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				pr.mu.Lock()
				end := pr.end
				pr.mu.Unlock()
				if end == nil {
					return connect.NewError(connect.CodeUnavailable, errors.New("the stream fell behind the process's output and was dropped: connect to the process again"))
				}
				return nil
			}
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
		case <-tick:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				pr.p.Kill()
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command's timeout passed: it was killed"))
			}
			return ctx.Err()
		}
	}
}

func startEvent(pid uint32) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}
}

func (s processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	pr, ch, err := s.startSubscribed(ctx, userOfHeader(req.Header()), req.Msg)
	if err != nil {
		return err
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	if err := send(startEvent(pr.pid)); err != nil {
		pr.unsubscribe(ch)
		return err
	}
	return follow(ctx, pr, ch, keepaliveOf(req.Header()), send)
}

// startSubscribed starts a process with a stream subscribed before its
// first byte of output.
func (s processService) startSubscribed(ctx context.Context, user string, req *pb.StartRequest) (*proc, chan *pb.ProcessEvent, error) {
	// The subscription must exist before output flows: start registers
	// the proc, whose writers publish only to subscribers, so subscribe
	// through a hook run before ExecStream.
	ready := make(chan chan *pb.ProcessEvent, 1)
	pr, err := s.startWith(ctx, user, req, func(pr *proc) { ready <- pr.subscribe() })
	if err != nil {
		return nil, nil, err
	}
	return pr, <-ready, nil
}

func (s processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	pr, err := s.sb.procs.get(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	ch := pr.subscribe()
	if ch == nil {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%d streams follow process %d already, the most that may", maxStreams, pr.pid))
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	if err := send(startEvent(pr.pid)); err != nil {
		pr.unsubscribe(ch)
		return err
	}
	return follow(ctx, pr, ch, keepaliveOf(req.Header()), send)
}

func (s processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	t := s.sb.procs
	t.mu.Lock()
	defer t.mu.Unlock()
	out := &pb.ListResponse{}
	for _, p := range t.byPID {
		info := &pb.ProcessInfo{Config: p.cfg, Pid: p.pid}
		if p.tag != "" {
			tag := p.tag
			info.Tag = &tag
		}
		out.Processes = append(out.Processes, info)
	}
	slices.SortFunc(out.Processes, func(a, b *pb.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
	return connect.NewResponse(out), nil
}

func (s processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	pr, err := s.sb.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if !pr.pty {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no terminal (start it with a pty)"))
		}
		if err := pr.p.Resize(int(sz.GetRows()), int(sz.GetCols())); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// write sends input to a process's stdin (or terminal).
func write(pr *proc, in *pb.ProcessInput) error {
	var b []byte
	switch x := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		b = x.Stdin
	case *pb.ProcessInput_Pty:
		b = x.Pty
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input: want stdin or pty bytes"))
	}
	if _, err := pr.p.Stdin().Write(b); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("write to the process's input: %w (was it started with stdin, and is it still open?)", err))
	}
	return nil
}

func (s processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	pr, err := s.sb.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := write(pr, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (s processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var pr *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			p, err := s.sb.procs.get(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			pr = p
		case *pb.StreamInputRequest_Data:
			if pr == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event naming the process"))
			}
			if err := write(pr, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (s processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	pr, err := s.sb.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		err = pr.p.Kill()
	case pb.Signal_SIGNAL_SIGTERM:
		err = pr.p.Signal(syscall.SIGTERM)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: want SIGTERM or SIGKILL", req.Msg.GetSignal()))
	}
	if err != nil {
		select {
		case <-pr.p.Done():
			// It ended meanwhile (its end still being delivered): as
			// envd, a process that is gone is not found.
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d has ended", pr.pid))
		default:
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (s processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	pr, err := s.sb.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if pr.pty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("a terminal's input is not closed: send Ctrl-D (0x04) instead"))
	}
	if err := pr.p.Stdin().Close(); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

var emptyURL = &url.URL{}

// userOfHeader is userOf for a Connect request's headers.
func userOfHeader(h http.Header) string {
	return userOf(&http.Request{Header: h, URL: emptyURL})
}

// connectErr maps a library or policy error to a Connect error.
func connectErr(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	switch statusOf(err) {
	case http.StatusNotFound:
		return connect.NewError(connect.CodeNotFound, err)
	case http.StatusBadRequest:
		return connect.NewError(connect.CodeInvalidArgument, err)
	case http.StatusTooManyRequests:
		return connect.NewError(connect.CodeResourceExhausted, err)
	case http.StatusForbidden:
		return connect.NewError(connect.CodePermissionDenied, err)
	case http.StatusGatewayTimeout:
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}
