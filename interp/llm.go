package interp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// Message roles.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one chat message, in the OpenAI chat-completions shape.
type Message struct {
	// Role is RoleSystem, RoleUser, RoleAssistant or RoleTool.
	Role string
	// Content is the text ("" for an assistant message with only tool
	// calls).
	Content string
	// ToolCalls are the tools an assistant message asks to run.
	ToolCalls []ToolCall
	// ToolCallID is the ToolCall.ID a RoleTool message answers.
	ToolCallID string
}

// ToolCall is a model's request to run a tool.
type ToolCall struct {
	// ID is the model's id for this call; the tool's result must carry it.
	ID string
	// Name is the tool's name.
	Name string
	// Arguments is the JSON object of arguments, as the model wrote it.
	Arguments string
}

// Tool declares a function the model may call.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of the arguments object.
	Parameters map[string]any
}

// LLM is a chat model. Chat sends the conversation and the tools the
// model may call (none: plain completion) and returns the model's reply,
// an assistant message. *OpenAI implements it; tests use fakes.
type LLM interface {
	Chat(ctx context.Context, messages []Message, tools []Tool) (Message, error)
}

// ErrUnreachable: the model's endpoint could not be connected to
// (connection refused, no such host).
var ErrUnreachable = errors.New("model endpoint unreachable")

// unreachableError says which endpoint could not be reached, and why.
type unreachableError struct{ url, cause string }

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach OPENAI_BASE_URL=%s: is the server running? (%s)", e.url, e.cause)
}

// Is makes errors.Is(err, ErrUnreachable) true.
func (e *unreachableError) Is(target error) bool { return target == ErrUnreachable }

// Errors of NewOpenAI.
var (
	// ErrNoAPIKey: no API key was given and OPENAI_API_KEY is not set.
	ErrNoAPIKey = errors.New("OPENAI_API_KEY is not set: export OPENAI_API_KEY=<your key> (an endpoint that needs no key accepts any value), and OPENAI_BASE_URL=<url ending in /v1> for an endpoint other than OpenAI's")
	// ErrNoModel: no model was given.
	ErrNoModel = errors.New("no model given: pass --model or set AIRLOCK_MODEL to a model id your endpoint serves (e.g. gpt-4o-mini on OpenAI)")
)

// ModelError reports an endpoint that does not serve the requested model
// (HTTP 404, or HTTP 400 about the model, the seed's "Model does not
// exist").
type ModelError struct {
	Model      string
	BaseURL    string
	StatusCode int
	// Message is the endpoint's error message.
	Message string
}

// Error says which model the endpoint rejected and what to do.
func (e *ModelError) Error() string {
	return fmt.Sprintf("model %q is not served by %s (HTTP %d: %s): set --model or AIRLOCK_MODEL to a model id that endpoint serves",
		e.Model, e.BaseURL, e.StatusCode, e.Message)
}

// OpenAIConfig configures an OpenAI-compatible chat-completions client.
type OpenAIConfig struct {
	// APIKey is sent as the bearer token. Required.
	APIKey string
	// BaseURL is the API root, e.g. "http://127.0.0.1:11434/v1" (default
	// OpenAI's, https://api.openai.com/v1/).
	BaseURL string
	// Model is the model id. Required.
	Model string
	// HTTPClient replaces the default HTTP client.
	HTTPClient *http.Client
	// MaxRetries is how often a failed request (connection error, 408,
	// 409, 429, 5xx) is retried; negative means the SDK's default (2).
	MaxRetries int
}

// DefaultBaseURL is OpenAI's API root, used when no base URL is set.
const DefaultBaseURL = "https://api.openai.com/v1/"

// ConfigFromEnv returns a config from OPENAI_API_KEY, OPENAI_BASE_URL and
// AIRLOCK_MODEL; model, when not empty, wins over AIRLOCK_MODEL.
func ConfigFromEnv(model string) OpenAIConfig {
	if model == "" {
		model = os.Getenv("AIRLOCK_MODEL")
	}
	return OpenAIConfig{APIKey: os.Getenv("OPENAI_API_KEY"), BaseURL: os.Getenv("OPENAI_BASE_URL"), Model: model, MaxRetries: -1}
}

