// Package interptest provides FakeOpenAI, a fake OpenAI-compatible
// chat-completions server on loopback for tests: it records and decodes
// every request and answers with replies a test scripts. No model is
// involved.
package interptest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Request is a decoded /chat/completions request.
type Request struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	Tools    []struct {
		Type     string `json:"type"`
		Function struct {
			Name        string         `json:"name"`
			Description string         `json:"description"`
			Parameters  map[string]any `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	// Authorization is the request's Authorization header.
	Authorization string `json:"-"`
}

// Message is a message of a Request.
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// Text returns the message's content as text (a string, or the text parts
// of an array joined).
func (m Message) Text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	json.Unmarshal(m.Content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// Reply is what the fake answers to one request.
type Reply struct {
	// Content is the assistant's text.
	Content string
	// ToolCalls are function calls to return (Type "function").
	ToolCalls []ToolCall
	// Status, when not 0 or 200, makes the fake answer with this HTTP
	// status and an OpenAI-style error body carrying ErrorMessage.
	Status       int
	ErrorMessage string
	// Delay is waited before answering (a model's think time).
	Delay time.Duration
}

// ToolCall is one function call of a Reply.
type ToolCall struct {
	ID, Name, Arguments string
}

// FakeOpenAI is the fake server. BaseURL (ending in /v1) is what a client
// takes as its base URL.
type FakeOpenAI struct {
	Server  *httptest.Server
	BaseURL string

	mu       sync.Mutex
	requests []Request
	handled  time.Duration
}

// NewFakeOpenAI starts a fake on 127.0.0.1; respond is called for request
// n (0-based) and says what to answer. The server is closed when the test
// ends. respond runs on the server's goroutine: report with t.Errorf, not
// t.Fatal.
func NewFakeOpenAI(t testing.TB, respond func(n int, req Request) Reply) *FakeOpenAI {
	f := &FakeOpenAI{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		defer func() {
			f.mu.Lock()
			f.handled += time.Since(t0)
			f.mu.Unlock()
		}()
		if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
			writeError(w, http.StatusNotFound, fmt.Sprintf("fake: no route %s %s", r.Method, r.URL.Path))
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req Request
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("fake OpenAI: bad request body: %v\n%s", err, body)
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		req.Authorization = r.Header.Get("Authorization")
		f.mu.Lock()
		n := len(f.requests)
		f.requests = append(f.requests, req)
		f.mu.Unlock()
		rep := respond(n, req)
		if rep.Delay > 0 {
			time.Sleep(rep.Delay)
		}
		if rep.Status != 0 && rep.Status != http.StatusOK {
			writeError(w, rep.Status, rep.ErrorMessage)
			return
		}
		msg := map[string]any{"role": "assistant", "content": rep.Content}
		finish := "stop"
		if len(rep.ToolCalls) > 0 {
			var calls []map[string]any
			for _, tc := range rep.ToolCalls {
				calls = append(calls, map[string]any{"id": tc.ID, "type": "function",
					"function": map[string]any{"name": tc.Name, "arguments": tc.Arguments}})
			}
			msg["tool_calls"] = calls
			finish = "tool_calls"
			if rep.Content == "" {
				msg["content"] = nil
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"id": fmt.Sprintf("chatcmpl-fake-%d", n), "object": "chat.completion", "created": time.Now().Unix(), "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
			"usage":   map[string]any{"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
		})
	}))
	f.BaseURL = f.Server.URL + "/v1"
	t.Cleanup(f.Server.Close)
	return f
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	code := "invalid_request_error"
	if status == http.StatusNotFound {
		code = "model_not_found"
	}
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": code}})
}

// Requests returns the requests received so far.
func (f *FakeOpenAI) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.requests...)
}

// HandlerTime is the total time spent answering requests, Delay included
// (the "model's reply time" as seen by the server).
func (f *FakeOpenAI) HandlerTime() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.handled
}
