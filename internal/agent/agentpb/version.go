package agentpb

// Version is the agent protocol's version, which the guest agent announces
// in the handshake. The host refuses an agent of another version (a box
// booted by an older airlock): the box must be restarted. 0.2: calls are
// framed protobuf messages on yamux streams (0.1 was gRPC over yamux).
// 0.3: file calls (Stat, ReadDir, MkdirAll, Remove, ReadFile, WriteFile,
// CopyIn, CopyOut). 0.4: Freeze; Restored continues frozen processes.
const Version = "0.4.0"
