// Package agentpb holds the wire protocol between the host and the guest
// agent: agent.proto, the messages protoc generates from it, and the
// protocol version. The service's calls are framed on yamux streams by
// internal/transport (docs/agent-protocol.md), not by gRPC. Regenerate with
// `go generate ./internal/agent/agentpb` (needs protoc and protoc-gen-go);
// the generated file is committed so builds need neither.
package agentpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative agent.proto
