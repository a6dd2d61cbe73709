// Package agentpb holds the wire protocol between the host and the guest
// agent: agent.proto and the code protoc generates from it. Regenerate with
// `go generate ./internal/agent/agentpb` (needs protoc, protoc-gen-go and
// protoc-gen-go-grpc); the generated files are committed so builds need none.
package agentpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative agent.proto