// OpenAI is an LLM reached through an OpenAI-compatible
// /chat/completions endpoint, with the official openai-go client.
type OpenAI struct {
	client  openai.Client
	model   string
	baseURL string
}

// NewOpenAI returns a client for cfg. Errors: ErrNoAPIKey, ErrNoModel.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if cfg.APIKey == "" {
		return nil, ErrNoAPIKey
	}
	if cfg.Model == "" {
		return nil, ErrNoModel
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	opts := []option.RequestOption{option.WithAPIKey(cfg.APIKey), option.WithBaseURL(cfg.BaseURL)}
	if cfg.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(cfg.HTTPClient))
	}
	if cfg.MaxRetries >= 0 {
		opts = append(opts, option.WithMaxRetries(cfg.MaxRetries))
	}
	return &OpenAI{client: openai.NewClient(opts...), model: cfg.Model, baseURL: cfg.BaseURL}, nil
}

// Model returns the model id.
func (o *OpenAI) Model() string { return o.model }

// Chat sends one chat-completions request. Errors: *ModelError when the
// endpoint does not serve the model; otherwise the SDK's error (HTTP
// status and the endpoint's message), or ctx's.
func (o *OpenAI) Chat(ctx context.Context, messages []Message, tools []Tool) (Message, error) {
	params := openai.ChatCompletionNewParams{Model: o.model}
	for _, m := range messages {
		params.Messages = append(params.Messages, toParam(m))
	}
	for _, t := range tools {
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name:        t.Name,
			Description: openai.String(t.Description),
			Parameters:  shared.FunctionParameters(t.Parameters),
		}))
	}
	resp, err := o.client.Chat.Completions.New(ctx, params)
	if err != nil {
		return Message{}, o.wrap(err)
	}
	if len(resp.Choices) == 0 {
		return Message{}, fmt.Errorf("%s: the reply has no choices", o.baseURL)
	}
	msg := resp.Choices[0].Message
	out := Message{Role: RoleAssistant, Content: msg.Content}
	if out.Content == "" && msg.Refusal != "" {
		out.Content = msg.Refusal
	}
	for _, tc := range msg.ToolCalls {
		if tc.Type != "" && tc.Type != "function" {
			continue
		}
		out.ToolCalls = append(out.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return out, nil
}

func (o *OpenAI) wrap(err error) error {
	var ae *openai.Error
	if !errors.As(err, &ae) {
		var oe *net.OpError
		var de *net.DNSError
		if errors.As(err, &oe) && oe.Op == "dial" {
			return &unreachableError{o.baseURL, oe.Err.Error()}
		}
		if errors.As(err, &de) {
			return &unreachableError{o.baseURL, "no such host " + de.Name}
		}
		return fmt.Errorf("%s: %w", o.baseURL, err)
	}
	msg := ae.Message
	if msg == "" {
		msg = strings.TrimSpace(ae.RawJSON())
	}
	if ae.StatusCode == http.StatusNotFound || (ae.StatusCode == http.StatusBadRequest && strings.Contains(strings.ToLower(msg+" "+ae.Code+" "+ae.Param), "model")) {
		return &ModelError{Model: o.model, BaseURL: o.baseURL, StatusCode: ae.StatusCode, Message: msg}
	}
	if msg != "" {
		return fmt.Errorf("%s: HTTP %d: %s", o.baseURL, ae.StatusCode, msg)
	}
	return fmt.Errorf("%s: %w", o.baseURL, err)
}

func toParam(m Message) openai.ChatCompletionMessageParamUnion {
	switch m.Role {
	case RoleSystem:
		return openai.SystemMessage(m.Content)
	case RoleTool:
		return openai.ToolMessage(m.Content, m.ToolCallID)
	case RoleAssistant:
		a := openai.ChatCompletionAssistantMessageParam{}
		if m.Content != "" || len(m.ToolCalls) == 0 {
			a.Content.OfString = openai.String(m.Content)
		}
		for _, tc := range m.ToolCalls {
			a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID:       tc.ID,
					Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: tc.Name, Arguments: tc.Arguments},
				},
			})
		}
		return openai.ChatCompletionMessageParamUnion{OfAssistant: &a}
	default:
		return openai.UserMessage(m.Content)
	}
}
