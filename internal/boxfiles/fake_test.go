package boxfiles

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/airlock-run/airlock/internal/agent/agentpb"
	"github.com/airlock-run/airlock/internal/agent/client"
)

// msg is one message a fake agent sends on a call: data, or a result
// (with the error the client would make of it).
type msg struct {
	data []byte
	res  *agentpb.FileResult
	err  error
}

func data(b []byte) msg                     { return msg{data: b} }
func result(infos ...*agentpb.FileInfo) msg { return msg{res: &agentpb.FileResult{Infos: infos}} }
func failed(err error) msg                  { return msg{res: &agentpb.FileResult{Error: err.Error()}, err: err} }

// fakeCall is a file call answered by a test: it sends what is put on
// down, keeps what the host uploads.
type fakeCall struct {
	down     chan msg
	mu       sync.Mutex
	up       bytes.Buffer
	eof      chan struct{} // closed by CloseWrite
	closed   chan struct{} // closed by Close
	eofOnce  sync.Once
	closeOne sync.Once
}

func newCall(msgs ...msg) *fakeCall {
	f := &fakeCall{down: make(chan msg, len(msgs)+1), eof: make(chan struct{}), closed: make(chan struct{})}
	for _, m := range msgs {
		f.down <- m
	}
	return f
}

func (f *fakeCall) Write(b []byte) (int, error) {
	select {
	case <-f.closed:
		return 0, errors.New("call closed")
	default:
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.up.Write(b)
}

func (f *fakeCall) uploaded() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return bytes.Clone(f.up.Bytes())
}

func (f *fakeCall) CloseWrite() error {
	f.eofOnce.Do(func() { close(f.eof) })
	return nil
}

func (f *fakeCall) Next() ([]byte, *agentpb.FileResult, error) {
	select {
	case m := <-f.down:
		return m.data, m.res, m.err
	case <-f.closed:
		return nil, nil, errors.New("call closed")
	}
}

func (f *fakeCall) Result() (*agentpb.FileResult, error) {
	d, r, err := f.Next()
	if err != nil {
		return r, err
	}
	if r == nil {
		return nil, fmt.Errorf("data where a result was expected (%d bytes)", len(d))
	}
	return r, nil
}

func (f *fakeCall) Close() error {
	f.closeOne.Do(func() { close(f.closed) })
	return nil
}

func (f *fakeCall) isClosed() bool {
	select {
	case <-f.closed:
		return true
	default:
		return false
	}
}

// fakeAgent answers each method with the call its handler makes.
type fakeAgent struct {
	mu    sync.Mutex
	calls map[string]func(req *client.FileRequest) *fakeCall
	reqs  map[string]*client.FileRequest
}

func (a *fakeAgent) File(ctx context.Context, method string, req *client.FileRequest) (Call, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.calls[method]
	if h == nil {
		return nil, fmt.Errorf("agent: unknown call %s", method)
	}
	if a.reqs == nil {
		a.reqs = map[string]*client.FileRequest{}
	}
	a.reqs[method] = req
	return h(req), nil
}

func (a *fakeAgent) req(method string) *client.FileRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reqs[method]
}

// on makes a box whose agent answers method with call.
func boxOn(calls map[string]func(req *client.FileRequest) *fakeCall) (*Box, *fakeAgent) {
	a := &fakeAgent{calls: calls}
	return &Box{ID: "b1", Agent: func(context.Context) (Agent, error) { return a, nil }}, a
}

// answer is a handler that always answers with one fresh call of msgs.
func answer(msgs ...msg) func(*client.FileRequest) *fakeCall {
	return func(*client.FileRequest) *fakeCall { return newCall(msgs...) }
}
